"""The one HTTP layer of drvenus: what every client and server shares.

- :mod:`~drvenus.net.retry`: the retry policy, :class:`TransientError`, ``Retry-After``, and
  which HTTP statuses are worth another try (:func:`is_retryable_status`);
- :mod:`~drvenus.net.overflow`: whether an error reply says the prompt no longer fits
  (:func:`is_context_overflow`);
- :mod:`~drvenus.net.urls`: :func:`redact_url` for logs and records, and the one base-URL rule
  (:func:`normalize_base_url`, :func:`server_root`);
- :mod:`~drvenus.net.addresses`: the address policy (which IPs a page may be fetched from);
- :mod:`~drvenus.net.client`: :class:`LoopClient`, one ``httpx.AsyncClient`` per event loop;
- :mod:`~drvenus.net.server`: server defaults, the bind rule, JSON bodies, :class:`Busy`,
  uvicorn on a bound socket (fastapi and uvicorn imported only when used);
- :mod:`~drvenus.net.guard`: the access guard in front of both servers.

A low layer: it imports the standard library and httpx only (fastapi, starlette and uvicorn
lazily, inside the server helpers), nothing else of drvenus.
"""

from drvenus.net.client import LoopClient
from drvenus.net.overflow import is_context_overflow
from drvenus.net.retry import (
    DEFAULT_REQUEST_TIMEOUT,
    RETRYABLE_STATUSES,
    Deadline,
    RetryPolicy,
    TransientError,
    is_retryable_status,
    parse_retry_after,
    with_retries,
)
from drvenus.net.urls import normalize_base_url, redact_url, server_root

__all__ = [
    "DEFAULT_REQUEST_TIMEOUT",
    "RETRYABLE_STATUSES",
    "Deadline",
    "LoopClient",
    "RetryPolicy",
    "TransientError",
    "is_context_overflow",
    "is_retryable_status",
    "normalize_base_url",
    "parse_retry_after",
    "redact_url",
    "server_root",
    "with_retries",
]
