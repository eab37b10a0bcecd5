"""The words of context compaction (:mod:`drvenus.agent.context`).

- ``keep-last-k`` replaces an older tool response by :data:`ELIDED_TOOL_RESPONSE` (still a
  ``<tool_response>``, so every turn keeps its answer and the conversation its shape);
- ``summarise`` asks for a report with :data:`SUMMARY_REQUEST` (ReSum's idea: the model writes
  down what it has found), then restarts the conversation from the system prompt, the question
  and :func:`summary_message`, whose fixed opening keeps the prompt-cache prefix stable.
"""

from __future__ import annotations

from drvenus.protocol.parse import after_thinking
from drvenus.protocol.render import unwrap_tool_response, wrap_tool_response

ELIDED_TOOL_RESPONSE = "[an earlier tool result, removed to free context]"

SUMMARY_REQUEST = (
    "Your context is nearly full, so this conversation will restart from a report you write "
    "now. Do not call a tool and do not answer the question yet. Write the report: what the "
    "question asks; every fact you have found that bears on it (names, dates, numbers), each "
    "with the URL it came from; what is still unknown; and what to search or read next."
)

SUMMARY_OPENING = (
    "The earlier part of this research was removed to free context. Your report of it:"
)
SUMMARY_CLOSING = "Continue the research from here: call a tool, or answer when you are sure."


def elided_tool_response() -> str:
    """The user message that takes an older tool response's place."""
    return wrap_tool_response(ELIDED_TOOL_RESPONSE)


def is_elided(content: str) -> bool:
    return unwrap_tool_response(content) == ELIDED_TOOL_RESPONSE


def summary_request() -> dict[str, str]:
    """The user message that asks for the report."""
    return {"role": "user", "content": SUMMARY_REQUEST}


def report_text(output: str) -> str:
    """The report in a model's reply (its reasoning, if any, left out)."""
    return after_thinking(output).strip()


def summary_message(report: str) -> dict[str, str]:
    """The user message after the question that carries the report into the restart."""
    return {
        "role": "user",
        "content": f"{SUMMARY_OPENING}\n\n{report.strip()}\n\n{SUMMARY_CLOSING}",
    }
