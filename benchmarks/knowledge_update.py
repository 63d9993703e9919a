"""Knowledge updates: does recall answer with the current value after a fact changed? Per consolidation mode.

Scenarios come from ``benchmarks/ku_scenarios.py`` (older statements, some repeated, unrelated memories and other
facts between, then a newer statement; a question about the current value). Each scenario is one user of a shared
store. Reported per mode ("off", "local", and "llm" with the local model on a smaller subset):

* ``top1_new``: share of scenarios whose ``recall(k=1)`` states the new value;
* ``stale_top3``: share whose top 3 still hold a statement of the old value;
* ``others_hidden``: share of the scenario's *other* facts wrongly superseded (they must stay recallable);
* ``lookalike_hidden``: share of look-alike statements (same attribute, not an update: "My parents live in Madrid")
  wrongly superseded.

Distinct facts (``distinct``, per mode): pairs that differ in one value (a dose, a PIN, a weekday, a name, a
date, ...) must both stay reachable (``lost`` = 0, ``merged`` = 0) and the newer must answer its question first
(``newer_first``); restatements that differ only in case, spacing or punctuation must merge
(``restatements_merged``).

Then what mounting assistant turns costs (``roles``), what asking about the fact costs (``asked``: the question
is remembered as the user's turn, as the chat endpoint does, then asked again), natural updates told as people tell
them and held-out look-alikes, each pair a new user's store (``--natural [FILLERS ...]``, ``ku_natural.py``: with
0 and 4 unrelated memories besides, ``natural.fillers_N``), LoCoMo recall@5/@10 with consolidation "local" vs "off"
(``--locomo``; on the "local" store also with each of recall's consolidation steps switched off through
``MemoryConfig``: ``without_recall_demotion``, ``without_version_following``; ``--ablate`` does the same for the
scenarios), and ``remember()`` p95 latency with vs without consolidation, measured side by side (alternating).

    python benchmarks/knowledge_update.py --half test --n 200 --locomo ../shared/data/locomo/locomo_dev5.json

Last line: {"test": {"off": {...}, "local": {...}, "llm": {...}}, "distinct": {"off": {...}, "local": {...}},
"roles": {...}, "asked": {...}, "natural": {"fillers_0": {...}, "fillers_4": {...}}, "locomo": {...},
"remember_p95_ms": {...}}
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ku_natural import NaturalCase, added_cases, alike_cases, kept_cases, natural_cases, others_cases  # noqa: E402
from ku_scenarios import Scenario, distinct_pairs, restatements, scenarios  # noqa: E402

from agentmem import AgentMemory  # noqa: E402


def run_scenarios(mem: AgentMemory, items: list[Scenario], tag: str) -> dict[str, float]:
    """Remember each scenario's stream as its own user, then ask its question."""
    top1 = stale = hidden = others = alike_hidden = alike = 0
    for n, s in enumerate(items):
        user = f"{tag}-{n}"
        for text in s.memories:
            mem.remember(text, user_id=user, role="user")
        mem.wait_consolidation(timeout=600)
        hits = mem.recall(s.question, user_id=user, k=3)
        texts = [h.text.lower() for h in hits]
        top1 += bool(texts) and s.new_value.lower() in texts[0]
        stale += any(s.old_value.lower() in t and s.new_value.lower() not in t for t in texts)
        active = {r.text for r in mem.list(user_id=user) if r.status == "active"}
        for fact, _value in s.other_facts:
            others += 1
            hidden += fact not in active
        alike += len(s.alike)
        alike_hidden += sum(t not in active for t in s.alike)
    count = len(items)
    return {"scenarios": count, "top1_new": round(top1 / count, 3), "stale_top3": round(stale / count, 3),
            "others_hidden": round(hidden / max(1, others), 3), "lookalike_hidden": round(alike_hidden / max(1, alike), 3)}


