"""``AsyncAgentMemory``: the facade for asyncio code (FastAPI, LangGraph's async graphs) that never blocks the loop.

Not a twin of :class:`~agentmem.AgentMemory`: every method delegates to one wrapped ``AgentMemory``, so validation,
scoping and the write protocol are the same code. What differs is only *where* each call runs:

* **model lane**: one worker thread owns the local LLM (``generate``, ``train``, ``warmup``, session turns, and
  writes that encode KV). torch releases the GIL while it computes, so the event loop keeps running; one thread,
  because the engine serialises model calls anyway and more threads would only queue on its lock.
* **I/O lane**: store calls (``recall``, ``remember`` without encoding, ``list``, ``get``, ``forget``, ...) run in
  a small thread pool. The current backends (SQLite via SQLAlchemy, Chroma) have no async driver, so a thread is
  their async I/O; a recall does not wait behind a generation on the model lane.

Streaming: :meth:`AsyncAgentMemory.stream` yields answer text as the decoder produces it (``on_text`` handed
across threads with ``loop.call_soon_threadsafe``).

Example:
    >>> async def chat() -> tuple[bool, bool]:
    ...     async with AsyncAgentMemory("./memdata") as mem:
    ...         dog = await mem.remember("My dog is called Rex.", user_id="u1")
    ...         out = await mem.generate("What is my dog called?", user_id="u1", max_new_tokens=3)
    ...         pieces = [p async for p in mem.stream("What is my dog called?", user_id="u1", max_new_tokens=3)]
    ...         return out.mounted == [dog.id], len(pieces) > 0
    >>> asyncio.run(chat())
    (True, True)
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from agentmem.memory import AgentMemory

__all__ = ["AsyncAgentMemory", "AsyncSession"]

T = TypeVar("T")
_END = object()


def _lane(lane: str, name: str) -> Callable[..., Any]:
    """An async method running ``AgentMemory.<name>`` on ``lane`` ("model", "io", or "write": the model lane
    when the write encodes KV), with the same signature and docs."""
    target = getattr(AgentMemory, name)

    @functools.wraps(target)
    async def method(self: AsyncAgentMemory, *args: Any, **kwargs: Any) -> Any:
        return await self._run(lane, getattr(self.sync, name), *args, **kwargs)

    method.__doc__ = f"Async :meth:`agentmem.AgentMemory.{name}` (runs on the {lane} lane).\n\n{target.__doc__ or ''}"
    return method


class AsyncAgentMemory:
    """Async facade over one :class:`~agentmem.AgentMemory` (same arguments: path, model, config, key, overrides).

    Pass ``memory=`` to wrap an existing ``AgentMemory`` instead (it is then not closed by :meth:`aclose`).
    ``io_workers`` sizes the I/O lane's thread pool.
    """

    def __init__(self, path: str | Path | None = None, *, memory: AgentMemory | None = None, io_workers: int = 4,
                 **kwargs: Any) -> None:
        if (memory is None) == (path is None):
            from agentmem.errors import InvalidInputError

            raise InvalidInputError("give AsyncAgentMemory either a path or memory=AgentMemory(...)")
        self._owned = memory is None
        self.sync: AgentMemory = memory if memory is not None else AgentMemory(path, **kwargs)  # type: ignore[arg-type]
        self._model = ThreadPoolExecutor(1, thread_name_prefix="agentmem-model")
        self._io = ThreadPoolExecutor(io_workers, thread_name_prefix="agentmem-io")

    async def _run(self, lane: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        if lane == "write":  # a write that encodes KV runs the model
            lane = "model" if self.sync._bank.should_encode(kwargs.get("encode")) else "io"
        pool = self._model if lane == "model" else self._io
        return await loop.run_in_executor(pool, functools.partial(fn, *args, **kwargs))

    # --- lanes ---------------------------------------------------------------------------------------------
    recall = _lane("io", "recall")
    recall_for_mount = _lane("io", "recall_for_mount")
    mount_choice = _lane("io", "mount_choice")
    get = _lane("io", "get")
    list = _lane("io", "list")
    forget = _lane("io", "forget")
    sweep = _lane("io", "sweep")
    verify = _lane("io", "verify")
    stats = _lane("io", "stats")
    generate = _lane("model", "generate")
    train = _lane("model", "train")
    warmup = _lane("model", "warmup")
    load_model = _lane("model", "load_model")
    encode_pending = _lane("model", "encode_pending")

    # writes encode KV when the policy (or encode=) says so; those need the model and queue on its lane
    remember = _lane("write", "remember")
    remember_many = _lane("write", "remember_many")
    embed = _lane("io", "embed")  # the embedder, not the model
    remember_messages = _lane("write", "remember_messages")
    remember_document = _lane("write", "remember_document")

    # --- streaming -------------------------------------------------------------------------------------------
    async def stream(self, question: str, **kwargs: Any) -> AsyncIterator[str]:
        """Answer like :meth:`generate`, yielding text pieces as they are decoded.

        Example:
            >>> async def pieces() -> list[str]:       # mem: an AgentMemory that holds "My dog is called Rex."
            ...     async with AsyncAgentMemory(memory=mem) as amem:
            ...         return [p async for p in amem.stream("What is my dog called?", user_id="u1", max_new_tokens=3)]
            >>> len(asyncio.run(pieces())) > 0
            True
        """
        async for piece in self._stream_call(self.sync.generate, question, kwargs):
            yield piece

    async def _stream_call(self, fn: Callable[..., Any], question: str, kwargs: dict[str, Any]
                           ) -> AsyncIterator[str]:
        loop = asyncio.get_running_loop()
        pieces: asyncio.Queue = asyncio.Queue()

        def on_text(piece: str) -> None:
            loop.call_soon_threadsafe(pieces.put_nowait, piece)

        job = asyncio.ensure_future(self._run("model", fn, question, on_text=on_text, **kwargs))
        job.add_done_callback(lambda _f: loop.call_soon_threadsafe(pieces.put_nowait, _END))
        while (piece := await pieces.get()) is not _END:
            yield piece
        await job  # raises what the call raised

    # --- sessions --------------------------------------------------------------------------------------------
    async def session(self, session_id: str, *, user_id: str) -> AsyncSession:
        """Open (or restore) a conversation; its turns run on the model lane."""
        return AsyncSession(self, await self._run("io", self.sync.session, session_id, user_id=user_id))

    # --- lifecycle -------------------------------------------------------------------------------------------
    async def aclose(self) -> None:
        """Finish queued calls, then close the wrapped store (if this object opened it)."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, functools.partial(self._model.shutdown, wait=True))
        await loop.run_in_executor(None, functools.partial(self._io.shutdown, wait=True))
        if self._owned:
            await loop.run_in_executor(None, self.sync.close)

    async def __aenter__(self) -> AsyncAgentMemory:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class AsyncSession:
    """Async handle of a :class:`~agentmem.sessions.Session`: ``await send(...)``, ``async for ... in stream(...)``."""

    def __init__(self, owner: AsyncAgentMemory, session: Any) -> None:
        self._owner, self.sync = owner, session

    async def send(self, text: str, **kwargs: Any) -> Any:
        """Async ``Session.send`` on the model lane."""
        return await self._owner._run("model", self.sync.send, text, **kwargs)

    async def stream(self, text: str, **kwargs: Any) -> AsyncIterator[str]:
        """Like :meth:`send`, yielding the reply's text as it is decoded."""
        async for piece in self._owner._stream_call(self.sync.send, text, kwargs):
            yield piece
