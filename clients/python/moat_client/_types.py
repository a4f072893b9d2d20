"""The API's JSON documents as TypedDicts (docs/API.md, docs/RESULT.md,
server/openapi.yaml).

They are plain dicts at run time, so ``run["result"]["exit_code"]`` keeps
working and a field a newer server adds is simply there; a type checker
(mypy, pyright) checks the keys and the types of what is read. Every
class is ``total=False``: a field the server omits (``omitempty``) or one
an older server does not know is absent, not None, so read the optional
ones with ``.get``.
"""

from typing import Dict, List, Literal, TypedDict

__all__ = [
    "Termination", "Change", "ExecState", "SandboxState",
    "Health", "Image", "OutputStream", "FileChange", "NetworkAttempt", "NetworkDestination",
    "NetworkSummary", "Violation", "Finding", "SecretUse", "CopyOutSkip", "CopyOut", "Result",
    "Effect", "Approval", "RunResponse", "ApprovalOutcome", "SandboxInfo", "TTYSize", "Exec",
    "FileInfo", "StdinAnswer", "CellError", "CellOutput", "Cell", "Kernel", "ErrorBody",
    "ErrorDocument",
]

# How a program ended: one closed taxonomy for every tier (docs/RESULT.md).
Termination = Literal["exited", "signaled", "timeout", "cpu-time", "oom", "pids", "output-limit",
                      "disk-limit", "policy", "infra-error"]
# How a workspace file changed during a run.
Change = Literal["added", "modified", "deleted"]
# An Exec's state: "running", then "exited" (whatever ended it) or "failed".
ExecState = Literal["running", "exited", "failed"]
# A sandbox's state (the E2B API adds pausing, paused, resuming).
SandboxState = Literal["running", "deleting", "deleted", "pausing", "paused", "resuming"]


class Health(TypedDict, total=False):
    """GET /v1/health."""
    status: str
    version: str


class Image(TypedDict, total=False):
    """The image a run used, by name and content digest."""
    name: str
    digest: str
    source: str
    source_digest: str


class OutputStream(TypedDict, total=False):
    """A result's stdout or stderr: ``data`` is text when ``encoding`` is
    "utf-8", base64 when "base64" (stream_bytes decodes both)."""
    data: str
    encoding: Literal["utf-8", "base64"]
    bytes: int
    truncated: bool


class FileChange(TypedDict, total=False):
    """One entry of a result's workspace diff. ``path`` (and ``target``)
    are base64 when ``encoding`` is "base64" (file_name decodes them)."""
    path: str
    change: Change
    type: str
    size: int
    sha256: str
    mode: str
    target: str
    encoding: str


class NetworkAttempt(TypedDict, total=False):
    """One connection or lookup the sandbox tried, allowed or not."""
    time: str
    kind: str
    method: str
    host: str
    port: int
    address: str
    allowed: bool
    reason: str
    bytes_out: int
    bytes_in: int
    package: str
    resembles: str


class NetworkDestination(TypedDict, total=False):
    host: str
    port: int
    reason: str
    count: int


class NetworkSummary(TypedDict, total=False):
    """Totals over every attempt, including those left out of ``network``."""
    attempts: int
    allowed: int
    denied: int
    bytes_out: int
    bytes_in: int
    lookups: int
    lookup_bytes: int
    omitted: int
    omitted_reasons: Dict[str, int]
    omitted_destinations: List[NetworkDestination]
    omitted_elsewhere: int


class Violation(TypedDict, total=False):
    """Something the sandbox tried that policy refused or a limit stopped."""
    kind: str
    detail: str
    limit: str


class Finding(TypedDict, total=False):
    """Something found in the output (a secret's value, for instance)."""
    kind: str
    where: str
    offset: int
    length: int
    preview: str


class SecretUse(TypedDict, total=False):
    name: str
    host: str
    requests: int


class CopyOutSkip(TypedDict, total=False):
    path: str
    reason: str
    encoding: str


class CopyOut(TypedDict, total=False):
    dir: str
    files: int
    bytes: int
    skipped: List[CopyOutSkip]


