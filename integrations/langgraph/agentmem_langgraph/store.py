"""``AgentMemStore``: LangGraph's ``BaseStore`` backed by an :class:`agentmem.AgentMemory`.

Anything that talks to a LangGraph store (``create_react_agent(store=...)``, LangMem's memory tools,
``runtime.store`` in a node) can keep its memories in agentmem instead, where the memory node and
:class:`~agentmem_langgraph.ChatAgentMem` recall (and mount) them too.

How a store item becomes an agentmem entry
-------------------------------------------
* **user**: ``namespace[user_index]`` (default ``user_index=0``); a namespace too short to have one goes to
  ``shared_user``. LangMem's convention ``("memories", "{user_id}")`` wants ``user_index=1``. The user is
  agentmem's isolation boundary: a search under one user's prefix never reads another user's entries.
* **entry**: ``kind="knowledge"`` (``kind="profile"`` under a namespace whose last label is ``profile_namespace``:
  mounted with every answer by the memory node, ``ChatAgentMem`` and the server); its text is a rendering of the
  value (the ``content``/``text``/``memory`` string when there is one, else ``path: value`` lines; with
  ``index=[...]`` only those fields), which is what semantic search embeds.
* **metadata**: ``lg:namespace``, ``lg:key``, ``lg:created_at``, ``lg:updated_at``, ``lg:ttl`` and each
  top-level value field ``f`` as ``v:f`` (the value is rebuilt from them, and equality filters on them are
  pushed down to agentmem).
* **tags**: ``lg-store``, one ``lg-ns:[...]`` per namespace prefix, ``lg-nsx:[...]`` for the exact namespace
  and ``lg-item:[[...],key]`` for the item, so ``mem.forget(tags=['lg-ns:["u1"]'])`` erases a subtree.
* **namespace registry**: agentmem cannot enumerate users, so each namespace in use is also recorded as one
  entry of the reserved user ``"__langgraph_store__"``; ``list_namespaces`` and searches whose prefix does not
  fix the user read it.
* **TTL** (minutes, LangGraph's convention) becomes the entry's TTL: expired items vanish from every read at
  once. A read with ``refresh_ttl`` re-writes the item with a fresh expiry (agentmem has no in-place touch).

Example:
    >>> from agentmem import AgentMemory
    >>> from agentmem_langgraph import AgentMemStore
    >>> store = AgentMemStore(AgentMemory("./memdata"))                           # doctest: +SKIP
    >>> store.put(("u1", "prefs"), "drink", {"content": "likes green tea"})        # doctest: +SKIP
    >>> store.search(("u1",), query="what does the user drink?")[0].value         # doctest: +SKIP
    {'content': 'likes green tea'}
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from dataclasses import replace
from typing import Any, Literal

from agentmem import AgentMemory, InvalidInputError, MemoryRecord
from agentmem_langgraph._index import StoreIndex
from langgraph.store.base import (
    NOT_PROVIDED,
    BaseStore,
    GetOp,
    IndexConfig,
    Item,
    ListNamespacesOp,
    MatchCondition,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    TTLConfig,
    get_text_at_path,
    tokenize_path,
)

__all__ = ["REGISTRY_USER", "AgentMemStore", "render_value"]

REGISTRY_USER = "__langgraph_store__"
_STORE_TAG = "lg-store"
_VALUE = "v:"  # metadata prefix of value fields
# LangGraph's SQL stores accept these filter keys and refuse others (they become JSON paths); so does this store
_FILTER_KEY = re.compile(r"^[a-zA-Z0-9_.-]+$")
_TEXT_KEYS = ("content", "text", "memory", "value")


def _j(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def _prefix_tag(prefix: Sequence[str]) -> str:
    return f"lg-ns:{_j(list(prefix))}"


def _exact_tag(namespace: Sequence[str]) -> str:
    return f"lg-nsx:{_j(list(namespace))}"


def _item_tag(namespace: Sequence[str], key: str) -> str:
    return f"lg-item:{_j([list(namespace), key])}"


def _registry_tag(namespace: Sequence[str]) -> str:
    return f"lg-registry:{_j(list(namespace))}"


def render_value(value: Mapping[str, Any], index: Sequence[str] | None = None, *, key: str = "") -> str:
    """The text of an item, i.e. what semantic search embeds and the LLM reads.

    Example:
        >>> render_value({"kind": "Memory", "content": {"content": "User likes tea"}})
        'User likes tea'
        >>> render_value({"city": "Lyon", "since": 2021})
        'city: Lyon\\nsince: 2021'
        >>> render_value({"a": "x", "b": {"c": "y"}}, index=["b.c"])
        'y'
    """
    if index:
        texts = [t for path in index for t in get_text_at_path(value, tokenize_path(path))]
        text = "\n".join(t for t in texts if t and t.strip())
        return text or key or _j(value)
    node: Any = value
    # LangMem nests its text ({"content": {"content": "..."}}): follow the well-known keys down to a string
    while isinstance(node, Mapping):
        nxt = next((node[k] for k in _TEXT_KEYS if k in node and isinstance(node[k], (str, Mapping))), None)
        if nxt is None:
            break
        node = nxt
    if isinstance(node, str) and node.strip():
        return node
    lines = [f"{k}: {v if isinstance(v, str) else _j(v)}" for k, v in value.items()]
    text = "\n".join(lines)
    return text if text.strip() else (key or "(empty)")


def _matches(item_value: Any, filter_value: Any) -> bool:
    """LangGraph's filter semantics (as in ``InMemoryStore``): nested dicts, lists, ``$eq``/``$ne``/``$gt``..."""
    if isinstance(filter_value, Mapping):
        if any(str(k).startswith("$") for k in filter_value):
            return all(_apply_operator(item_value, op, want) for op, want in filter_value.items())
        if not isinstance(item_value, Mapping):
            return False
        return all(_matches(item_value.get(k), v) for k, v in filter_value.items())
    if isinstance(filter_value, (list, tuple)):
        return (
            isinstance(item_value, (list, tuple))
            and len(item_value) == len(filter_value)
            and all(_matches(iv, fv) for iv, fv in zip(item_value, filter_value))
        )
    return item_value == filter_value