def distinct_facts(mem: AgentMemory, n: int, tag: str) -> dict[str, float]:
    """Pairs differing in one value must both stay reachable (``lost`` = 0) and the newer must answer its question
    first (``newer_first``); restatements differing only in case, spacing or punctuation must merge (NOOP)."""
    lost = merged = updates = asked = newer_first = 0
    for i, pair in enumerate(distinct_pairs(n, seed=1)):
        user = f"{tag}-distinct-{i}"
        for text in pair.before:
            mem.remember(text, user_id=user, role="user")
        mem.remember(pair.older, user_id=user, role="user")
        rec = mem.remember(pair.newer, user_id=user, role="user")
        mem.wait_consolidation(timeout=600)
        texts = {r.text for r in mem.list(user_id=user)}
        lost += pair.older not in texts or pair.newer not in texts
        merged += rec.event == "NOOP"
        updates += rec.event == "UPDATE"
        if pair.question:
            asked += 1
            top = mem.recall(pair.question, user_id=user, k=1)
            newer_first += bool(top) and top[0].text == pair.newer
    same = restatements(n // 2, seed=1)
    restated = 0
    for i, (text, again) in enumerate(same):
        user = f"{tag}-restated-{i}"
        first = mem.remember(text, user_id=user, role="user")
        rec = mem.remember(again, user_id=user, role="user")
        mem.wait_consolidation(timeout=600)
        restated += rec.event == "NOOP" and rec.matched_id == first.id and len(mem.list(user_id=user)) == 1
    return {"pairs": n, "lost": lost, "merged": merged, "updates": updates,
            "newer_first": round(newer_first / max(1, asked), 3),
            "restatements": len(same), "restatements_merged": round(restated / max(1, len(same)), 3)}


def roles_effect(mem: AgentMemory, items: list[Scenario]) -> dict[str, float]:
    """What mounting assistant turns costs: each old statement gets an assistant reply restating it (and one stale
    restatement after the update, as a model that had not caught up would). Share of scenarios whose top 3 hold a
    stale statement in plain ``recall`` (assistant turns included) vs in ``recall_for_mount``, what generate and
    sessions mount (``unmounted_roles=("assistant",)`` by default, and hits below ``mount_min_score`` left out);
    and, before the stale restatement is said, whose plain ``recall(k=1)`` is an assistant's echo of the old value
    (``top1_assistant_echo_of_old``)."""
    with_assistant = without = echo_first = 0
    for n, s in enumerate(items):
        user = f"roles-{n}"
        for text in s.memories:
            mem.remember(text, user_id=user, role="user")
            if text in s.old_texts:
                mem.remember(f"Noted. {text}", user_id=user, role="assistant")
        # before the stale restatement below: does plain recall put the user's update before the assistant's
        # echoes of the old value?
        top = mem.recall(s.question, user_id=user, k=1)
        echo_first += bool(top) and top[0].role == "assistant" and s.old_value.lower() in top[0].text.lower()
        mem.remember(f"Sure. {s.old_texts[-1]}", user_id=user, role="assistant")
        for for_mount in (False, True):  # what generate()/sessions/the chat endpoint mount: recall_for_mount
            ask = mem.recall_for_mount if for_mount else mem.recall
            hits = ask(s.question, user_id=user, k=3)
            stale = any(s.old_value.lower() in h.text.lower() and s.new_value.lower() not in h.text.lower()
                        for h in hits)
            if for_mount:
                without += stale
            else:
                with_assistant += stale
    return {"scenarios": len(items), "stale_top3_assistant_mounted": round(with_assistant / len(items), 3),
            "stale_top3_assistant_not_mounted": round(without / len(items), 3),
            "top1_assistant_echo_of_old": round(echo_first / len(items), 3)}


def asked_effect(mem: AgentMemory, items: list[Scenario]) -> dict[str, float]:
    """What asking costs: after each scenario's stream, the user asks its question and the question is remembered
    as their turn (what the chat endpoint and sessions do with every message). Share of scenarios whose current
    statement that write retracted (``current_hidden``: superseded), whose ``recall_for_mount`` for the same
    question then leaves the current value out (``current_not_mounted``), and whose recall(k=1) does not state it
    (``top1_not_new``)."""
    hidden = not_mounted = not_top1 = 0
    for n, s in enumerate(items):
        user = f"asked-{n}"
        for text in s.memories:
            mem.remember(text, user_id=user, role="user")
        current = [t for t in s.memories if s.new_value.lower() in t.lower()][-1]
        mem.remember(s.question, user_id=user, role="user")
        mem.wait_consolidation(timeout=600)
        active = {r.text for r in mem.list(user_id=user) if r.status == "active"}
        hidden += current not in active
        mounted = mem.recall_for_mount(s.question, user_id=user, k=4)
        not_mounted += not any(s.new_value.lower() in h.text.lower() for h in mounted)
        top = mem.recall(s.question, user_id=user, k=1)
        not_top1 += not (top and s.new_value.lower() in top[0].text.lower())
    count = len(items)
    return {"scenarios": count, "current_hidden": round(hidden / count, 3),
            "current_not_mounted": round(not_mounted / count, 3), "top1_not_new": round(not_top1 / count, 3)}


def natural_effect(mem: AgentMemory, cases: list[NaturalCase]) -> dict[str, dict[str, float]]:
    """Natural updates and look-alikes (``ku_natural.py``), each pair a new user's store; per group (``design``: the
    pairs a rule was designed on, ``check``: the other updates, ``alike``: the newer is no update, ``added`` /
    ``added_bare``: the newer is a second value, said as added or not, so both answer; ``others`` /
    ``others_asked``: the user's and a relative's statement of the same kind, asked about the older's subject;
    ``possible``: the newer is a plan or possibility, nothing changed yet; ``occasion``: the newer is an exception
    limited to an occasion):
    share whose ``recall(k=1)`` is the newer statement (``top1_new``), whose ``recall(k=5)`` ranks the newer above
    the older (``newer_first``; the older missing counts), whose mount (``recall_for_mount(k=4)``) holds the newer
    (``new_mounted``), the older without the newer (``stale_alone_mounted``) and the older (``old_mounted``: for
    look-alikes, the user's own statement, which still answers), and whose older statement the write superseded
    (``old_hidden``). Cases with an ``echo`` (the assistant's reply restating the older, written after it) also
    count whose ``recall(k=5)`` ranks that echo above the newer (``echo_first``; the newer missing counts)."""
    tally: dict[str, Counter] = {}
    for n, case in enumerate(cases):
        user = f"natural-{n}"
        for text, session in case.stream:
            mem.remember(text, user_id=user, role="user", session_id=session)
            if text == case.older and case.echo is not None:  # the assistant's reply, in the same session
                mem.remember(case.echo, user_id=user, role="assistant", session_id=session)
        mem.wait_consolidation(timeout=600)
        ranked = [h.text for h in mem.recall(case.question, user_id=user, k=5)]
        mounted = {h.text for h in mem.recall_for_mount(case.question, user_id=user, k=4)}
        active = {r.text for r in mem.list(user_id=user) if r.status == "active"}
        t = tally.setdefault(case.group, Counter())
        t["pairs"] += 1
        t["top1_new"] += ranked[:1] == [case.newer]
        t["newer_first"] += case.newer in ranked and (case.older not in ranked
                                                     or ranked.index(case.newer) < ranked.index(case.older))
        t["new_mounted"] += case.newer in mounted
        t["stale_alone_mounted"] += case.older in mounted and case.newer not in mounted
        t["old_mounted"] += case.older in mounted
        t["old_hidden"] += case.older not in active
        if case.echo is not None:  # the assistant's echo of the older before the newer (the newer missing counts)
            t["echo_first"] += case.echo in ranked and (case.newer not in ranked
                                                       or ranked.index(case.echo) < ranked.index(case.newer))
    keys = ("top1_new", "newer_first", "new_mounted", "stale_alone_mounted", "old_mounted", "old_hidden",
            *(("echo_first",) if any(c.echo for c in cases) else ()))
    return {group: {"pairs": t["pairs"], **{key: round(t[key] / t["pairs"], 3) for key in keys}}
            for group, t in tally.items()}


def natural_runs(root: Path, fillers: list[int], *, wrapped: str | None = None,
                 echoed: bool = False) -> dict[str, dict[str, dict[str, float]]]:
    """:func:`natural_effect` on the natural updates and look-alikes, once per number of unrelated memories; with
    ``wrapped`` ("older" or "both") also once more each with the older statements (``wrapped_fillers_N``), and with
    "both" once more with both statements (``wrapped_both_fillers_N``), said inside longer messages; with
    ``echoed`` once more each with the assistant's echo of the older statement (``echoed_fillers_N``)."""
    out = {}
    modes = {None: (None,), "older": (None, "older"), "both": (None, "older", "both")}[wrapped]
    prefixes = {None: "", "older": "wrapped_", "both": "wrapped_both_"}
    runs = [(mode, False, prefixes[mode]) for mode in modes] + ([(None, True, "echoed_")] if echoed else [])
    for mode, echo, prefix in runs:
        for n in fillers:
            name = f"{prefix}fillers_{n}"
            with AgentMemory(root / f"ku-natural-{name}", consolidation="local") as mem:
                made = {"fillers": n, "wrapped": mode or False, "echoed": echo}
                cases = (natural_cases(**made) + alike_cases(**made) + added_cases(**made) + others_cases(**made)
                         + kept_cases(**made))
                out[name] = natural_effect(mem, cases)
            print(f"natural {name}", out[name], file=sys.stderr, flush=True)
    return out


# ablations of recall's consolidation steps, through the public config (agentmem/entries/versions.py)
ABLATIONS = {"without_recall_demotion": {"recall_conflict_demotion": False},
             "without_version_following": {"recall_follows_versions": False}}


def locomo_recall(path: Path, consolidation: str, store: Path, ks: tuple[int, ...] = (5, 10)) -> dict[str, float]:
    """benchmarks/locomo.py's end-to-end recall@k, with the store's consolidation set to ``consolidation``."""
    from locomo import end_to_end, load_conversations, questions_of

    conversations = json.loads(path.read_text())
    with AgentMemory(store, consolidation=consolidation) as mem:
        questions = questions_of(conversations, load_conversations(mem, conversations))
        out = end_to_end(mem, questions, list(ks))
        out.update({k: v for k, v in mem.stats()["lifecycle"].items() if k in ("merged", "superseded")})
    if consolidation != "off":  # ablations on the same store, reopened with one recall step switched off
        for name, switch in ABLATIONS.items():
            with AgentMemory(store, consolidation=consolidation, **switch) as mem:
                plain = end_to_end(mem, questions, list(ks))
            out[name] = {k: plain[k] for k in plain if k.startswith("recall@") and "_by_" not in k}
    return out


def remember_p95(root: Path, n: int) -> dict[str, float]:
    """remember() latency with consolidation "local" and "off", interleaved so both see the same machine load."""
    items = scenarios("tune", n=max(1, n // 8), seed=7)
    stream = [(f"lat-{i}", t) for i, s in enumerate(items) for t in s.memories]
    times: dict[str, list[float]] = {"local": [], "off": []}
    with AgentMemory(root / "lat-local", consolidation="local") as on, \
            AgentMemory(root / "lat-off", consolidation="off") as off:
        for mem in (on, off):  # warm up: model load, first collection
            mem.remember("warm up", user_id="warm")
        for user, text in stream[:n]:
            for name, mem in (("local", on), ("off", off)):
                t0 = time.perf_counter()
                mem.remember(text, user_id=user, role="user")
                times[name].append(time.perf_counter() - t0)
    p95 = {k: round(1000 * float(np.percentile(v, 95)), 2) for k, v in times.items()}
    p95["ratio"] = round(p95["local"] / p95["off"], 3)
    return p95


def plot(result: dict, half: str, path: Path) -> None:
    """Bars: top1_new and stale_top3 per consolidation mode, and LoCoMo recall@5/@10 per mode (when measured)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = result[half]
    fig, axes = plt.subplots(1, 2 if "locomo" in result else 1, figsize=(10, 4), squeeze=False)
    axes = axes[0]
    names = list(modes)
    for off, metric in ((-0.2, "top1_new"), (0.2, "stale_top3")):
        axes[0].bar([i + off for i in range(len(names))], [modes[m][metric] for m in names], 0.4, label=metric)
    axes[0].axhline(0.9, ls="--", c="C0", lw=0.8)
    axes[0].axhline(0.1, ls="--", c="C1", lw=0.8)
    axes[0].set_xticks(range(len(names)), [f"{m} (n={modes[m]['scenarios']})" for m in names])
    axes[0].set_title(f"knowledge updates, {half} half (dashed: goals)")
    axes[0].legend()
    if "locomo" in result:
        lc = result["locomo"]
        for off, k in ((-0.2, "recall@5"), (0.2, "recall@10")):
            axes[1].bar([off, 1 + off], [lc["off"][k], lc["local"][k]], 0.4, label=k)
        axes[1].set_xticks([0, 1], ["off", "local"])
        axes[1].set_ylim(0, 1)
        axes[1].set_title("LoCoMo recall (5 conversations)")
        axes[1].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--half", choices=["tune", "test"], default="test", help="template half to report")
    ap.add_argument("--n", type=int, default=200, help="scenarios per mode")
    ap.add_argument("--llm-n", type=int, default=20, help="scenarios for the llm mode (local model: slow on CPU)")
    ap.add_argument("--locomo", type=Path, default=None, help="LoCoMo json: recall@5/@10 with consolidation on/off")
    ap.add_argument("--distinct-n", type=int, default=100,
                    help="pairs differing in one value (must not merge) per mode; half as many exact restatements")
    ap.add_argument("--latency-n", type=int, default=200, help="remember() calls timed per mode")
    ap.add_argument("--roles-n", type=int, default=60, help="scenarios for the assistant-role measurement")
    ap.add_argument("--asked-n", type=int, default=60, help="scenarios whose question is then asked and remembered")
    ap.add_argument("--natural", type=int, nargs="*", default=None, metavar="FILLERS",
                    help="also the hand-written natural updates and held-out look-alikes (ku_natural.py), each pair "
                         "a new user's store with this many unrelated memories besides (several: one run each; "
                         "none given: 0 and 4)")
    ap.add_argument("--wrapped", nargs="?", const="older", choices=["older", "both"], default=None,
                    help="with --natural: also each older statement said inside a longer chat message (a greeting, "
                         "another sentence), as users write; 'both': then the newer one too")
    ap.add_argument("--echoed", action="store_true", help="with --natural: also each older statement followed by the "
                    "assistant's reply restating it ('Got it: you take 20 mg ...'), as a chat stores both turns")
    ap.add_argument("--plot", type=Path, default=None, help="write a PNG of the results here")
    ap.add_argument("--ablate", action="store_true",
                    help="also run the local scenarios with each of recall's consolidation steps switched off")
    ap.add_argument("--no-scenarios", action="store_true",
                    help="skip the off/local scenario runs (e.g. to run only the heavy parts under a lock)")
    return ap.parse_args()


def scenario_modes(root: Path, args: argparse.Namespace, items: list) -> dict[str, dict[str, float]]:
    """The scenarios under each consolidation mode (and, with ``--ablate``, each local step switched off)."""
    per_mode: dict[str, dict[str, float]] = {}
    for mode in () if args.no_scenarios else ("off", "local"):
        with AgentMemory(root / f"ku-{mode}", consolidation=mode) as mem:
            per_mode[mode] = run_scenarios(mem, items, mode)
        print(mode, per_mode[mode], file=sys.stderr, flush=True)
    for name, switch in ABLATIONS.items() if args.ablate else ():
        with AgentMemory(root / f"ku-local-{name}", consolidation="local", **switch) as mem:
            per_mode[f"local_{name}"] = run_scenarios(mem, items, "local")
        print(f"local {name}", per_mode[f"local_{name}"], file=sys.stderr, flush=True)
    if args.llm_n:
        with AgentMemory(root / "ku-llm", consolidation="llm") as mem:
            per_mode["llm"] = run_scenarios(mem, items[: args.llm_n], "llm")
            per_mode["llm"]["decisions"] = mem.stats()["lifecycle"]  # type: ignore[assignment]
        print("llm", per_mode["llm"], file=sys.stderr, flush=True)
    return per_mode


def other_measurements(root: Path, args: argparse.Namespace, items: list) -> dict[str, object]:
    """Distinct facts, roles, asked questions, the natural pairs, LoCoMo recall and remember() latency, as asked."""
    result: dict[str, object] = {}
    if args.distinct_n:
        distinct = {}
        for mode in ("off", "local"):
            with AgentMemory(root / f"distinct-{mode}", consolidation=mode) as mem:
                distinct[mode] = distinct_facts(mem, args.distinct_n, mode)
            print(f"distinct {mode}", distinct[mode], file=sys.stderr, flush=True)
        result["distinct"] = distinct
    if args.roles_n:
        with AgentMemory(root / "ku-roles", consolidation="local") as mem:
            result["roles"] = roles_effect(mem, items[: args.roles_n])
        print("roles", result["roles"], file=sys.stderr, flush=True)
    if args.asked_n:
        with AgentMemory(root / "ku-asked", consolidation="local") as mem:
            result["asked"] = asked_effect(mem, items[: args.asked_n])
        print("asked", result["asked"], file=sys.stderr, flush=True)
    if args.natural is not None:
        result["natural"] = natural_runs(root, args.natural or [0, 4], wrapped=args.wrapped, echoed=args.echoed)
    if args.locomo:
        on = locomo_recall(args.locomo, "local", root / "locomo-local")
        off = locomo_recall(args.locomo, "off", root / "locomo-off")
        result["locomo"] = {"local": on, "off": off,
                            "delta@5": round(on["recall@5"] - off["recall@5"], 4),
                            "delta@10": round(on["recall@10"] - off["recall@10"], 4)}
        print("locomo", result["locomo"], file=sys.stderr, flush=True)
    if args.latency_n:
        result["remember_p95_ms"] = remember_p95(root, args.latency_n)
    return result


def main() -> None:
    args = parse_args()
    items = scenarios(args.half, n=args.n, seed=1)
    with tempfile.TemporaryDirectory() as tmp:
        per_mode = scenario_modes(Path(tmp), args, items)
        result: dict[str, object] = {args.half: per_mode, **other_measurements(Path(tmp), args, items)}
    if args.plot and per_mode:
        plot(result, args.half, args.plot)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
