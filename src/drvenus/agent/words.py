"""How a run's end reads to people: the termination in words, and what a run that ended
without an answer says (the reason, and the model's last thoughts without protocol markup).

One wording for every face: ``ask``'s terminal and pipe, ``/v1``, MCP and the batch summary
(the web page's script holds the same words)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from drvenus import protocol

TERMINATION_WORDS: dict[str, str] = {
    "answered": "Answered",
    "answered_token_limit": "Answered when the token budget ran out",
    "answered_max_steps": "Answered at the step limit",
    "max_steps": "Step limit reached without an answer",
    "token_limit_no_answer": "Token budget ran out without an answer",
    "timeout": "Time limit reached",
    "llm_error": "The model could not be reached",
    "tool_error": "The tools could not be used (tool server down or refusing the token)",
    "exception": "The run failed with an error",
    "interrupted": "Stopped",
}
# what a run that ended without an answer says first (else its termination in words)
NO_ANSWER_WORDS: dict[str, str] = {
    "interrupted": "Stopped before the model gave an answer.",
}
FORCED_NOTE = (
    "Forced answer: the step or token budget ran out before the model answered on its own, "
    "so it was asked for its best answer from what it had found. Check the sources."
)
FORCED_TERMINATIONS = frozenset({"answered_max_steps", "answered_token_limit"})
# what an ``error`` event's kind means (a retry, or a step that failed for good)
ERROR_WORDS: dict[str, str] = {
    "repetition": "the model repeated itself",
    "parse_error": "the model's turn could not be read",
    "duplicate_tool_call": "a tool call already made",
    "empty_output": "the model returned nothing",
    "llm_error": "the model server failed",
    "tool_error": "the tools failed",
    "unreadable_turns": "too many unreadable turns in a row",
    "compaction_failed": "the model could not write its report",
    "synthesis_failed": "the synthesis failed; the runs' answers are voted on instead",
    "interrupted": "stopped",
    "exception": "the run failed with an error",
}
NO_ANSWER = "No answer found"  # the record's prediction when the model wrote nothing
_TAG = re.compile(r"</?[A-Za-z_][A-Za-z0-9_]*>")
MAX_THOUGHTS = 1500


def termination_words(termination: Any) -> str:
    """``answered_max_steps`` -> "Answered at the step limit" (an unknown name, spaced)."""
    name = str(termination or "")
    return TERMINATION_WORDS.get(name, name.replace("_", " "))


def error_words(kind: Any) -> str:
    """``synthesis_failed`` -> "the synthesis failed; ..." (an unknown kind, spaced)."""
    name = str(kind or "error")
    return ERROR_WORDS.get(name, name.replace("_", " "))


def is_forced(record: Mapping[str, Any]) -> bool:
    """The budget ran out and the model was asked for its best answer."""
    return str(record.get("termination", "")) in FORCED_TERMINATIONS


def last_thoughts(prediction: Any) -> str:
    """The model's last output as plain text: the thinking of its last turn, with no
    ``<think>``/``<tool_call>`` markup (empty when there is none)."""
    text = str(prediction or "").strip()
    if not text or text == NO_ANSWER:
        return ""
    thinking = protocol.parse_turn(protocol.repair_turn(text)).thinking
    plain = _TAG.sub("", thinking).strip()
    return plain if len(plain) <= MAX_THOUGHTS else plain[: MAX_THOUGHTS - 1] + "…"


def no_answer_reason(record: Mapping[str, Any]) -> str:
    """Why a run has no answer, in a sentence: "Stopped before the model gave an answer."."""
    termination = str(record.get("termination", ""))
    if termination in NO_ANSWER_WORDS:
        return NO_ANSWER_WORDS[termination]
    words = termination_words(termination)
    error = record.get("error")
    if error and error != termination and not str(error).startswith("time limit"):
        error = str(error).strip()
        return f"{words}: {error}" + ("" if error[-1:] in ".?!" else ".")
    return f"{words}."


def _last_turn(record: Mapping[str, Any]) -> Any:
    """The text of the record's last assistant turn (else its prediction)."""
    messages = record.get("messages")
    for message in reversed(messages if isinstance(messages, list) else []):
        if isinstance(message, Mapping) and message.get("role") == "assistant":
            return message.get("content")
    return record.get("prediction")


def no_answer_text(record: Mapping[str, Any]) -> str:
    """What a run without an answer says: the reason, then the model's last thoughts."""
    text = no_answer_reason(record)
    thoughts = last_thoughts(_last_turn(record))
    if thoughts:
        text += f"\n\nThe model's last thoughts:\n{thoughts}"
    return text


__all__ = [
    "ERROR_WORDS",
    "FORCED_NOTE",
    "NO_ANSWER_WORDS",
    "TERMINATION_WORDS",
    "error_words",
    "is_forced",
    "last_thoughts",
    "no_answer_reason",
    "no_answer_text",
    "termination_words",
]