def _at_path(value: Mapping[str, Any], key: str) -> Any:
    """The value a filter key names: a top-level field, else a dotted path into nested dicts
    (``"user.access-level"`` reads ``value["user"]["access-level"]``, as LangGraph's stores do)."""
    if key in value or "." not in key:
        return value.get(key)
    node: Any = value
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def _check_filter(filter: Mapping[str, Any] | None) -> None:
    """A filter key outside ``[a-zA-Z0-9_.-]`` is an error (as in LangGraph's SQLite and Postgres stores)."""
    for key in filter or {}:
        if not isinstance(key, str) or not _FILTER_KEY.match(key):
            raise InvalidInputError(f"invalid filter key {key!r}: filter keys may contain only letters, digits, "
                                    "underscores, dots (a nested path) and hyphens")


def _apply_operator(value: Any, op: str, want: Any) -> bool:
    if op == "$eq":
        return value == want
    if op == "$ne":
        return value != want
    if op in ("$gt", "$gte", "$lt", "$lte"):
        try:
            a, b = float(value), float(want)
        except (TypeError, ValueError):
            return False  # a missing or non-numeric value simply does not match
        return {"$gt": a > b, "$gte": a >= b, "$lt": a < b, "$lte": a <= b}[op]
    raise ValueError(f"Unsupported operator: {op}")


