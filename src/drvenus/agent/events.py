"""Structured trace events: one stream consumed by the CLI, the web demo and evaluation."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

EventType = Literal[
    "step_started", "model_output", "tool_call", "tool_result", "answer", "error", "finished"
]


@dataclass(frozen=True)
class TraceEvent:
    """One thing that happened during a run. ``data`` is JSON-serialisable."""

    type: EventType
    step: int
    data: dict[str, Any] = field(default_factory=dict)
    time: float = field(default_factory=time.time)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


EventCallback = Callable[[TraceEvent], Awaitable[None] | None]