class Result(TypedDict, total=False):
    """What a run or command did (docs/RESULT.md): how it ended
    (``termination``, ``exit_code``), its output, usage, workspace diff,
    network log and violations. A program that failed is a Result, not an
    exception."""
    schema: int
    id: str
    tier: str
    image: Image
    manifest_digest: str
    justifications: Dict[str, str]
    command: List[str]
    pooled: bool
    termination: Termination
    exit_code: int
    signal: int
    signal_name: str
    timed_out: bool
    oom_killed: bool
    started_at: str
    duration_ms: float
    cpu_ms: float
    peak_memory_bytes: int
    stdout: OutputStream
    stderr: OutputStream
    files: List[FileChange]
    network: List[NetworkAttempt]
    network_summary: NetworkSummary
    secrets_used: List[SecretUse]
    violations: List[Violation]
    findings: List[Finding]
    withheld: bool
    incident: str
    degradations: List[str]
    copy_out: CopyOut
    error: str
    runtime: str


class Effect(TypedDict, total=False):
    """One effect of a held command that the policy wants a person to see."""
    kind: str
    detail: str
    commands: List[int]
    hosts: List[str]
    paths: List[str]


class Approval(TypedDict, total=False):
    """A run or command held for a person's approval."""
    id: str
    state: str
    sandbox_id: str
    argv: List[str]
    effects: List[Effect]
    reasons: List[str]
    created_at: str
    expires_at: str


class RunResponse(TypedDict, total=False):
    """POST /v1/runs and GET /v1/runs/{id}: ``result``, or ``approval``
    for a run held for approval."""
    id: str
    pooled: bool
    result: Result
    approval: Approval


class TTYSize(TypedDict):
    rows: int
    cols: int


class Exec(TypedDict, total=False):
    """A command in a sandbox; ``result`` once ``state`` is not running."""
    id: str
    sandbox_id: str
    state: ExecState
    argv: List[str]
    stdin_open: bool
    pid: int
    tty: TTYSize
    started_at: str
    ended_at: str
    result: Result
    interrupted: str


class ApprovalOutcome(TypedDict, total=False):
    """POST /v1/approvals/{id}: the decided approval, and the held run
    (ended) or command (running) when approved."""
    approval: Approval
    run: RunResponse
    exec: Exec


class SandboxInfo(TypedDict, total=False):
    """The Sandbox document (``Sandbox.info``)."""
    id: str
    state: SandboxState
    tier: str
    image: Image
    manifest_digest: str
    created_at: str
    expires_at: str
    pooled: bool
    metadata: Dict[str, str]
    execs: int
    auto_pause: bool


class FileInfo(TypedDict, total=False):
    """One entry of a directory listing."""
    name: str
    path: str
    type: Literal["file", "dir", "symlink", "other"]
    size: int
    mode: str
    modified: str
    target: str
    metadata: Dict[str, str]


class StdinAnswer(TypedDict, total=False):
    written: int
    closed: bool


class CellError(TypedDict, total=False):
    name: str
    value: str
    traceback: List[str]


class CellOutput(TypedDict, total=False):
    """One output of a cell, in order: "stdout"/"stderr" text, a "display"
    MIME bundle in ``data``, or an "error"."""
    type: str
    text: str
    data: Dict[str, str]
    error: CellError


class Cell(TypedDict, total=False):
    """POST /v1/sandboxes/{id}/cells: a cell of the stateful kernel."""
    id: str
    sandbox_id: str
    context: str
    language: str
    status: str
    outputs: List[CellOutput]
    result: Dict[str, str]
    error: CellError
    truncated: bool
    kernel_started: bool
    duration_ms: float


class Kernel(TypedDict, total=False):
    sandbox_id: str
    context: str
    state: str
    ipython: bool
    python: str


class ErrorBody(TypedDict, total=False):
    code: str
    message: str
    field: str
    request_id: str


class ErrorDocument(TypedDict, total=False):
    """Every refusal's body: ``{"error": {...}}`` (MoatError decodes it)."""
    error: ErrorBody