def _pushdown(filter: Mapping[str, Any] | None) -> tuple[dict[str, Any] | None, bool]:
    """Translate the part of a LangGraph filter that agentmem can evaluate itself; (filters, exact?).

    Only plain equality on a scalar is pushed down: it means the same in both languages. Everything else is
    evaluated here afterwards, and the caller widens its search until it has enough matches.
    """
    if not filter:
        return None, True
    pushed: dict[str, Any] = {}
    exact = True
    for key, cond in filter.items():
        want = cond.get("$eq") if isinstance(cond, Mapping) and set(cond) == {"$eq"} else cond
        if isinstance(want, (str, int, float, bool)) and "." not in key:  # a nested path is evaluated here
            pushed[_VALUE + key] = {"$eq": want}
        else:
            exact = False
    return pushed or None, exact


def _ttl_minutes(ttl: Any) -> float | None:
    """A put's ``ttl`` in minutes. LangGraph types it as minutes; newer releases also take a ``timedelta`` or an
    expiry ``datetime`` and convert it before the op reaches a store, older ones pass it through, so it is
    converted here the same way (a naive datetime is local time).

    Example:
        >>> from datetime import timedelta
        >>> _ttl_minutes(timedelta(minutes=15)), _ttl_minutes(30), _ttl_minutes(None)
        (15.0, 30.0, None)
    """
    if ttl is None:
        return None
    if isinstance(ttl, timedelta):
        return ttl.total_seconds() / 60.0
    if isinstance(ttl, datetime):
        return (ttl - datetime.now(ttl.tzinfo)).total_seconds() / 60.0
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)):
        raise InvalidInputError(f"ttl must be minutes (a number), a timedelta or a datetime, got {type(ttl).__name__}")
    return float(ttl)


def _does_match(cond: MatchCondition, namespace: tuple[str, ...]) -> bool:
    path = cond.path
    if len(namespace) < len(path):
        return False
    pairs = zip(namespace, path) if cond.match_type == "prefix" else zip(reversed(namespace), reversed(path))
    return all(p == "*" or n == p for n, p in pairs)


