"""The asyncio client: ``moat_client``'s API, awaitable.

    from moat_client.aio import AsyncClient

    async with AsyncClient("http://127.0.0.1:7070", api_key=key) as c:
        run = await c.run(["python3", "-c", "print(6*7)"])
        async with await c.create_sandbox(ttl="10m") as sb:
            ex = await sb.start(["sh", "-c", "echo hi; sleep 1; echo bye"])
            async for ev in sb.events(ex["id"]):
                print(ev.type, ev.data)

Each call runs the blocking client's request (urllib, http.client) in a
thread of the client's own pool (``max_workers``, default 32): every call
in progress and every event stream being read holds one thread. That
keeps one implementation of the protocol (Expect: 100-continue uploads,
the SSE parser, resuming with Last-Event-ID, error decoding) for both
clients, with the standard library only (docs/RATIONALE.md says why not
an HTTP/1.1 client of its own on asyncio streams).

Cancelling a task that awaits a call ends its wait at once; a retry that
was pending is not sent; a request already on the wire still reaches the
server (as with any HTTP client), and its answer is dropped. Cancelling
a task reading events closes the stream's connection.
"""

import asyncio
import contextvars
import functools
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any, BinaryIO, Callable, Dict, Iterable, List, Mapping, Optional, TypeVar, Union

from ._client import (_CANCEL, Client, Duration, Event, EventStream, Files, ManifestArg, MoatConnectionError,
                      MoatError, Sandbox, TTYArg, __version__)
from ._retry import RetryPolicy
from ._types import (Approval, ApprovalOutcome, Cell, Exec, FileInfo, Health, RunResponse, SandboxInfo)

__all__ = ["AsyncClient", "AsyncSandbox", "AsyncEventStream"]

T = TypeVar("T")


class AsyncClient:
    """``moat_client.Client`` for asyncio: the same arguments (plus
    ``max_workers``, the size of its thread pool), the same methods as
    coroutines, the same errors. Close it with ``aclose()`` or use it with
    ``async with``; ``sync`` is the blocking Client it drives."""

    def __init__(self, base_url: str, api_key: Optional[str] = None, *, timeout: Optional[float] = None,
                 reconnect_attempts: int = 5, reconnect_delay: float = 0.25,
                 user_agent: str = "moat-python-client/" + __version__,
                 retry: Optional[RetryPolicy] = None, max_workers: int = 32):
        if max_workers < 1:
            raise ValueError("max_workers %r: want 1 or more threads" % (max_workers,))
        self.sync = Client(base_url, api_key, timeout=timeout, reconnect_attempts=reconnect_attempts,
                           reconnect_delay=reconnect_delay, user_agent=user_agent, retry=retry)
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="moat-client")

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop the thread pool: calls not started are dropped, those in
        progress end in their threads (an open event stream's by
        closing it). Later calls raise RuntimeError."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def _call(self, fn: Callable[[], T]) -> T:
        """Runs fn (one blocking call) in the pool. Cancelling the awaiting
        task sets the call's cancel event: a retry it waits for is not
        sent (_client._pause)."""
        cancel = threading.Event()
        token = _CANCEL.set(cancel)
        try:
            ctx = contextvars.copy_context()
        finally:
            _CANCEL.reset(token)

        def job() -> T:
            return ctx.run(fn)

        fut = asyncio.get_running_loop().run_in_executor(self._pool, job)
        try:
            return await fut
        except asyncio.CancelledError:
            cancel.set()
            raise

    # The API: each method is the blocking Client's (see its docs).

    async def health(self) -> Health:
        return await self._call(self.sync.health)

    async def run(self, argv: Optional[Iterable[str]] = None, *, code: Optional[str] = None,
                  language: Optional[str] = None, manifest: Optional[ManifestArg] = None,
                  files: Optional[Files] = None, stdin: Union[bytes, str, None] = None) -> RunResponse:
        """A one-shot run (Client.run)."""
        argv = list(argv) if argv is not None else None
        return await self._call(functools.partial(self.sync.run, argv, code=code, language=language,
                                                  manifest=manifest, files=files, stdin=stdin))

    async def list_approvals(self) -> List[Approval]:
        return await self._call(self.sync.list_approvals)

    async def decide_approval(self, approval_id: str, approve: bool, reason: str = "") -> ApprovalOutcome:
        return await self._call(functools.partial(self.sync.decide_approval, approval_id, approve, reason))

    async def get_run(self, run_id: str) -> RunResponse:
        return await self._call(functools.partial(self.sync.get_run, run_id))

    async def create_sandbox(self, manifest: Optional[ManifestArg] = None, *, ttl: Optional[Duration] = None,
                             files: Optional[Files] = None,
                             metadata: Optional[Mapping[str, str]] = None) -> "AsyncSandbox":
        """A sandbox that lives across commands (Client.create_sandbox);
        ``async with`` deletes it."""
        sb = await self._call(functools.partial(self.sync.create_sandbox, manifest, ttl=ttl, files=files,
                                                metadata=metadata))
        return AsyncSandbox(self, sb)

    async def list_sandboxes(self) -> List["AsyncSandbox"]:
        return [AsyncSandbox(self, sb) for sb in await self._call(self.sync.list_sandboxes)]

    async def get_sandbox(self, sandbox_id: str) -> "AsyncSandbox":
        return AsyncSandbox(self, await self._call(functools.partial(self.sync.get_sandbox, sandbox_id)))

    def sandbox(self, sandbox_id: str) -> "AsyncSandbox":
        """A handle to sandbox_id without asking the server."""
        return AsyncSandbox(self, self.sync.sandbox(sandbox_id))

    async def delete_sandbox(self, sandbox_id: str) -> SandboxInfo:
        return await self._call(functools.partial(self.sync.delete_sandbox, sandbox_id))

    async def set_timeout(self, sandbox_id: str, ttl: Duration) -> SandboxInfo:
        return await self._call(functools.partial(self.sync.set_timeout, sandbox_id, ttl))


