"""Python client for the HTTP API of ``moat serve`` (docs/API.md).

Standard library only; Python 3.9 or later. Install it with ``pip install
./clients/python`` (no download: the build backend is in the tree).

    from moat_client import Client

    c = Client("http://127.0.0.1:7070", api_key=os.environ["MOAT_API_KEY"])
    run = c.run(["python3", "-c", "print(6*7)"])
    print(run["result"]["exit_code"], run["result"]["stdout"]["data"])

``moat_client.aio.AsyncClient`` (also ``moat_client.AsyncClient``) is the
same API for asyncio.

A program that failed (non-zero exit, timeout, OOM kill) is not an
exception: it is a result with its ``termination``. ``MoatError`` is a call
the server refused (decoded from its error JSON); ``MoatConnectionError``
is a failure to reach it. Results, sandboxes and execs are the API's JSON
documents as dicts, typed as the TypedDicts of ``moat_client`` (``Result``,
``RunResponse``, ``SandboxInfo``, ``Exec``, ``FileInfo``...) for type
checkers. Refused calls are retried as ``RetryPolicy`` says (429 and 503
honour ``Retry-After``).
"""

from ._client import (Client, Duration, Event, EventStream, File, Files, ManifestArg, MoatConnectionError,
                      MoatError, MoatHeld, Sandbox, __version__, file_name, stream_bytes)
from ._retry import RetryPolicy, parse_retry_after
from .aio import AsyncClient, AsyncEventStream, AsyncSandbox
from ._types import (Approval, ApprovalOutcome, Cell, CellError, CellOutput, Change, CopyOut, CopyOutSkip,
                     Effect, ErrorBody, ErrorDocument, Exec, ExecState, FileChange, FileInfo, Finding,
                     Health, Image, Kernel, NetworkAttempt, NetworkDestination, NetworkSummary,
                     OutputStream, Result, RunResponse, SandboxInfo, SandboxState, SecretUse, StdinAnswer,
                     Termination, TTYSize, Violation)

__all__ = [
    "Client", "Sandbox", "File", "Event", "EventStream", "MoatError", "MoatConnectionError", "MoatHeld",
    "AsyncClient", "AsyncSandbox", "AsyncEventStream",
    "RetryPolicy", "parse_retry_after", "stream_bytes", "file_name", "Duration", "Files", "ManifestArg",
    "Approval", "ApprovalOutcome", "Cell", "CellError", "CellOutput", "Change", "CopyOut", "CopyOutSkip",
    "Effect", "ErrorBody", "ErrorDocument", "Exec", "ExecState", "FileChange", "FileInfo", "Finding",
    "Health", "Image", "Kernel", "NetworkAttempt", "NetworkDestination", "NetworkSummary", "OutputStream",
    "Result", "RunResponse", "SandboxInfo", "SandboxState", "SecretUse", "StdinAnswer", "Termination",
    "TTYSize", "Violation", "__version__",
]
