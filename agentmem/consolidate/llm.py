"""Consolidation by a chat model (``MemoryConfig(consolidation="llm")``), on a background worker.

Like mem0: for each new memory, the model sees the user's nearest existing memories and proposes one of ADD (keep
both), UPDATE (the new memory replaces memory ``id``: that one is superseded), DELETE (the new memory retracts
memory ``id``) or NOOP (nothing new: the new memory is merged into the existing one — only when both are the same
statement after normalising case, spacing and punctuation; a NOOP for a differing text keeps both, counted as
``llm_noop_kept``, since a write is never discarded on a model's word). ``remember()`` has already stored the memory
and returned; the decision lands shortly after (``mem.wait_consolidation()`` waits for it).

Any LangChain ``BaseChatModel`` works: its ``with_structured_output`` is used when it has one, else its reply is
parsed as JSON. The local model (:func:`local_chat`) answers through the KV engine with *constrained decoding*: a
few-shot prompt and a logits processor (:class:`ChoiceProcessor`) that only lets it write one of the valid answers
("ADD", "UPDATE 0", "NOOP 1", ...), so a tiny model's answer is always a decision (asked for free-form JSON,
SmolLM2-135M gave 14 invalid replies of 16). A reply that is not a valid decision changes nothing (counted as
``llm_invalid``): the safe default is to keep every memory.

Example:
    >>> parse_decision('Sure: {"event": "UPDATE", "id": 0, "reason": "moved"}', n_existing=1)
    LlmDecision(event='UPDATE', id=0, reason='moved')
    >>> parse_decision("I think you should update it", n_existing=1) is None
    True
"""

from __future__ import annotations

import json
import logging
import queue
import re
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from agentmem.consolidate.statements import only_asks, statement_key

log = logging.getLogger(__name__)

SYSTEM = (
    "You manage a user's long-term memory. Compare the NEW memory with the EXISTING ones and answer with JSON only: "
    '{"event": "ADD" | "UPDATE" | "DELETE" | "NOOP", "id": <number of the existing memory or null>, "reason": "..."}. '
    "ADD: the new memory is new information. UPDATE: it replaces existing memory id (same fact, newer value). "
    "DELETE: it says existing memory id is no longer true. NOOP: it repeats existing memory id."
)


class LlmDecision(BaseModel):
    """The structured answer asked of the chat model."""

    event: Literal["ADD", "UPDATE", "DELETE", "NOOP"]
    id: int | None = Field(default=None, description="number of the existing memory concerned")
    reason: str = ""


def build_messages(new_text: str, existing: Sequence[str]) -> list[tuple[str, str]]:
    """(role, content) messages for one decision; existing memories are numbered from 0."""
    listing = "\n".join(f"{i}: {t}" for i, t in enumerate(existing)) or "(none)"
    return [("system", SYSTEM), ("human", f"EXISTING:\n{listing}\n\nNEW: {new_text}\n\nJSON:")]


def parse_decision(reply: Any, *, n_existing: int) -> LlmDecision | None:
    """A decision from a structured-output object or a text reply; None when it is not a valid one."""
    try:
        if isinstance(reply, LlmDecision):
            decision = reply
        elif isinstance(reply, dict):
            decision = LlmDecision.model_validate(reply)
        else:
            text = getattr(reply, "content", reply)
            match = re.search(r"\{.*?\}", str(text), flags=re.S)
            if match is None:
                return None
            decision = LlmDecision.model_validate(json.loads(match.group(0)))
    except (ValidationError, ValueError, TypeError):
        return None
    if decision.event != "ADD" and (decision.id is None or not 0 <= decision.id < n_existing):
        return None  # UPDATE / DELETE / NOOP must name one of the memories shown
    return decision


def ask(chat: Any, new_text: str, existing: Sequence[str]) -> LlmDecision | None:
    """Ask ``chat`` for a decision: its own constrained ``decide`` (the local model), else structured output when
    the model supports it, else JSON in its reply."""
    if isinstance(chat, _LocalChat):
        return chat.decide(new_text, existing)
    messages = build_messages(new_text, existing)
    structured = None
    if hasattr(chat, "with_structured_output"):
        try:
            structured = chat.with_structured_output(LlmDecision)
        except NotImplementedError:  # BaseChatModel's default when the model has no tool calling
            structured = None
    if structured is not None:
        try:
            return parse_decision(structured.invoke(messages), n_existing=len(existing))
        except (NotImplementedError, ValidationError, ValueError):
            pass  # some models accept the call but cannot honour it: fall back to plain text
    return parse_decision(chat.invoke(messages), n_existing=len(existing))


