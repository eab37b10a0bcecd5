"""The research agent loop, its result record and its trace events."""

from drvenus.agent.events import EventCallback, TraceEvent
from drvenus.agent.loop import AgentConfig, ResearchAgent, ToolExecutor, is_repetitive
from drvenus.agent.record import FAILED_TERMINATIONS, TERMINATIONS, ResultRecord, Termination

__all__ = [
    "FAILED_TERMINATIONS",
    "TERMINATIONS",
    "AgentConfig",
    "EventCallback",
    "ResearchAgent",
    "ResultRecord",
    "Termination",
    "ToolExecutor",
    "TraceEvent",
    "is_repetitive",
]
