"""The tool interface the agent loop calls."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Tool(Protocol):
    """One protocol tool. ``arguments`` are already normalised by :mod:`drvenus.protocol`.

    ``__call__`` returns the tool-response *body* (the agent wraps it in the tool-response tags).
    It must not raise for ordinary failures (page missing, provider down): it returns the
    protocol's failure text or an ``ERROR: ...`` string the model can read.
    """

    name: str

    async def __call__(self, arguments: Mapping[str, Any]) -> str: ...