class AgentMemStore(BaseStore):
    """A LangGraph ``BaseStore`` whose items are agentmem entries (see the module docstring for the mapping).

    Args:
        memory: the :class:`agentmem.AgentMemory` to keep items in (shared with the memory node, if any).
        user_index: which namespace label is the agentmem user (``1`` for LangMem's ``("memories", user)``).
        shared_user: the agentmem user of namespaces shorter than ``user_index + 1``.
        ttl: LangGraph ``TTLConfig`` (``default_ttl`` minutes, ``refresh_on_read``).
        index: LangGraph ``IndexConfig`` (``dims``, ``embed``, ``fields``): embed those fields of each value with
            ``embed`` and score searches by their best cosine similarity, as LangGraph's own stores do. Without
            it, search scores are the cosine similarity of agentmem's own embedder (all-MiniLM-L6-v2) to the
            item's text. Either way, agentmem's hybrid recall finds the candidates.
        profile_namespace: items under a namespace whose last label is this (``"profile"``: ``("u1", "profile")``)
            are agentmem profile memories, mounted with every answer whatever it asks (docs/lifecycle.md); None:
            every item is ``kind="knowledge"``.

    Batches behave like ``InMemoryStore``'s: reads see the store as it was before the batch, then the writes
    apply, the last write to a key winning.

    Example:
        >>> store = AgentMemStore(mem, ttl={"default_ttl": 60})                   # doctest: +SKIP
        >>> agent = create_react_agent(model, tools, store=store)                 # doctest: +SKIP
    """

    supports_ttl: bool = True

    def __init__(
        self,
        memory: AgentMemory,
        *,
        user_index: int = 0,
        shared_user: str = "_langgraph_shared",
        ttl: TTLConfig | None = None,
        index: IndexConfig | None = None,
        profile_namespace: str | None = None,
    ) -> None:
        if user_index < 0:
            raise ValueError("user_index must be >= 0")
        self.memory = memory
        # items under (..., profile_namespace) are the user's standing facts and preferences: agentmem's profile kind
        self.profile_namespace = profile_namespace
        self.user_index = user_index
        self.shared_user = shared_user
        self.ttl_config = ttl
        self._index = StoreIndex(index) if index else None
        self.index_config = self._index.config if self._index else None
        self._lock = threading.RLock()  # agentmem is thread-safe; this keeps a put's write-then-erase atomic here
        self._sweeper: threading.Thread | None = None
        self._stop = threading.Event()

    # --- BaseStore -------------------------------------------------------------------------------
    def put_record(self, namespace: tuple[str, ...], key: str, value: dict[str, Any],
                   index: Literal[False] | list[str] | None = None, *, ttl: float | None | Any = NOT_PROVIDED,
                   ) -> MemoryRecord:
        """:meth:`put`, returning the agentmem record of the write and what it did (``record.event``): ``"ADD"`` for
        a new key, ``"UPDATE"`` for a new version of the item's entry (``record.version``; the old value stays in
        ``memory.history(record.id)``). Keys decide identity in a store, never similarity, so a put is never a
        ``NOOP``. LangGraph's :meth:`put` returns None (its contract); this is the same write.

        Example:
            >>> store.put_record(("u1", "prefs"), "drink", {"content": "likes green tea"}).event   # doctest: +SKIP
            'ADD'
            >>> store.put_record(("u1", "prefs"), "drink", {"content": "likes coffee"}).event      # doctest: +SKIP
            'UPDATE'
        """
        ns = tuple(namespace)
        with self._lock:  # the read before, the write and the read after as one step for this store
            before = self._find(ns, str(key))
            self.put(ns, key, value, index=index, ttl=ttl)
            after = self._find(ns, str(key))
        if after is None:
            raise LookupError(f"the item {ns}/{key} was not stored")
        return replace(after, event="UPDATE" if before is not None else "ADD")

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        ops = list(ops)
        results: list[Result] = []
        puts: dict[tuple[tuple[str, ...], str], PutOp] = {}
        refresh: dict[str, MemoryRecord] = {}
        with self._lock:
            for op in ops:
                if isinstance(op, GetOp):
                    rec = self._find(tuple(op.namespace), op.key)
                    if rec is not None and op.refresh_ttl:
                        refresh[rec.id] = rec
                    results.append(None if rec is None else self._item(rec))
                elif isinstance(op, SearchOp):
                    found = self._search(op)
                    if op.refresh_ttl:
                        refresh.update((rec.id, rec) for rec, _ in found)
                    results.append([self._item(rec, score) for rec, score in found])
                elif isinstance(op, ListNamespacesOp):
                    results.append(self._list_namespaces(op))
                elif isinstance(op, PutOp):
                    puts[(tuple(op.namespace), str(op.key))] = op
                    results.append(None)
                else:
                    raise ValueError(f"Unknown operation type: {type(op)}")
            self._refresh([r for r in refresh.values() if r.metadata.get("lg:ttl")], skip=puts)
            if puts:
                self._apply_puts(list(puts.values()))
        return results

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        # agentmem is synchronous (SQLite, Chroma, torch): run the batch off the event loop
        return await asyncio.get_running_loop().run_in_executor(None, self.batch, list(ops))

    # --- TTL sweeping ----------------------------------------------------------------------------
    def sweep_ttl(self) -> int:
        """Erase every expired entry of the memory now (store items and others); returns how many."""
        return self.memory.sweep()

    def start_ttl_sweeper(self, sweep_interval_minutes: float | None = None) -> None:
        """Sweep in a daemon thread every ``sweep_interval_minutes`` (default: ``ttl_config``'s, else 5)."""
        if self._sweeper is not None:
            return
        minutes = sweep_interval_minutes or (self.ttl_config or {}).get("sweep_interval_minutes") or 5
        self._stop.clear()

        def loop() -> None:
            while not self._stop.wait(minutes * 60):
                self.sweep_ttl()

        self._sweeper = threading.Thread(target=loop, name="agentmem-store-sweeper", daemon=True)
        self._sweeper.start()

    def stop_ttl_sweeper(self, timeout: float | None = None) -> bool:
        """Stop the sweeper thread; True once it has stopped."""
        if self._sweeper is None:
            return True
        self._stop.set()
        self._sweeper.join(timeout)
        stopped = not self._sweeper.is_alive()
        if stopped:
            self._sweeper = None
        return stopped

    # --- mapping ---------------------------------------------------------------------------------
    def _user(self, namespace: Sequence[str]) -> str:
        return namespace[self.user_index] if len(namespace) > self.user_index else self.shared_user

    def _item(self, rec: MemoryRecord, score: float | None | bool = False) -> Item:
        meta = rec.metadata
        value = {k[len(_VALUE):]: v for k, v in meta.items() if k.startswith(_VALUE)}
        created = datetime.fromtimestamp(meta.get("lg:created_at", rec.created_at.timestamp()), tz=timezone.utc)
        updated = datetime.fromtimestamp(meta.get("lg:updated_at", rec.created_at.timestamp()), tz=timezone.utc)
        namespace, key = tuple(meta["lg:namespace"]), meta["lg:key"]
        if score is False:
            return Item(value=value, key=key, namespace=namespace, created_at=created, updated_at=updated)
        return SearchItem(namespace, key, value, created, updated, score=score)  # type: ignore[arg-type]

    def _find(self, namespace: tuple[str, ...], key: str) -> MemoryRecord | None:
        recs = self.memory.list(user_id=self._user(namespace), tags=[_item_tag(namespace, key)])
        return recs[-1] if recs else None  # oldest first: a put interrupted before erasing leaves the newer last

    # --- search ----------------------------------------------------------------------------------
    def _users_under(self, prefix: tuple[str, ...]) -> list[str]:
        if len(prefix) > self.user_index:
            return [prefix[self.user_index]]
        cond = MatchCondition("prefix", prefix)
        return sorted({self._user(ns) for ns in self._registered() if _does_match(cond, ns)})

    def _search(self, op: SearchOp) -> list[tuple[MemoryRecord, float | None]]:
        prefix = tuple(op.namespace_prefix)
        tags = [_prefix_tag(prefix)] if prefix else [_STORE_TAG]
        users = self._users_under(prefix)
        want = max(op.offset, 0) + max(op.limit, 0)
        if want == 0 or not users:
            return []
        _check_filter(op.filter)
        pushed, exact = _pushdown(op.filter)

        def keep(rec: MemoryRecord) -> bool:
            if not op.filter:
                return True
            value = {k[len(_VALUE):]: v for k, v in rec.metadata.items() if k.startswith(_VALUE)}
            return all(_matches(_at_path(value, k), v) for k, v in op.filter.items())

        found: list[tuple[MemoryRecord, float | None]] = []
        if not op.query:
            for user in users:
                found += [(r, None) for r in self.memory.list(user_id=user, tags=tags) if keep(r)]
            found.sort(key=lambda rs: (rs[0].metadata.get("lg:created_at", 0.0), rs[0].id))
        else:
            query_vector = self._index.embed_query(op.query) if self._index else None
            for user in users:
                k = max(4 * want, 50)  # candidates from agentmem's hybrid recall, re-scored by cosine below
                while True:  # widen until the filters evaluated here leave enough, or the scope is exhausted
                    hits = self.memory.recall(op.query, user_id=user, k=k, kinds=["knowledge", "profile"],
                                              tags=tags, filters=pushed)
                    kept = [(h, self._score(h, query_vector)) for h in hits if keep(h)]
                    if exact or len(kept) >= want or len(hits) < k:
                        break
                    k *= 4
                found += kept
                # index=False items are stored without a vector: listed (no score) after the scored ones
                found += [(r, None) for r in self.memory.list(user_id=user, tags=tags)
                          if r.metadata.get("lg:index") is False and keep(r)]
            # LangGraph's order: best cosine first; items put with index=False have no score and come last
            found.sort(key=lambda rs: (rs[1] is None, -(rs[1] or 0.0)))
        found = _dedupe(found)
        return found[op.offset : op.offset + op.limit]

    def _score(self, hit: Any, query_vector: Any) -> float | None:
        """LangGraph's meaning of a search score: cosine similarity of the query to the item (None: not indexed)."""
        if hit.metadata.get("lg:index") is False:
            return None
        if self._index is not None:
            return self._index.score(query_vector, hit.metadata.get("lg:vec"))
        return hit.scores.get("dense")

    # --- namespaces ------------------------------------------------------------------------------
    def _registered(self) -> set[tuple[str, ...]]:
        return {tuple(r.metadata["lg:namespace"]) for r in self.memory.list(user_id=REGISTRY_USER)
                if "lg:namespace" in r.metadata}

    def _list_namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        namespaces = []
        for ns in self._registered():
            if op.match_conditions and not all(_does_match(c, ns) for c in op.match_conditions):
                continue
            # items may have expired since the namespace was registered: list only namespaces that hold one
            if self.memory.list(user_id=self._user(ns), tags=[_exact_tag(ns)], limit=1):
                namespaces.append(ns)
            else:
                self.memory.forget(tags=[_registry_tag(ns)])
        if op.max_depth is not None:
            namespaces = sorted({ns[: op.max_depth] for ns in namespaces})
        else:
            namespaces = sorted(namespaces)
        return namespaces[op.offset : op.offset + op.limit]

    def _register(self, namespaces: Iterable[tuple[str, ...]]) -> None:
        new = [ns for ns in dict.fromkeys(namespaces)
               if not self.memory.list(user_id=REGISTRY_USER, tags=[_registry_tag(ns)], limit=1)]
        if new:
            self.memory.remember_many([
                dict(text="LangGraph store namespace " + "/".join(ns), user_id=REGISTRY_USER, kind="knowledge",
                     tags=[_registry_tag(ns)], metadata={"lg:namespace": list(ns)})
                for ns in new
            ], consolidate=False)

    def _unregister_if_empty(self, namespaces: Iterable[tuple[str, ...]]) -> None:
        for ns in dict.fromkeys(namespaces):
            if not self.memory.list(user_id=self._user(ns), tags=[_exact_tag(ns)], limit=1):
                self.memory.forget(tags=[_registry_tag(ns)])

    # --- writes ----------------------------------------------------------------------------------
    def _entry(self, namespace: tuple[str, ...], key: str, value: Mapping[str, Any], *, index: Any,
               ttl_minutes: float | None, created_at: float, updated_at: float,
               vectors: list[str] | None = None) -> dict[str, Any]:
        if not isinstance(value, Mapping):
            raise ValueError(f"store values must be dicts, got {type(value).__name__}")
        meta = {_VALUE + str(k): v for k, v in value.items()}
        meta.update({"lg:namespace": list(namespace), "lg:key": key, "lg:created_at": created_at,
                     "lg:updated_at": updated_at, "lg:ttl": ttl_minutes,
                     "lg:index": index if isinstance(index, list) else (False if index is False else None)})
        if vectors is not None:
            meta["lg:vec"] = vectors  # the index config's field vectors (StoreIndex)
        fields = index if isinstance(index, list) else (self._index.fields if self._index and index is None else None)
        tags = [_STORE_TAG, *(_prefix_tag(namespace[:i]) for i in range(1, len(namespace) + 1)),
                _exact_tag(namespace), _item_tag(namespace, key)]
        return dict(
            text=render_value(value, None if fields == ["$"] else fields, key=key),
            user_id=self._user(namespace), role=None, tags=tags, metadata=meta,
            kind="profile" if namespace and namespace[-1] == self.profile_namespace else "knowledge",
            ttl=None if ttl_minutes is None else float(ttl_minutes) * 60.0,
            index=index is not False,  # LangGraph's index=False: stored, not embedded
        )

    def _apply_puts(self, ops: list[PutOp]) -> None:
        # a put on an existing key is an agentmem update (a new version, the old value kept in mem.history);
        # new keys are written in one batch; stale duplicates (an interrupted older write) are erased after
        ops = [op._replace(ttl=_ttl_minutes(op.ttl)) for op in ops]  # every ttl checked before anything is written
        old: dict[tuple[tuple[str, ...], str], list[str]] = {}
        entries = []
        now = time.time()
        packed = iter(self._index.pack([(op.value, op.index) for op in ops if op.value is not None])
                      if self._index else [])
        for op in ops:
            ns, key = tuple(op.namespace), str(op.key)
            prev = self.memory.list(user_id=self._user(ns), tags=[_item_tag(ns, key)])
            old[(ns, key)] = [r.id for r in prev]
            if op.value is None:
                continue
            created = prev[-1].metadata.get("lg:created_at", now) if prev else now
            entry = self._entry(ns, key, op.value, index=op.index, ttl_minutes=op.ttl, created_at=created,
                                updated_at=now, vectors=next(packed, None))
            if prev:
                self.memory.update(prev[-1].id, text=entry["text"], tags=entry["tags"], metadata=entry["metadata"],
                                   ttl=entry["ttl"], clear_ttl=entry["ttl"] is None, index=entry["index"],
                                   reason="LangGraph store put")
                old[(ns, key)] = old[(ns, key)][:-1]
            else:
                entries.append(entry)
        written = {tuple(op.namespace) for op in ops if op.value is not None}
        if written:
            self._register(written)
        if entries:
            self.memory.remember_many(entries, consolidate=False)  # keys decide identity here, not similarity
        for ids in old.values():
            for entry_id in ids:
                self.memory.forget(entry_id)
        deleted = {tuple(op.namespace) for op in ops if op.value is None}
        if deleted:
            self._unregister_if_empty(deleted)

    def _refresh(self, recs: list[MemoryRecord], skip: Mapping[tuple[tuple[str, ...], str], Any]) -> None:
        """Restart the TTL clock of items just read, by writing them again (same value, times and TTL)."""
        recs = [r for r in recs if (tuple(r.metadata["lg:namespace"]), r.metadata["lg:key"]) not in skip]
        if not recs:
            return
        entries = []
        for r in recs:
            item = self._item(r)
            index = r.metadata.get("lg:index")
            entries.append(self._entry(item.namespace, item.key, item.value, index=index,
                                       ttl_minutes=r.metadata["lg:ttl"], created_at=r.metadata["lg:created_at"],
                                       updated_at=r.metadata["lg:updated_at"], vectors=r.metadata.get("lg:vec")))
        self.memory.remember_many(entries, consolidate=False)
        for r in recs:
            self.memory.forget(r.id)

    def __repr__(self) -> str:
        return f"AgentMemStore({self.memory.path!s}, user_index={self.user_index})"


def _dedupe(found: list[tuple[MemoryRecord, float | None]]) -> list[tuple[MemoryRecord, float | None]]:
    """One result per (namespace, key): the newest version, at the rank of its best appearance."""
    newest: dict[tuple[Any, Any], MemoryRecord] = {}
    for rec, _ in found:
        ident = (tuple(rec.metadata.get("lg:namespace", ())), rec.metadata.get("lg:key"))
        if ident not in newest or rec.created_at > newest[ident].created_at:
            newest[ident] = rec
    out, seen = [], set()
    for rec, score in found:
        ident = (tuple(rec.metadata.get("lg:namespace", ())), rec.metadata.get("lg:key"))
        if ident not in seen:
            seen.add(ident)
            out.append((newest[ident], score))
    return out
