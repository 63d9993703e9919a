"""Does recall fall off as the history grows? A controlled re-ingest (issue #38: "REALTALK's kept-aside
conversations are 1,000-1,500 turns; recall must not fall off with history length").

``research/recall_by_length.py`` places evidence by its age in full stores, so it mixes questions and conversations.
Here the question is held fixed and only the history around it grows. For each conversation of a dev set, one fresh
store (defaults, embedded models, ingested through ``benchmarks/locomo.py``'s own ``load_conversations``) is fed the
conversation **in time order, one chunk of whole sessions at a time**, and recall is asked at checkpoints:

- after the first 25 %, 50 %, 75 %, 100 % of its turns (rounded to whole sessions);
- ``padded``: then the sessions of the next conversation(s) of the same file (cyclically) as later history of the
  same user, dates shifted to follow its last session, one checkpoint as the history reaches each ``--pad-to`` (1,000
  and 1,400 turns by default: REALTALK's kept-aside conversations are 1,000-1,500 turns). Padding turns come from other people (other names,
  other lives), so they are easier distractors than a real long history of the same two speakers;
  ``--padding-speakers own`` renames them (speakers and names in the text) to the conversation's own pair.

At every checkpoint two question sets are scored with ``benchmarks/locomo.py``'s ``recall_summary``:

- ``fixed``: the questions (categories 1-4) whose evidence turns all lie in the first 25 %: the same questions at every
  size;
- ``inside``: every question whose evidence turns all lie in the ingested prefix (the uncontrolled figure).

    nice -n 15 python research/recall_by_history_size.py --datasets locomo realtalk \
        --work /tmp/histsize --plot research/notes/recall_by_history_size.png

Each dataset's result is kept in ``--work`` and reused by a later run (delete it to measure again).
Last line: {"locomo": {"checkpoints": [{"checkpoint": "25%", "history_turns": ..., "fixed": {...}, "inside": {...}},
...], "slope_fixed_recall@10_per_1000_turns": ...}, "realtalk": {...}, "pad_to": [1000, 1400]}
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks")]
import locomo  # noqa: E402

from agentmem import AgentMemory  # noqa: E402

# ../shared/data from the checkout (from a worktree a level deeper, the nearest parent that has it)
SHARED = next((p / "shared/data" for p in ROOT.parents if (p / "shared/data").is_dir()), ROOT.parent / "shared/data")
DATA = {"locomo": SHARED / "locomo/locomo_dev5.json", "realtalk": SHARED / "realtalk/realtalk_dev5.json"}
FRACTIONS = (0.25, 0.5, 0.75, 1.0)
KS = [5, 10]
# the two session date formats of the dev sets: LoCoMo "1:56 pm on 8 May, 2023", REALTALK "29.12.2023, 00:51:12"
DATE_FORMATS = ("%I:%M %p on %d %B, %Y", "%d.%m.%Y, %H:%M:%S")


def session_cuts(conversation: dict, fractions: tuple[float, ...] = FRACTIONS) -> list[int]:
    """How many whole sessions make up each fraction of the conversation's turns (the nearest session boundary,
    at least one session).

    Example:
        >>> conv = {"sessions": [{"turns": [0] * n} for n in (10, 10, 20, 40)]}
        >>> session_cuts(conv)
        [2, 3, 3, 4]
    """
    cumulative = np.cumsum([len(s["turns"]) for s in conversation["sessions"]])
    total = cumulative[-1]
    return [int(np.argmin(np.abs(cumulative - f * total))) + 1 for f in fractions]


def parse_date(text: str) -> tuple[datetime, str]:
    """A session's date and the format it was written in.

    Example:
        >>> parse_date("29.12.2023, 00:51:12")[0]
        datetime.datetime(2023, 12, 29, 0, 51, 12)
    """
    for fmt in DATE_FORMATS:
        try:
            return datetime.strptime(text, fmt), fmt
        except ValueError:
            continue
    raise ValueError(f"unknown session date format: {text!r}")


def format_date(when: datetime, fmt: str) -> str:
    """``when`` written as the dataset writes its dates (LoCoMo's hour and day without a leading zero, "pm" lower).

    Example:
        >>> format_date(datetime(2023, 5, 8, 13, 56), DATE_FORMATS[0])
        '1:56 pm on 8 May, 2023'
    """
    if fmt == DATE_FORMATS[0]:
        return f"{int(when.strftime('%I'))}:{when:%M} {when.strftime('%p').lower()} on {when.day} {when:%B}, {when.year}"
    return when.strftime(fmt)


def speaker_map(own: dict, other: dict) -> dict[str, str]:
    """Other's speakers → own's, for padding told as if the conversation's own pair had said it: a speaker both
    conversations share keeps the name, the others are paired in order (``speaker_a`` first).

    Example:
        >>> speaker_map({"speaker_a": "Emi", "speaker_b": "elise"}, {"speaker_a": "Kevin", "speaker_b": "elise"})
        {'elise': 'elise', 'Kevin': 'Emi'}
    """
    mine = [own["speaker_a"], own["speaker_b"]]
    theirs = [other["speaker_a"], other["speaker_b"]]
    mapping = {name: name for name in theirs if name in mine}
    free = [name for name in mine if name not in mapping]
    mapping.update(zip([name for name in theirs if name not in mapping], free))
    return mapping


def renamed(text: str, mapping: dict[str, str]) -> str:
    """``text`` with each mapped speaker's full and first name replaced by its image (whole words, any case).

    Example:
        >>> renamed("Hi kevin! Kevin Smith said so.", {"Kevin Smith": "Emi", "Paola": "Paola"})
        'Hi Emi! Emi said so.'
    """
    for old, new in mapping.items():
        if old == new:
            continue
        for form in dict.fromkeys([old, old.split()[0]]):
            text = re.sub(rf"\b{re.escape(form)}\b", new, text, flags=re.IGNORECASE)
    return text


def padding(conversations: list[dict], index: int, pad_to: int, speakers: str = "others") -> dict:
    """The later history appended to conversation ``index``: the sessions of the next conversations of the file
    (cyclically), until the history holds at least ``pad_to`` turns; renumbered after its last session, dates shifted
    so the first follows its last session by a day (the padding's own gaps kept), ``dia_id`` prefixed so none
    collides with the conversation's own. Returned as a conversation of the same id (the same user); no questions.
    ``speakers="own"`` tells the padding as the conversation's own pair (:func:`speaker_map`: turns' speakers and
    names in their text), the closer proxy of one pair's long history: no name then tells padding from evidence.

    Example:
        >>> convs = [{"conversation_id": c, "sessions": [{"session": 1, "date_time": d, "turns": [{"dia_id": "D1:1"}]}]}
        ...          for c, d in (("a", "29.12.2023, 00:51:12"), ("b", "01.01.2023, 10:00:00"))]
        >>> pad = padding(convs, 0, 2)
        >>> pad["conversation_id"], pad["sessions"][0]["session"], pad["sessions"][0]["date_time"]
        ('a', 2, '30.12.2023, 00:51:12')
        >>> pad["sessions"][0]["turns"][0]["dia_id"]
        'pad-b:D1:1'
    """
    own = conversations[index]
    turns = sum(len(s["turns"]) for s in own["sessions"])
    last, fmt = parse_date(own["sessions"][-1]["date_time"])
    number = own["sessions"][-1]["session"]
    sessions: list[dict] = []
    step = 1
    while turns < pad_to:
        other = conversations[(index + step) % len(conversations)]
        step += 1
        if other is own:
            continue
        shift = last + timedelta(days=1) - parse_date(other["sessions"][0]["date_time"])[0]
        names = speaker_map(own, other) if speakers == "own" else {}
        for session in other["sessions"]:
            if turns >= pad_to:
                break
            number += 1
            when = parse_date(session["date_time"])[0] + shift
            sessions.append({"session": number, "date_time": format_date(when, fmt),
                             "turns": [{**t, "dia_id": f"pad-{other['conversation_id']}:{t['dia_id']}",
                                        **({"speaker": names.get(t["speaker"], t["speaker"]),
                                            "text": renamed(t["text"], names)} if names else {})}
                                       for t in session["turns"]]})
            turns += len(session["turns"])
        last = parse_date(sessions[-1]["date_time"])[0]
    return {"conversation_id": own["conversation_id"], "sessions": sessions, "qa": []}


def asked_within(conversation: dict, dia_ids: set[str]) -> dict:
    """The conversation with only the questions whose evidence turns (those the conversation holds) all lie in
    ``dia_ids``.

    Example:
        >>> conv = {"sessions": [{"turns": [{"dia_id": "D1:1"}, {"dia_id": "D2:1"}]}],
        ...         "qa": [{"evidence": ["D1:1"]}, {"evidence": ["D1:1", "D2:1"]}, {"evidence": ["D1:1", "D9:9"]}]}
        >>> [q["evidence"] for q in asked_within(conv, {"D1:1"})["qa"]]
        [['D1:1'], ['D1:1', 'D9:9']]
    """
    held = {t["dia_id"] for s in conversation["sessions"] for t in s["turns"]}
    keep = [qa for qa in conversation["qa"]
            if (ev := [d for d in qa.get("evidence") or [] if d in held]) and set(ev) <= dia_ids]
    return {**conversation, "qa": keep}


def within_slope(points: list[tuple[str, float, float, int]]) -> float:
    """The least-squares slope of recall on history turns (per 1,000) within conversations (each conversation's
    weighted means removed, so longer conversations do not stand in for longer histories), each point weighted by its
    questions: the pooled per-question fit with a conversation fixed effect. ``points``: (conversation, history
    turns, recall, questions).

    Example:
        >>> within_slope([("a", 0, 0.9, 1), ("a", 1000, 0.8, 1), ("b", 500, 0.5, 3), ("b", 1500, 0.4, 3)])
        -0.1
    """
    x, y, w = (np.array(v, dtype=float) for v in zip(*[(t / 1000, r, n) for _, t, r, n in points]))
    convs = np.array([c for c, *_ in points])
    for c in set(convs):
        m = convs == c
        x[m] -= np.average(x[m], weights=w[m])
        y[m] -= np.average(y[m], weights=w[m])
    return round(float((w * x * y).sum() / (w * x * x).sum()), 4)


def pad_cuts(conv: dict, pad: dict, pad_to: list[int]) -> list[int]:
    """How many of the padding's sessions bring the history to each of ``pad_to`` turns (at least).

    Example:
        >>> pad_cuts({"sessions": [{"turns": [0] * 5}]}, {"sessions": [{"turns": [0] * 3}] * 4}, [10, 14])
        [2, 3]
    """
    history = sum(len(s["turns"]) for s in conv["sessions"]) + np.cumsum([len(s["turns"]) for s in pad["sessions"]])
    return [min(int(np.searchsorted(history, target)) + 1, len(pad["sessions"])) for target in pad_to]


def grow(mem: AgentMemory, conv: dict, pad: dict, pad_to: list[int], bar: tqdm) -> list[dict[str, Any]]:
    """Ingest ``conv`` then ``pad`` chunk by chunk into ``mem``; at each checkpoint recall the fixed and the inside
    question sets. One row per checkpoint: its history turns and each set's questions and ranked ids."""
    cuts = session_cuts(conv)
    first = {t["dia_id"] for s in conv["sessions"][: cuts[0]] for t in s["turns"]}
    chunks = [(f"{round(100 * f)}%", conv, lo, hi) for f, lo, hi in zip(FRACTIONS, [0, *cuts], cuts)]
    more = pad_cuts(conv, pad, pad_to)
    chunks += [(f"padded to {t}", pad, lo, hi) for t, lo, hi in zip(pad_to, [0, *more], more)]
    id_map: dict[str, str] = {}
    history = 0
    rows = []
    for label, source, lo, hi in chunks:
        chunk = {**source, "sessions": source["sessions"][lo:hi]}
        made = locomo.load_conversations(mem, [chunk])[str(source["conversation_id"])]
        if source is conv:
            id_map.update(made)
        added = sum(len(s["turns"]) for s in chunk["sessions"])
        history += added
        bar.update(added)
        inside = locomo.questions_of([asked_within(conv, set(id_map))], {str(conv["conversation_id"]): id_map})
        fixed = locomo.questions_of([asked_within(conv, first)], {str(conv["conversation_id"]): id_map})
        ranked = dict(zip(map(id, fixed + inside), locomo.recalled(mem, fixed + inside, max(KS))))
        rows.append({"checkpoint": label, "history_turns": history, "fixed": fixed, "inside": inside,
                     "ranked": ranked})
    return rows


def measure(name: str, work: Path, pad_to: list[int], conversations: int | None, max_sessions: int | None,
            consolidation: str = "local", speakers: str = "others") -> dict[str, Any]:
    """Grow one store per conversation of dataset ``name`` (consolidating as ``consolidation`` says, padding told by
    ``speakers``: see :func:`padding`) and summarise every checkpoint over its conversations."""
    convs = json.loads(DATA[name].read_text())
    if max_sessions:
        convs = [{**c, "sessions": c["sessions"][:max_sessions]} for c in convs]
    chosen = range(len(convs))[:conversations]
    pads = {i: padding(convs, i, max(pad_to), speakers) if pad_to else {"sessions": []} for i in chosen}
    total = sum(len(s["turns"]) for i in chosen for c in (convs[i], pads[i]) for s in c["sessions"])
    per_conv = {}
    with tqdm(total=total, desc=f"{name}: ingesting", unit="turn") as bar:
        for i in chosen:
            with tempfile.TemporaryDirectory(dir=work) as tmp, AgentMemory(Path(tmp) / "s", kv_encoding="off",
                                                                    consolidation=consolidation) as mem:
                per_conv[str(convs[i]["conversation_id"])] = grow(mem, convs[i], pads[i], pad_to, bar)
    return summarise(per_conv)


def summarise(per_conv: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Pool each checkpoint's questions over the conversations (``locomo.recall_summary``), and fit the slope."""
    labels = [r["checkpoint"] for r in next(iter(per_conv.values()))]
    out: dict[str, Any] = {"conversations": len(per_conv), "checkpoints": [], "by_conversation": {}}
    for n, label in enumerate(labels):
        rows = [rs[n] for rs in per_conv.values()]
        entry: dict[str, Any] = {"checkpoint": label,
                                 "history_turns": round(statistics.fmean(r["history_turns"] for r in rows), 1),
                                 "history_turns_range": [min(r["history_turns"] for r in rows),
                                                         max(r["history_turns"] for r in rows)]}
        for which in ("fixed", "inside"):
            qs = [q for r in rows for q in r[which]]
            summary = locomo.recall_summary(qs, [r["ranked"][id(q)] for r in rows for q in r[which]], KS)
            entry[which] = {k: summary[k] for k in ("questions", "recall@5", "recall@10")}
        out["checkpoints"].append(entry)
    for cid, rs in per_conv.items():
        fixed = [locomo.recall_summary(r["fixed"], [r["ranked"][id(q)] for q in r["fixed"]], KS) for r in rs]
        out["by_conversation"][cid] = {"history_turns": [r["history_turns"] for r in rs],
                                       "fixed_questions": len(rs[0]["fixed"]),
                                       "fixed_recall@10": [f["recall@10"] for f in fixed]}
    return {**out, **slopes(out)}


def slopes(result: dict[str, Any]) -> dict[str, float]:
    """The fixed set's recall@10 slope per 1,000 turns (``within_slope``) over every checkpoint, over the
    conversation's own history (25 % to 100 %) and over the padding (100 % and the padded checkpoints).

    Example:
        >>> one = {"checkpoints": [{"checkpoint": c} for c in ("50%", "100%", "padded to 1000")],
        ...        "by_conversation": {"a": {"history_turns": [200, 400, 1000], "fixed_questions": 5,
        ...                                  "fixed_recall@10": [0.9, 0.8, 0.8]}}}
        >>> slopes(one)["slope_fixed_recall@10_per_1000_turns_own_history"]
        -0.5
    """
    labels = [c["checkpoint"] for c in result["checkpoints"]]
    spans = {"": labels, "_own_history": [c for c in labels if not c.startswith("padded")],
             "_padding": ["100%", *[c for c in labels if c.startswith("padded")]]}
    out = {}
    for suffix, chosen in spans.items():
        if len(chosen) < 2:  # no padding checkpoints: nothing to fit a padding slope on
            continue
        points = [(cid, t, r, row["fixed_questions"]) for cid, row in result["by_conversation"].items()
                  for c, t, r in zip(labels, row["history_turns"], row["fixed_recall@10"]) if c in chosen]
        out[f"slope_fixed_recall@10_per_1000_turns{suffix}"] = within_slope(points)
    return out


def plot(result: dict[str, Any], names: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name in names:
        cps = result[name]["checkpoints"]
        ax.plot([c["history_turns"] for c in cps], [c["fixed"]["recall@10"] for c in cps], marker="o",
                label=f"{name} ({cps[0]['fixed']['questions']} fixed questions)")
        for c in cps:
            ax.annotate(c["checkpoint"], (c["history_turns"], c["fixed"]["recall@10"]), fontsize=7,
                        textcoords="offset points", xytext=(3, 4))
    ax.set(xlabel=f"history turns in the store (mean over {result[names[0]]['conversations']} conversations)",
           ylabel="recall@10 of the fixed question set", ylim=(0, 1),
           title="Same questions (evidence in the first 25 %), growing history")
    ax.legend(loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--datasets", nargs="+", choices=list(DATA), default=list(DATA))
    ap.add_argument("--work", type=Path, required=True, help="stores are made (and deleted) here; results kept")
    ap.add_argument("--pad-to", type=int, nargs="*", default=[1000, 1400],
                    help="a checkpoint when padding brings the history to each of these turns (at least); none: "
                    "the conversation's own history only")
    ap.add_argument("--consolidation", choices=["local", "off"], default="local",
                    help="the stores' consolidation (the default, or none: what superseding costs the fixed set)")
    ap.add_argument("--padding-speakers", choices=["others", "own"], default="others",
                    help="padding said by its own speakers (other people), or renamed to the conversation's own pair")
    ap.add_argument("--conversations", type=int, default=None, help="only the first N conversations (a smoke run)")
    ap.add_argument("--max-sessions", type=int, default=None, help="only each conversation's first N sessions")
    ap.add_argument("--plot", type=Path, default=None)
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {}
    for name in args.datasets:
        kept = args.work / (f"{name}-{'_'.join(map(str, args.pad_to))}-{args.conversations}-{args.max_sessions}"
                            f"{'' if args.consolidation == 'local' else '-' + args.consolidation}"
                            f"{'' if args.padding_speakers == 'others' else '-own-speakers'}.json")
        if not kept.exists():
            kept.write_text(json.dumps(measure(name, args.work, args.pad_to, args.conversations, args.max_sessions,
                                               args.consolidation, args.padding_speakers)))
        result[name] = json.loads(kept.read_text())
        result[name].update(slopes(result[name]))
    result["pad_to"] = args.pad_to
    if args.plot:
        plot(result, args.datasets, args.plot)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
