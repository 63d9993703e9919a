"""Multi-turn sessions: TTFT with session KV reuse vs re-encoding the conversation as text, restore latency, budgets.

Everything goes through the public API on the default model (SmolLM2-135M-Instruct): ``AgentMemory(path)``,
``mem.session(...).send(...)``, ``mem.sessions.offload/restore/invalidate/stats``.

* Users: LoCoMo conversations (``--data``; synthetic text without the file). Each conversation's first LoCoMo
  session is stored as long-term memories of its user; benchmark sessions replay the user's messages of later
  LoCoMo sessions, round-robin over sessions (turn 1 of every session, then turn 2, ...), so with small tier
  budgets a returning session is usually restored from warm or from disk inside its own ``send``.
* Every turn, before the real ``send`` (``k`` memories mounted, reply generated, turn stored), two dry runs
  (``commit=False, max_new_tokens=1``) answer the same message on the same history: ``mode="history-text"``
  mounts the same memories' KV but re-encodes the history (a turn without session reuse), and ``mode="text"``
  re-encodes preamble + memories + history + message from scratch. All TTFTs run from the start of ``send``
  (scan, restore, retrieval, load, mount, prefill) to the first new token. First-token agreement with the
  text baseline is a fidelity check (how memories and history are combined is the only approximation).
* Then per session: offload to warm -> restore, offload to disk -> restore, and the cost of re-encoding the
  session (invalidate, then one dry run that rebuilds it: ``timings["rebuild"]``).
* Budgets: tier peak bytes against ``--hot-mb`` / ``--warm-mb``, and the process's peak RSS.

    python benchmarks/session_turns.py --sessions 20 --turns 10

Last line: {"turns": {"10": {"reuse_ttft_s": ..., "text_ttft_s": ..., "speedup": ...}}, "restore": {...}, ...}
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agentmem import AgentMemory  # noqa: E402

DEFAULT_DATA = Path(__file__).resolve().parent.parent.parent / "shared/data/locomo/locomo_dev5.json"
MB = 2**20


def load_users(data: Path | None, sessions: int, turns: int, memories: int) -> tuple[dict, list[dict]]:
    """``({user: [memory lines]}, [{"id", "user", "messages"}])`` from LoCoMo, or synthetic."""
    convs = json.loads(data.read_text()) if data is not None and data.exists() else []
    users: dict[str, list[str]] = {}
    plan: list[dict] = []
    if convs:
        for i in range(sessions):
            conv = convs[i % len(convs)]
            user = f"user-{conv['conversation_id']}"
            first = conv["sessions"][0]
            users.setdefault(user, [f"[{first['date_time']}] {t['speaker']}: {t['text']}"
                                    for t in first["turns"][:memories]])
            speaker = conv["speaker_a"]
            pool = [t["text"] for s in conv["sessions"][1 + i // len(convs):] for t in s["turns"]
                    if t["speaker"] == speaker and len(t["text"]) > 20]
            messages = [pool[j % len(pool)] for j in range(turns)]
            plan.append({"id": f"bench-{i}", "user": user, "messages": messages})
        return users, plan
    topics = ["my sister Ines", "my job at the hospital", "our trip to Porto", "the garden", "my dog Rex"]
    for i in range(sessions):
        user = f"user-{i % 5}"
        users.setdefault(user, [f"The user talked about {topics[(i + j) % 5]} on day {j}." for j in range(memories)])
        plan.append({"id": f"bench-{i}", "user": user,
                     "messages": [f"Tell me something new about {topics[(i + j) % 5]}, turn {j}." for j in range(turns)]})
    return users, plan


def med(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=4, help="conversations (the issue's target run is 20)")
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--k", type=int, default=4, help="memories mounted per turn")
    ap.add_argument("--max-new-tokens", type=int, default=24, help="reply length of the committed turns")
    ap.add_argument("--memories", type=int, default=20, help="long-term memories stored per user up front")
    ap.add_argument("--hot-mb", type=float, default=64.0)
    ap.add_argument("--warm-mb", type=float, default=32.0)
    ap.add_argument("--max-tokens", type=int, default=1536, help="session_max_tokens")
    ap.add_argument("--history-kv", choices=["clean", "as_generated"], default="clean")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (1 is fastest on a shared CPU)")
    ap.add_argument("--encryption-key", default=None, help="encrypt the store, cold session files included")
    ap.add_argument("--no-remember", action="store_true", help="do not store turns as long-term memories")
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--store", type=Path, default=None, help="store directory (default: a temp dir)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    store = args.store or Path(tempfile.mkdtemp(prefix="agentmem-sessions-"))
    users, plan = load_users(args.data, args.sessions, args.turns, args.memories)
    mem = AgentMemory(
        store, encryption_key=args.encryption_key, session_hot_bytes=int(args.hot_mb * MB),
        session_warm_bytes=int(args.warm_mb * MB), session_idle_seconds=24 * 3600.0,
        session_max_tokens=args.max_tokens,
    )
    sessions = mem.sessions
    sessions.history_kv = args.history_kv
    t = time.perf_counter()
    ctx = sessions.context()  # loads SmolLM2
    print(f"model loaded in {time.perf_counter() - t:.1f}s; {ctx.bytes_per_token / 1024:.1f} KiB of KV per token",
          file=sys.stderr)
    for user, lines in tqdm(users.items(), desc="storing long-term memories", unit="user"):
        mem.remember_many([{"text": line, "user_id": user, "session_id": "history", "kind": "turn"} for line in lines])

    chats = {p["id"]: mem.session(p["id"], user_id=p["user"]) for p in plan}
    rows: list[dict] = []
    with tqdm(total=args.turns * len(plan), desc="turns", unit="turn") as bar:
        for turn in range(args.turns):
            for p in plan:
                chat, message = chats[p["id"]], p["messages"][turn]
                text = chat.send(message, k=args.k, max_new_tokens=1, mode="text", commit=False)
                hist = chat.send(message, k=args.k, max_new_tokens=1, mode="history-text", commit=False)
                reuse = chat.send(message, k=args.k, max_new_tokens=args.max_new_tokens, remember=not args.no_remember)
                rows.append({
                    "turn": turn + 1, "session": p["id"], "reuse_ttft": reuse.timings["ttft"],
                    "text_ttft": text.timings["ttft"], "hist_ttft": hist.timings["ttft"],
                    "restore": reuse.timings["restore"], "make_room": reuse.timings["make_room"],
                    "load": reuse.timings["load"] + reuse.timings["encode"],
                    "mount": reuse.timings["mount"], "prefill": reuse.timings["prefill"],
                    "append": reuse.timings["append"], "decode": reuse.timings["decode"],
                    "reply_tokens": len(reuse.token_ids),
                    "retrieve": reuse.timings["retrieve"], "restored_from": reuse.restored_from,
                    "prompt_tokens": text.prompt_tokens, "reuse_prefill_tokens": reuse.prefilled_tokens,
                    "text_prefill_tokens": text.prefilled_tokens, "reused_tokens": reuse.reused_tokens,
                    "mounted": len(reuse.mounted), "first_token_agrees": reuse.token_ids[:1] == text.token_ids[:1],
                    "hist_first_token_agrees": hist.token_ids[:1] == text.token_ids[:1],
                    "evicted": reuse.evicted_turns, "rebuilt": reuse.rebuilt,
                })
                bar.update()

    # restore latency from warm and from disk, against re-encoding the same session
    restore_rows = []
    for p in tqdm(plan, desc="restores", unit="session"):
        sid = p["id"]
        sessions.offload(sid, to="warm")
        warm = sessions.restore(sid)
        sessions.offload(sid, to="disk")
        cold = sessions.restore(sid)
        restore_rows.append({"session": sid, "warm_s": warm["seconds"], "cold_s": cold["seconds"],
                             "warm_from": warm["from"], "cold_from": cold["from"], "tokens": chats[sid].tokens})
    sessions.invalidate("benchmark: measure re-encoding")
    for p, row in zip(tqdm(plan, desc="re-encodes", unit="session"), restore_rows):
        r = chats[p["id"]].send(p["messages"][0], k=0, max_new_tokens=1, commit=False)
        row["reencode_s"] = r.timings["rebuild"]
    stats = sessions.stats()
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    # -- report ---------------------------------------------------------------------------------------
    per_turn = {}
    print(f"\n{'turn':>4} {'prompt':>7} {'reuse ttft':>11} {'hist-text':>10} {'x':>6} {'text ttft':>10} {'x':>6} "
          f"{'restore':>8} {'room':>7} {'1st tok =':>9}  restored from", file=sys.stderr)
    for turn in range(1, args.turns + 1):
        rs = [r for r in rows if r["turn"] == turn]
        reuse_t, text_t = med([r["reuse_ttft"] for r in rs]), med([r["text_ttft"] for r in rs])
        hist_t = med([r["hist_ttft"] for r in rs])
        agree = sum(r["first_token_agrees"] for r in rs) / len(rs)
        sources = {k: sum(r["restored_from"] == k for r in rs) for k in ("warm", "cold")}
        per_turn[str(turn)] = {
            "prompt_tokens": med([r["prompt_tokens"] for r in rs]), "reuse_ttft_s": reuse_t, "text_ttft_s": text_t,
            "speedup": text_t / reuse_t, "history_text_ttft_s": hist_t, "speedup_vs_history_text": hist_t / reuse_t,
            "breakdown_s": {k: med([r[k] for r in rs])
                            for k in ("retrieve", "make_room", "restore", "load", "mount", "prefill")},
            "history_text_first_token_agreement": sum(r["hist_first_token_agrees"] for r in rs) / len(rs),
            "after_reply_s": {"decode": med([r["decode"] for r in rs]), "append": med([r["append"] for r in rs]),
                              "reply_tokens": med([r["reply_tokens"] for r in rs])}, "reuse_prefill_tokens": med([r["reuse_prefill_tokens"] for r in rs]),
            "restore_s": med([r["restore"] for r in rs]), "retrieve_s": med([r["retrieve"] for r in rs]),
            "first_token_agreement": agree, "restored_from": sources,
        }
        print(f"{turn:>4} {per_turn[str(turn)]['prompt_tokens']:>7.0f} {reuse_t:>10.3f}s {hist_t:>9.3f}s "
              f"{hist_t / reuse_t:>5.1f}x {text_t:>9.3f}s {text_t / reuse_t:>5.1f}x "
              f"{per_turn[str(turn)]['restore_s']:>7.3f}s {per_turn[str(turn)]['breakdown_s']['make_room']:>6.3f}s "
              f"{agree:>9.0%}  {sources}",
              file=sys.stderr)
    ratios = [r["cold_s"] / r["reencode_s"] for r in restore_rows if r["reencode_s"] > 0]
    restore = {
        "warm_s": med([r["warm_s"] for r in restore_rows]), "cold_s": med([r["cold_s"] for r in restore_rows]),
        "reencode_s": med([r["reencode_s"] for r in restore_rows]), "session_tokens": med([r["tokens"] for r in restore_rows]),
        "cold_over_reencode": med(ratios), "cold_over_reencode_max": max(ratios) if ratios else None,
    }
    print(f"\nrestore (median over sessions of {restore['session_tokens']:.0f} tokens): warm {restore['warm_s']:.3f}s, "
          f"disk {restore['cold_s']:.3f}s, re-encode {restore['reencode_s']:.3f}s -> disk = "
          f"{100 * restore['cold_over_reencode']:.1f}% of re-encoding (worst {100 * restore['cold_over_reencode_max']:.1f}%)",
          file=sys.stderr)
    budgets = {
        tier: {"budget_mb": stats[tier]["budget_bytes"] / MB, "peak_mb": stats[tier]["peak_bytes"] / MB,
               "over_budget": stats[tier]["over_budget"], "hits": stats[tier]["hits"], "misses": stats[tier]["misses"],
               "offloads": stats[tier]["offloads"], "restores": stats[tier]["restores"]}
        for tier in ("hot", "warm")
    }
    budgets["cold"] = {"peak_mb": stats["cold"]["peak_bytes"] / MB, "restores": stats["cold"]["restores"],
                       "hits": stats["cold"]["hits"]}
    print(f"budgets: hot peak {budgets['hot']['peak_mb']:.1f}/{budgets['hot']['budget_mb']:.0f} MB, warm peak "
          f"{budgets['warm']['peak_mb']:.1f}/{budgets['warm']['budget_mb']:.0f} MB, cold peak "
          f"{budgets['cold']['peak_mb']:.1f} MB; workspace {stats['workspace_bytes'] / MB:.1f} MB; "
          f"process peak RSS {peak_rss / MB:.0f} MB", file=sys.stderr)
    last = str(args.turns)
    out = {
        "config": {"sessions": args.sessions, "turns": args.turns, "k": args.k, "max_new_tokens": args.max_new_tokens,
                   "hot_mb": args.hot_mb, "warm_mb": args.warm_mb, "history_kv": args.history_kv,
                   "threads": torch.get_num_threads(), "encrypted": args.encryption_key is not None,
                   "data": "locomo" if args.data and args.data.exists() else "synthetic"},
        "turns": per_turn,
        "restore": restore,
        "budgets": budgets,
        "workspace_mb": stats["workspace_bytes"] / MB,
        "peak_rss_mb": peak_rss / MB,
        "first_token_agreement": sum(r["first_token_agrees"] for r in rows) / len(rows),
        "evicted_turns": stats["evicted_turns"],
        "write_behind": {"clean_copies": stats["clean_copies"], "clean_demotions": stats["clean_demotions"]},
        "goals": {
            "ttft_speedup_at_last_turn": per_turn[last]["speedup"],
            "ttft_speedup_vs_history_text_at_last_turn": per_turn[last]["speedup_vs_history_text"],
            "ttft_8x": per_turn[last]["speedup"] >= 8,
            "restore_disk_le_20pct": (restore["cold_over_reencode_max"] or 1) <= 0.20,
            "budgets_never_exceeded": all(budgets[t]["over_budget"] == 0 and budgets[t]["peak_mb"] <= budgets[t]["budget_mb"]
                                          for t in ("hot", "warm")),
        },
    }
    sessions.close()
    mem.close()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