class AsyncSandbox:
    """``moat_client.Sandbox`` for asyncio; ``async with`` deletes it.
    There is no ``open``: ``download`` reads a file whole."""

    def __init__(self, client: AsyncClient, sandbox: Sandbox):
        self.client = client
        self.sync = sandbox

    @property
    def id(self) -> str:
        return self.sync.id

    @property
    def info(self) -> SandboxInfo:
        return self.sync.info

    def __repr__(self) -> str:
        return "AsyncSandbox(%r, state=%r)" % (self.id, self.info.get("state"))

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            await self.delete()
        except MoatError as e:
            if e.status != 404:
                raise

    async def delete(self) -> SandboxInfo:
        return await self.client._call(self.sync.delete)

    async def set_timeout(self, ttl: Duration) -> SandboxInfo:
        return await self.client._call(functools.partial(self.sync.set_timeout, ttl))

    async def refresh(self) -> SandboxInfo:
        return await self.client._call(self.sync.refresh)

    async def exec(self, argv: Optional[Iterable[str]] = None, *, code: Optional[str] = None,
                   language: Optional[str] = None, env: Optional[Mapping[str, str]] = None,
                   dir: Optional[str] = None, timeout: Optional[Duration] = None,
                   stdin: Union[bytes, str, None] = None, stdin_open: bool = False) -> Exec:
        """Run a command and wait for it to end (Sandbox.exec)."""
        argv = list(argv) if argv is not None else None
        return await self.client._call(functools.partial(
            self.sync.exec, argv, code=code, language=language, env=env, dir=dir, timeout=timeout,
            stdin=stdin, stdin_open=stdin_open))

    async def start(self, argv: Optional[Iterable[str]] = None, *, code: Optional[str] = None,
                    language: Optional[str] = None, env: Optional[Mapping[str, str]] = None,
                    dir: Optional[str] = None, timeout: Optional[Duration] = None,
                    stdin: Union[bytes, str, None] = None, stdin_open: bool = False,
                    tty: Optional[TTYArg] = None) -> Exec:
        """Start a command and return at once (Sandbox.start)."""
        argv = list(argv) if argv is not None else None
        return await self.client._call(functools.partial(
            self.sync.start, argv, code=code, language=language, env=env, dir=dir, timeout=timeout,
            stdin=stdin, stdin_open=stdin_open, tty=tty))

    async def get_exec(self, exec_id: str) -> Exec:
        return await self.client._call(functools.partial(self.sync.get_exec, exec_id))

    async def list_execs(self) -> List[Exec]:
        return await self.client._call(self.sync.list_execs)

    def events(self, exec_id: str, after: int = 0) -> "AsyncEventStream":
        """The command's events (Sandbox.events): ``async for`` them; the
        connection opens with the first."""
        if after < 0:
            raise ValueError("after must be 0 or more")
        return AsyncEventStream(self.client, functools.partial(self.sync.events, exec_id, after), after)

    async def stream(self, exec_id: str, stdout: Optional[IO[bytes]] = None,
                     stderr: Optional[IO[bytes]] = None) -> Exec:
        """Copy the command's output to stdout and stderr (binary file
        objects; None drops it) as it comes; returns the finished Exec."""
        async with self.events(exec_id) as st:
            async for ev in st:
                if ev.type == "exit" and ev.exec is not None:
                    return ev.exec
                w = stdout if ev.type == "stdout" else stderr if ev.type == "stderr" else None
                if w is not None and ev.data:
                    w.write(ev.data)
                    w.flush()
        raise MoatConnectionError("the event stream of exec %s ended before its exit" % exec_id)

    async def write_stdin(self, exec_id: str, data: Union[bytes, str]) -> None:
        await self.client._call(functools.partial(self.sync.write_stdin, exec_id, data))

    async def close_stdin(self, exec_id: str) -> None:
        await self.client._call(functools.partial(self.sync.close_stdin, exec_id))

    async def signal(self, exec_id: str, signal: Union[str, int]) -> None:
        await self.client._call(functools.partial(self.sync.signal, exec_id, signal))

    async def resize(self, exec_id: str, rows: int, cols: int) -> Exec:
        return await self.client._call(functools.partial(self.sync.resize, exec_id, rows, cols))

    async def run_cell(self, code: str, *, context: Optional[str] = None, language: Optional[str] = None,
                       timeout: Optional[Duration] = None) -> Cell:
        return await self.client._call(functools.partial(self.sync.run_cell, code, context=context,
                                                         language=language, timeout=timeout))

    async def interrupt_kernel(self, context: Optional[str] = None) -> Dict[str, Any]:
        return await self.client._call(functools.partial(self.sync.interrupt_kernel, context))

    async def restart_kernel(self, context: Optional[str] = None) -> Dict[str, Any]:
        return await self.client._call(functools.partial(self.sync.restart_kernel, context))

    async def upload(self, path: str, data: Union[bytes, str, BinaryIO], mode: Union[int, str, None] = None) -> None:
        """Write data to path (Sandbox.upload); a file object is read in
        the pool's thread."""
        await self.client._call(functools.partial(self.sync.upload, path, data, mode))

    async def download(self, path: str) -> bytes:
        return await self.client._call(functools.partial(self.sync.download, path))

    async def list(self, dir: str = ".") -> List[FileInfo]:
        return await self.client._call(functools.partial(self.sync.list, dir))

    async def remove(self, path: str) -> None:
        await self.client._call(functools.partial(self.sync.remove, path))


