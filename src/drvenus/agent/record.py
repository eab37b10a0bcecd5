"""The result record of one question (DR-Venus inference's fields)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Termination = Literal[
    "answered",
    "answered_token_limit",
    "token_limit_no_answer",
    "answered_max_steps",
    "max_steps",
    "timeout",
    "llm_error",
    "tool_error",
    "exception",
    "interrupted",
]
TERMINATIONS: tuple[str, ...] = Termination.__args__  # type: ignore[attr-defined]
# The run itself failed (the model could not be reached, every tool call found the tool server
# down or refusing us, a crash, Ctrl-C): not an outcome of the question. A batch rerun retries
# these; every other termination is a finished item.
FAILED_TERMINATIONS: frozenset[str] = frozenset(
    {"llm_error", "tool_error", "exception", "interrupted"}
)


@dataclass
class ResultRecord:
    question: str
    messages: list[dict[str, str]]
    prediction: str
    termination: Termination
    turns: int = 0
    parse_error_count: int = 0
    tool_call_count: int = 0
    dedup_count: int = 0
    final_token_count: int = 0
    elapsed_seconds: float = 0.0
    error: str | None = None
    usage: dict[str, int] = field(default_factory=dict)  # model calls and prompt/cache tokens
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return self.termination in FAILED_TERMINATIONS

    @property
    def answered(self) -> bool:
        return self.termination.startswith("answered")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if d["error"] is None:
            d.pop("error")
        if not d["extra"]:
            d.pop("extra")
        return d
