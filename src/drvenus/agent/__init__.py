"""The research agent loop, its result record and its trace events."""

from drvenus.agent.context import ContextPolicy
from drvenus.agent.events import (
    EventCallback,
    TraceEvent,
    TraceWriter,
    read_trace,
    replay_messages,
)
from drvenus.agent.heavy import HeavyPolicy
from drvenus.agent.loop import (
    AgentConfig,
    ResearchAgent,
    ToolExecutor,
    fit_to_window,
    is_repetitive,
)
from drvenus.agent.record import FAILED_TERMINATIONS, TERMINATIONS, ResultRecord, Termination

__all__ = [
    "FAILED_TERMINATIONS",
    "TERMINATIONS",
    "AgentConfig",
    "ContextPolicy",
    "EventCallback",
    "HeavyPolicy",
    "ResearchAgent",
    "ResultRecord",
    "Termination",
    "ToolExecutor",
    "TraceEvent",
    "TraceWriter",
    "fit_to_window",
    "is_repetitive",
    "read_trace",
    "replay_messages",
]
