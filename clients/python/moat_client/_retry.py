"""When a refused or failed call is tried again, and after how long.

One policy for the blocking and the asyncio client (the Go client in
client/retry.go follows the same rules; docs/API.md "Retries"):

- 429 and 503 carrying ``Retry-After`` (seconds, or an HTTP date): the
  server refused the call before acting on it (a quota, a full server,
  shutting down) and said when to come back, so any call is retried,
  POSTs included, after that long.
- 429 and 503 without ``Retry-After``, and a connection that failed or
  dropped: only idempotent calls (GET, HEAD, PUT, DELETE) are retried,
  after an exponential backoff; a POST may have been acted on (a sandbox
  created, a command started) and is never sent twice.
- A refused connection (nothing was sent) is retried for every method.
- A call whose body is a stream (an upload from a file object) is never
  retried: the stream cannot be sent again.

Waits are bounded one by one (``max_delay``) and in total (``max_wait``);
a Retry-After longer than either is not waited for: the error is raised at
once, with ``MoatError.retry_after`` saying when the server expects the
caller back.
"""

import datetime
import email.utils
import time
from dataclasses import dataclass
from typing import Any, Optional

__all__ = ["RetryPolicy", "parse_retry_after", "IDEMPOTENT_METHODS", "RETRY_STATUSES"]

# RFC 9110 section 9.2.2: a second identical request has the effect of one.
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})
# The statuses of docs/API.md that carry Retry-After: quota_exceeded and
# unavailable.
RETRY_STATUSES = frozenset({429, 503})


@dataclass(frozen=True)
class RetryPolicy:
    """How a client retries (see the module's doc for which calls).

    ``attempts`` is the number of tries in all, the first included (1
    disables retrying). ``backoff`` is the first wait when the server gave
    no Retry-After, doubled for each later one. ``max_delay`` bounds one
    wait and ``max_wait`` the sum of a call's waits, in seconds."""

    attempts: int = 4
    backoff: float = 0.25
    max_delay: float = 10.0
    max_wait: float = 30.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("RetryPolicy.attempts %r: want 1 or more (1 disables retrying)" % (self.attempts,))
        for name in ("backoff", "max_delay", "max_wait"):
            v = getattr(self, name)
            if not v >= 0:
                raise ValueError("RetryPolicy.%s %r: want a non-negative number of seconds" % (name, v))

    def delay(self, *, attempt: int, waited: float, method: str, replayable: bool,
              status: Optional[int] = None, retry_after: Optional[float] = None,
              connection_refused: bool = False) -> Optional[float]:
        """The seconds to wait before trying a call again, or None when it
        must not be retried. ``attempt`` counts the tries made (1 after the
        first); ``waited`` is the time already spent waiting for this call.
        ``status`` is the refusal's HTTP status, None for a connection that
        failed; ``retry_after`` its parsed Retry-After."""
        if attempt >= self.attempts or not replayable:
            return None
        idempotent = method.upper() in IDEMPOTENT_METHODS
        if status is not None:
            if status not in RETRY_STATUSES:
                return None
            if retry_after is not None:
                d = retry_after
                if d > self.max_delay or waited + d > self.max_wait:
                    return None  # the server wants longer than the caller allows
                return d
            if not idempotent:
                return None
        elif not (idempotent or connection_refused):
            return None
        d = min(self.backoff * (2 ** (attempt - 1)), self.max_delay)
        if waited + d > self.max_wait:
            return None
        return d


NO_RETRY = RetryPolicy(attempts=1)


def parse_retry_after(headers: Any, now: Optional[float] = None) -> Optional[float]:
    """Retry-After (RFC 9110 section 10.2.3) in seconds from now: a
    non-negative whole number of seconds, or an HTTP date (a date in the
    past is 0). None when the header is absent or malformed. ``headers``
    is anything with ``get(name)``: a dict, http.client's headers."""
    if headers is None:
        return None
    raw = headers.get("Retry-After")
    if not isinstance(raw, str):
        return None
    v = raw.strip()
    if v.isascii() and v.isdigit():
        return float(int(v))
    try:
        when: Optional[datetime.datetime] = email.utils.parsedate_to_datetime(v)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:  # Python before 3.10 answers None for some bad dates
        return None
    if when.tzinfo is None:
        # asctime's form has no zone; every HTTP-date is GMT.
        when = when.replace(tzinfo=datetime.timezone.utc)
    return max(0.0, when.timestamp() - (time.time() if now is None else now))