FEW_SHOT = (
    "Decide how a NEW memory relates to the EXISTING memories of the same user.\n"
    "ADD = new information. UPDATE k = it replaces memory k (the same fact with a new value). "
    "DELETE k = it says memory k is no longer true. NOOP k = it repeats memory k.\n\n"
    "EXISTING:\n0: I live in Lyon.\n1: I like jazz.\nNEW: We moved to Berlin last week.\nAnswer: UPDATE 0\n\n"
    "EXISTING:\n0: My sister is a nurse.\nNEW: I adopted a cat.\nAnswer: ADD\n\n"
    "EXISTING:\n0: I like hiking.\n1: I work at Google.\nNEW: I'm employed by Google.\nAnswer: NOOP 1\n\n"
    "EXISTING:\n0: I have a dentist appointment on Friday.\nNEW: The dentist appointment was cancelled.\n"
    "Answer: DELETE 0\n\n"
)


def choices(n_existing: int) -> list[str]:
    """Every valid answer of the constrained local decision for ``n_existing`` memories shown."""
    return ["ADD"] + [f"{event} {i}" for event in ("UPDATE", "DELETE", "NOOP") for i in range(n_existing)]


class ChoiceProcessor:
    """A logits processor (``(generated ids, scores) -> scores``) that only allows continuations of one of the
    given token sequences, then an end-of-sequence token: greedy decoding then writes exactly one of them.

    Example:
        >>> import torch
        >>> proc = ChoiceProcessor([[5, 6], [7]], eos_id=0)
        >>> proc(torch.tensor([[5]]), torch.zeros(1, 10)).argmax().item()
        6
    """

    def __init__(self, sequences: Sequence[Sequence[int]], eos_id: int) -> None:
        self._sequences = [list(s) for s in sequences]
        self._eos = eos_id

    def __call__(self, ids: Any, scores: Any) -> Any:
        done = [int(i) for i in ids[0]] if ids.numel() else []
        allowed = {s[len(done)] for s in self._sequences if len(s) > len(done) and s[: len(done)] == done}
        if any(s == done for s in self._sequences) or not allowed:
            allowed.add(self._eos)
        masked = scores.new_full(scores.shape, float("-inf"))
        index = list(allowed)
        masked[..., index] = scores[..., index]
        return masked


class _LocalChat:
    """The local model as a consolidation model: a few-shot prompt, answered by constrained decoding."""

    def __init__(self, engine: Callable[[], Any]) -> None:
        self._engine = engine

    def decide(self, new_text: str, existing: Sequence[str]) -> LlmDecision | None:
        engine = self._engine()
        options = choices(len(existing))
        eos = engine.tokenizer.eos_token_id if engine.tokenizer.eos_token_id is not None else 0
        # through the engine's layout, whose encodes hold the one tokenizer lock (agentmem/kv/prompt.py)
        encoded = [engine.layout.template_ids(o) for o in options]
        proc = ChoiceProcessor(encoded, eos_id=eos)
        listing = "\n".join(f"{i}: {t}" for i, t in enumerate(existing))
        question = f"EXISTING:\n{listing}\nNEW: {new_text}\nAnswer:"
        longest = max(len(e) for e in encoded) + 1
        out = engine.generate(FEW_SHOT + question, [], mode="text", max_new_tokens=longest, logits_processor=proc)
        if out.max_new_tokens < longest:  # a small context: the instructions without the worked examples
            short = FEW_SHOT.split("\n\n")[0] + "\n\n" + question
            out = engine.generate(short, [], mode="text", max_new_tokens=longest, logits_processor=proc)
        ids = [i for i in out.token_ids if i != eos]
        chosen = next((o for o, e in zip(options, encoded) if e == ids), None)  # the tokens, not their rendering
        if chosen is None:
            return None
        answer = chosen.split()
        ident = int(answer[1]) if len(answer) > 1 else None
        return parse_decision({"event": answer[0], "id": ident, "reason": "local model (constrained)"},
                              n_existing=len(existing))


def local_chat(engine: Callable[[], Any]) -> _LocalChat:
    """The store's own local LLM (loaded on first use) as the consolidation model."""
    return _LocalChat(engine)


