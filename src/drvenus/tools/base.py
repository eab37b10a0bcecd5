"""The tool interface the agent loop calls, and the error online providers raise."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from drvenus.net.retry import TransientError


@runtime_checkable
class Tool(Protocol):
    """One protocol tool. ``arguments`` are already normalised by :mod:`drvenus.protocol`.

    ``__call__`` returns the tool-response *body* (the agent wraps it in the tool-response tags).
    It must not raise for ordinary failures (page missing, provider down): it returns the
    protocol's failure text or an ``ERROR: ...`` string the model can read.
    """

    name: str

    async def __call__(self, arguments: Mapping[str, Any]) -> str: ...


class ProviderError(TransientError):
    """A search or page provider failed for one query or URL. ``retryable`` (connection
    error, timeout, a status :func:`drvenus.net.retry.is_retryable_status` accepts) is retried
    under :mod:`drvenus.net.retry`; the tool then falls back to the next provider or answers
    with a readable note. ``refused``: the URL was blocked by the security policy (never
    retried, never sent anywhere)."""

    def __init__(
        self,
        message: str,
        *,
        retryable: bool = False,
        retry_after: float | None = None,
        refused: bool = False,
        unusable: bool = False,
    ) -> None:
        super().__init__(message, retryable=retryable, retry_after=retry_after)
        self.refused = refused
        self.unusable = unusable  # no call can succeed: the tool server is down or refuses us


class UnusableToolText(str):
    """The tool error text of a call that failed because the tools cannot be used at all (the
    tool server unreachable, or refusing the token). It reads as any tool error to the model;
    a run whose every tool call ended so is a failed run (``tool_error``), retried by a
    rerun, not an answered item."""

    unusable = True
