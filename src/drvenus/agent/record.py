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
    "exception",
]
TERMINATIONS: tuple[str, ...] = Termination.__args__  # type: ignore[attr-defined]


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
    extra: dict[str, Any] = field(default_factory=dict)

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