def _next_event(st: EventStream) -> Optional[Event]:
    """The stream's next event, None at its end (StopIteration cannot
    cross a Future)."""
    return next(st, None)


def _open_stream(make: Callable[[], EventStream]) -> EventStream:
    st = make()
    cancel = _CANCEL.get()
    if cancel is not None and cancel.is_set():
        st.close()  # the task that asked for it is gone
    return st


class AsyncEventStream:
    """Iterates a command's events (``async for``), resuming after a
    dropped connection as EventStream does. ``last_id`` is where a later
    events() call would resume. Close it with ``aclose()`` or ``async
    with``; cancelling the task that reads it closes it too."""

    def __init__(self, client: AsyncClient, make: Callable[[], EventStream], after: int):
        self._client = client
        self._make = make
        self._st: Optional[EventStream] = None
        self._after = after
        self._closed = False

    @property
    def last_id(self) -> int:
        return self._st.last_id if self._st is not None else self._after

    def __aiter__(self) -> "AsyncEventStream":
        return self

    async def __aenter__(self) -> "AsyncEventStream":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """End the stream and its connection."""
        self._closed = True
        if self._st is not None:
            self._st.close()

    async def __anext__(self) -> Event:
        if self._closed:
            raise StopAsyncIteration
        try:
            if self._st is None:
                self._st = await self._client._call(functools.partial(_open_stream, self._make))
            ev = await self._client._call(functools.partial(_next_event, self._st))
        except asyncio.CancelledError:
            # Wakes the thread blocked reading the stream (EventStream.close
            # shuts the socket down).
            await self.aclose()
            raise
        if ev is None:
            self._closed = True
            raise StopAsyncIteration
        return ev
