"""The one retry policy: bounded attempts, exponential backoff with jitter, and a deadline.

Clients (model servers, search and page providers) make one attempt per call and raise a
:class:`TransientError` (:class:`~drvenus.llm.base.LLMError` for models); whoever owns the call
decides how often to try again, with this policy: the agent loop for its steps, the judge and
the page extractor for theirs, each web provider for its requests. Nothing retries underneath
anything else, so a dead server costs ``attempts`` requests, not attempts squared.

Which HTTP answers are worth another try is decided here once, for every client
(:func:`is_retryable_status`).
"""

from __future__ import annotations

import asyncio
import copy
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Self, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")


# 5xx answers that say the server cannot ever do this request, so trying again only wastes time:
# 501 Not Implemented, 505 HTTP Version Not Supported, 506 Variant Also Negotiates, 508 Loop
# Detected, 510 Not Extended, 511 Network Authentication Required (a captive portal: a person
# has to log in first).
PERMANENT_SERVER_ERRORS = frozenset({501, 505, 506, 508, 510, 511})
#: Seconds one model request (a whole generation) may take, unless the settings say otherwise.
DEFAULT_REQUEST_TIMEOUT = 600.0
#: The named retryable statuses (any other 5xx not in PERMANENT_SERVER_ERRORS is retryable too).
RETRYABLE_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})


def is_retryable_status(status: int) -> bool:
    """Whether an HTTP error ``status`` is transient, so the same request may succeed later.

    The one rule of every drvenus client (model servers, search and page providers, the tool
    server, judges, RL engines):

    - 408 Request Timeout: the server gave up waiting for the request (a slow or broken link);
    - 425 Too Early: the server will not risk replaying early (TLS 0-RTT) data; a new request
      is fine;
    - 429 Too Many Requests: a rate limit or a full queue; its ``Retry-After`` says how long to
      wait;
    - 5xx: the server (or a proxy or gateway in front of it: 502, 503, 504, Cloudflare's 52x)
      failed, is overloaded or restarting; except the ones in
      :data:`PERMANENT_SERVER_ERRORS`, which answer the same every time.

    Every other status (400, 401, 403, 404, 413, 422, ...) says the request itself is wrong and
    is not retried.
    """
    if status in RETRYABLE_STATUSES:
        return True
    return 500 <= status < 600 and status not in PERMANENT_SERVER_ERRORS


def parse_retry_after(value: str | None) -> float | None:
    """Seconds to wait from an HTTP ``Retry-After`` header (seconds or an HTTP date), or None."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


class TransientError(RuntimeError):
    """A call to an outside service failed. ``retryable``: transient (connection, timeout, an
    HTTP status that :func:`is_retryable_status` accepts), worth another try; ``retry_after``:
    the server's requested wait, seconds."""

    def __init__(
        self, message: str, *, retryable: bool = False, retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.retry_after = retry_after

    def after_attempts(self, attempts: int) -> Self:
        """The same error, its message saying how many attempts were made."""
        again = copy.copy(self)
        again.args = (f"{self} (after {attempts} attempts)", *self.args[1:])
        return again


@dataclass(frozen=True)
class RetryPolicy:
    """``attempts`` tries in all; before try k+1 wait ``base * 2**k`` seconds (at most ``cap``),
    scaled by a random factor in [0.5, 1] so clients that failed together do not retry together.
    A server's ``Retry-After`` raises the wait (still capped)."""

    attempts: int = 3
    base: float = 0.5
    cap: float = 8.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("a retry policy needs at least one attempt")

    def delay(self, failures: int, retry_after: float | None = None) -> float:
        """Seconds to wait after the ``failures``-th failed attempt (1-based)."""
        if self.base <= 0:
            return 0.0
        wait = min(self.cap, self.base * 2 ** (failures - 1)) * (0.5 + random.random() / 2)
        if retry_after is not None:
            wait = max(wait, retry_after)
        return min(self.cap, wait)


class Deadline:
    """A point in (monotonic) time; ``None`` seconds means no deadline."""

    def __init__(self, seconds: float | None) -> None:
        self.at = None if seconds is None else time.monotonic() + seconds

    def remaining(self) -> float | None:
        return None if self.at is None else max(0.0, self.at - time.monotonic())

    def clamp(self, seconds: float | None) -> float | None:
        """``seconds`` shortened to what is left (None: no limit at all)."""
        left = self.remaining()
        if left is None:
            return seconds
        return left if seconds is None else min(seconds, left)


async def with_retries(
    call: Callable[[float | None], Awaitable[T]],
    policy: RetryPolicy,
    *,
    deadline: Deadline | None = None,
    timeout: float | None = None,
    what: str = "request",
) -> T:
    """Run ``call(timeout)`` until it succeeds, up to ``policy.attempts`` times.

    Only transient errors (``retryable``) are retried; the last error is raised.
    Each attempt gets ``timeout`` seconds, cut to what the ``deadline`` leaves, and no attempt
    starts once the deadline has passed.
    """
    deadline = deadline or Deadline(None)
    for attempt in range(1, policy.attempts + 1):
        try:
            return await call(deadline.clamp(timeout))
        except TransientError as exc:
            last = attempt == policy.attempts or not exc.retryable
            wait = 0.0 if last else policy.delay(attempt, exc.retry_after)
            left = deadline.remaining()
            if last or (left is not None and left <= wait):
                if attempt == 1:
                    raise
                raise exc.after_attempts(attempt) from None
            log.log(
                logging.WARNING if attempt == 1 else logging.DEBUG,
                "%s failed (%s); retry %d/%d in %.1fs",
                what, exc, attempt, policy.attempts - 1, wait,
            )
            await asyncio.sleep(wait)
    raise AssertionError("unreachable")


__all__ = [
    "DEFAULT_REQUEST_TIMEOUT",
    "PERMANENT_SERVER_ERRORS",
    "RETRYABLE_STATUSES",
    "Deadline",
    "RetryPolicy",
    "TransientError",
    "is_retryable_status",
    "parse_retry_after",
    "with_retries",
]