class ConsolidationWorker:
    """One daemon thread deciding queued memories in order.

    Args:
        chat: the chat model.
        context: ``entry_id -> (new text, [(existing id, existing text)])`` or None when nothing is to decide.
        apply: ``(entry_id, decision, existing ids) -> outcome`` (an outcome name counted in :meth:`stats`).
    """

    def __init__(self, chat: Any, context: Callable[[str], tuple[str, list[tuple[str, str]]] | None],
                 apply: Callable[[str, LlmDecision, list[str]], str]) -> None:
        self._chat, self._context, self._apply = chat, context, apply
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="agentmem-consolidation", daemon=True)
        self._thread.start()

    def submit(self, entry_ids: Sequence[str]) -> None:
        for entry_id in entry_ids:
            self._queue.put(entry_id)

    def wait(self, timeout: float | None = None) -> bool:
        """True once everything submitted so far is decided (False on timeout)."""
        done = threading.Event()

        def join() -> None:
            self._queue.join()
            done.set()

        threading.Thread(target=join, daemon=True).start()
        return done.wait(timeout)

    def stats(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=10)

    def _count(self, name: str) -> None:
        with self._lock:
            self._counts[name] += 1

    def _run(self) -> None:
        while True:
            entry_id = self._queue.get()
            try:
                if entry_id is None:
                    return
                self._decide(entry_id)
            except Exception:  # a failed decision must not stop the worker; the memory simply stays as written
                log.exception("consolidation of entry %s failed", entry_id)
                self._count("llm_errors")
            finally:
                self._queue.task_done()

    def _decide(self, entry_id: str) -> None:
        ctx = self._context(entry_id)
        if ctx is None:
            return
        new_text, existing = ctx
        if not existing or only_asks(new_text):  # a question replaces no fact, whatever a model says (local.py)
            self._count("llm_add")
            return
        decision = ask(self._chat, new_text, [t for _, t in existing])
        if decision is None:
            self._count("llm_invalid")
            return
        self._count("llm_" + self._apply(entry_id, decision, [i for i, _ in existing]))


class StoreActions:
    """What the worker reads from and does to the store (``context`` and ``apply`` of :class:`ConsolidationWorker`).

    Args:
        store: the :class:`~agentmem.entries.store.EntryStore`.
        open_text: the plain text of a row; ``seal``: ``(entry_id, text) -> sealed history text``.
        clock: the facade's strictly increasing clock.
    """

    def __init__(self, store: Any, open_text: Callable[[Any], str], seal: Callable[[str, str], str],
                 clock: Callable[[], float], neighbours: int = 5) -> None:
        self.store, self.open_text, self.seal, self.clock, self.neighbours = store, open_text, seal, clock, neighbours

    def context(self, entry_id: str) -> tuple[str, list[tuple[str, str]]] | None:
        from agentmem.entries.lifecycle import ACTIVE

        rows = self.store.catalog.get([entry_id])
        if not rows or rows[0].status != ACTIVE:
            return None
        row = rows[0]
        vec = self.store.vectors.get(row.user_id, [row.id]).get(row.id)
        if vec is None:
            return None
        found = self.store.vectors.query(vec, user_id=row.user_id, n=self.neighbours + 1, where={"kind": row.kind})
        others = [r for r in self.store.catalog.get([i for i, _ in found if i != row.id])
                  if r.status == ACTIVE and r.created_at < row.created_at]
        return self.open_text(row), [(r.id, self.open_text(r)) for r in others]

    def apply(self, entry_id: str, decision: LlmDecision, existing: list[str]) -> str:
        from agentmem.entries.lifecycle import HistoryEvent

        if decision.event == "ADD" or decision.id is None:
            return "add"
        target_id = existing[decision.id]
        rows = {r.id: r for r in self.store.catalog.get([target_id, entry_id])}
        target, new = rows.get(target_id), rows.get(entry_id)
        if target is None or new is None:
            return "gone"
        now, reason = self.clock(), f"llm: {decision.reason}".strip()
        lifecycle = self.store.lifecycle
        if decision.event == "NOOP":  # nothing new: count it on the existing memory, drop the new row
            text = self.open_text(new)
            if statement_key(text) != statement_key(self.open_text(target)):
                return "noop_kept"  # the texts differ: a write is never discarded on a model's word (issue #37)
            lifecycle.apply_event(HistoryEvent(target_id, target.version or 1, "merge", self.seal(target_id, text),
                                               now, reason))
            self.store.delete([entry_id])
            return "noop"
        op = "supersede" if decision.event == "UPDATE" else "delete"  # the entry becomes SUPERSEDED / DELETED
        event = HistoryEvent(target_id, target.version or 1, op, self.seal(target_id, self.open_text(target)), now,
                             reason, related_id=entry_id)
        lifecycle.apply_event(event)
        return decision.event.lower()


def store_worker(store: Any, chat: Any, *, clock: Callable[[], float]) -> ConsolidationWorker:
    """A worker deciding ``store``'s queued memories with ``chat``: rows' texts opened and history texts sealed by
    the store's own sealer, events stamped by ``clock`` (the facade's strictly increasing clock)."""
    sealer = store.sealer
    actions = StoreActions(store, open_text=lambda r: sealer.open_text(r.id, "text", r.text),
                           seal=lambda i, t: sealer.seal_text(i, "history", t), clock=clock)
    return ConsolidationWorker(chat, actions.context, actions.apply)


__all__ = ["ChoiceProcessor", "ConsolidationWorker", "StoreActions", "LlmDecision", "ask", "choices", "build_messages",
           "local_chat", "parse_decision", "store_worker"]
