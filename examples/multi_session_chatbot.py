"""A chatbot with long-term memory: two users, several sessions each, across restarts.

Built on LangGraph: ``recall -> agent -> remember`` over ``MessagesState``, agentmem's local model
(``ChatAgentMem``, embedded SmolLM2-135M-Instruct by default) answering with memories mounted as KV, and
LangGraph's SQLite checkpointer keeping each thread. Each LangGraph thread is one agentmem session.

``--script`` plays a scripted conversation in three acts, closing and re-opening the memory (and the
checkpointer) from the same directory between them, as a restarted process would:

1. Alice and Bob each tell the bot a few facts, in their own sessions.
2. (restart) In new sessions, each asks about their facts: memories from the earlier session are mounted;
   Bob asks about Alice's facts and gets none of her memories.
3. (restart) Alice resumes her first session: its working KV comes back from disk instead of being re-encoded.

Every turn prints the memories mounted, the time to first token, the same turn's time with the memories
and history re-encoded as text (a dry run), and the history tokens reused. The script exits with status 1
if a fact was not recalled in a later session or a memory crossed users.

    python examples/multi_session_chatbot.py --script              # the README's demo (make demo)
    python examples/multi_session_chatbot.py --data ./demo-data     # chat yourself: /user bob, /session s2, /quit
    python examples/multi_session_chatbot.py --script --model tiny  # random tiny model, seconds (used by tests)
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach a model hub: everything needed is installed
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")

from agentmem import AgentMemory, NotFoundError  # noqa: E402
from agentmem_langgraph import ChatAgentMem, MemoryNode  # noqa: E402
from langgraph.checkpoint.sqlite import SqliteSaver  # noqa: E402
from langgraph.graph import END, START, MessagesState, StateGraph  # noqa: E402

# (act, user, session, message, memory that must be mounted for this turn: text of an earlier turn, or None)
SCRIPT: list[tuple[int, str, str, str, str | None]] = [
    (1, "alice", "alice-monday", "Hi! I'm Alice. My dog is called Rex.", None),
    (1, "alice", "alice-monday", "I work as a nurse at the Lyon hospital.", None),
    (1, "bob", "bob-monday", "Hello, I'm Bob. I play the cello in an orchestra.", None),
    (2, "alice", "alice-tuesday", "What is the name of my dog?", "Hi! I'm Alice. My dog is called Rex."),
    (2, "bob", "bob-tuesday", "Which instrument do I play?", "Hello, I'm Bob. I play the cello in an orchestra."),
    (2, "bob", "bob-tuesday", "What is the name of my dog?", None),
    (3, "alice", "alice-monday", "Where do I work?", None),
]


@dataclass
class Bot:
    """One open memory + checkpointer + compiled graph; closed and rebuilt to simulate a restart."""

    data: Path
    model: Any
    k: int
    max_new_tokens: int
    baseline: bool
    overrides: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.mem = AgentMemory(self.data / "memory", model=self.model, **self.overrides)
        self.conn = sqlite3.connect(str(self.data / "checkpoints.sqlite"), check_same_thread=False)
        self.llm = ChatAgentMem(memory=self.mem, k=self.k, max_new_tokens=self.max_new_tokens,
                                measure_baseline=self.baseline)
        memory = MemoryNode(self.mem, model=self.llm, k=self.k)
        builder = StateGraph(MessagesState)
        builder.add_node("recall", memory.recall)
        builder.add_node("agent", lambda state: {"messages": [self.llm.invoke(state["messages"])]})
        builder.add_node("remember", memory.remember)
        builder.add_edge(START, "recall")
        builder.add_edge("recall", "agent")
        builder.add_edge("agent", "remember")
        builder.add_edge("remember", END)
        self.graph = builder.compile(checkpointer=SqliteSaver(self.conn))
        t = time.perf_counter()
        # Load the local LLM and compile the mount path now (agentmem does both lazily), so the first turn times the
        # turn, not the load: warmup() has no side effect on the store.
        self.mem.warmup()
        self.load_s = time.perf_counter() - t

    def say(self, user: str, session: str, text: str) -> dict[str, Any]:
        config = {"configurable": {"user_id": user, "thread_id": session}}
        state = self.graph.invoke({"messages": [("user", text)]}, config)
        answer = state["messages"][-1]
        return {"text": str(answer.content).strip(), **answer.response_metadata["agentmem"]}

    def close(self) -> None:
        self.mem.close()
        self.conn.close()


def load_model(name: str) -> tuple[Any, dict[str, Any]]:
    """``default`` = embedded SmolLM2 (None), ``tiny`` = random 2-layer Llama for tests, else a local HF dir."""
    if name == "default":
        return None, {}
    if name == "tiny":
        from agentmem.kv.testing import tiny_causal_lm

        # 512 positions and one token per byte: keep sessions and mounts small enough to fit
        return tiny_causal_lm("llama", seed=0), {"session_max_tokens": 160, "mount_budget_tokens": 160}
    return name, {}


def describe(bot: Bot, ids: list[str]) -> list[tuple[str, str, str]]:
    """(owner, text, printable line) of each mounted entry."""
    out = []
    for entry_id in ids:
        try:
            rec = bot.mem.get(entry_id)
            out.append((rec.user_id, rec.text, f"{rec.memory_text}  (session {rec.session_id})"))
        except NotFoundError:
            out.append(("?", "", entry_id))
    return out


def _one_line(text: str) -> str:
    return " ".join(text.split())


def show_turn(user: str, session: str, text: str, r: dict[str, Any], mounted: list[tuple[str, str, str]]) -> None:
    print(f"\n[{user} | {session}] {user}: {text}")
    print(f"  bot: {_one_line(r['text']) or '(empty)'}")
    if mounted:
        print(f"  mounted {len(mounted)} memories as {r['mode'].upper()}:")
        for _, _, line in mounted:
            print(f"    - {_one_line(line)}")
    else:
        print("  mounted no memories")
    ttft = r["timings"].get("ttft", 0.0)
    line = f"  time to first token {ttft:.2f} s"
    if r.get("baseline_ttft") is not None:
        base = r["baseline_ttft"]
        line += f" (memories + history re-encoded as text: {base:.2f} s, saved {base - ttft:+.2f} s)"
    if r.get("reused_tokens"):
        line += f"; {r['reused_tokens']} history tokens reused"
    print(line)


def run_script(args: argparse.Namespace) -> int:
    data = Path(args.data) if args.data else Path(tempfile.mkdtemp(prefix="agentmem-demo-"))
    model, overrides = load_model(args.model)
    print(f"agentmem multi-session chatbot demo (data in {data})")
    failures: list[str] = []
    saved = base_total = 0.0
    t_start = time.perf_counter()
    bot: Bot | None = None
    act = 0
    try:
        for turn_act, user, session, text, must_mount in SCRIPT:
            if turn_act != act:
                if bot is not None:
                    bot.close()  # a restart: everything below is re-opened from disk
                    print(f"\n--- restart: memory and checkpoints re-opened from {data} ---")
                act = turn_act
                print(f"\n=== act {act} ===")
                bot = Bot(data, model, args.k, args.max_new_tokens, not args.no_baseline, overrides)
                print(f"(memory opened, local model loaded in {bot.load_s:.1f} s)")
            assert bot is not None
            r = bot.say(user, session, text)
            mounted = describe(bot, r["mounted"])
            show_turn(user, session, text, r, mounted)
            if r.get("baseline_ttft") is not None:
                saved += r["baseline_ttft"] - r["timings"].get("ttft", 0.0)
                base_total += r["baseline_ttft"]
            foreign = [line for owner, _, line in mounted if owner != user]
            if foreign:
                failures.append(f"{user} was shown another user's memories: {foreign}")
            if must_mount and must_mount not in [t for _, t, _ in mounted]:
                failures.append(f"{user} in {session}: the earlier fact {must_mount!r} was not mounted")
            if act == 3 and not r.get("reused_tokens"):
                print("  (note: the resumed session's working KV was re-encoded, not restored from disk)")
    finally:
        if bot is not None:
            bot.close()
        if not args.data:
            shutil.rmtree(data, ignore_errors=True)
    print(f"\nfinished in {time.perf_counter() - t_start:.1f} s", end="")
    if base_total:
        print(f"; time to first token saved by mounting KV: {saved:.2f} s of {base_total:.2f} s "
              f"({100 * saved / base_total:.0f}%)")
    else:
        print()
    if failures:
        print("\nFAILED:\n  " + "\n  ".join(failures))
        return 1
    print("OK: facts from earlier sessions were mounted in later ones, and never across users.")
    return 0


def run_interactive(args: argparse.Namespace) -> int:
    data = Path(args.data or "demo-data")
    data.mkdir(parents=True, exist_ok=True)
    model, overrides = load_model(args.model)
    bot = Bot(data, model, args.k, args.max_new_tokens, not args.no_baseline, overrides)
    user, session = "alice", "s1"
    print(f"memory in {data}. Commands: /user NAME, /session NAME, /quit")
    try:
        while True:
            try:
                text = input(f"[{user} | {session}] you: ").strip()
            except EOFError:
                break
            if not text:
                continue
            if text == "/quit":
                break
            if text.startswith("/user "):
                user = text.split(maxsplit=1)[1]
                continue
            if text.startswith("/session "):
                session = text.split(maxsplit=1)[1]
                continue
            r = bot.say(user, session, text)
            show_turn(user, session, text, r, describe(bot, r["mounted"]))
    finally:
        bot.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--script", action="store_true", help="play the scripted conversation and exit")
    parser.add_argument("--data", help="memory directory (default: a temporary one for --script, ./demo-data)")
    parser.add_argument("--model", default="default", help="'default' (SmolLM2), 'tiny' (tests) or a model dir")
    parser.add_argument("--k", type=int, default=3, help="memories mounted per turn")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--no-baseline", action="store_true", help="skip the text-mode timing dry run")
    args = parser.parse_args(argv)
    return run_script(args) if args.script else run_interactive(args)


if __name__ == "__main__":
    sys.exit(main())
