"""The words of context compaction (:mod:`drvenus.agent.context`).

- ``keep-last-k`` replaces an older tool response by :data:`ELIDED_TOOL_RESPONSE` (still a
  ``<tool_response>``, so every turn keeps its answer and the conversation its shape);
- ``summarise`` asks for a report with :data:`SUMMARY_REQUEST` (ReSum's idea: the model writes
  down what it has found), then restarts the conversation from the system prompt, the question
  and :func:`summary_message`, whose fixed opening keeps the prompt-cache prefix stable.

With drvenus's profile a compaction also tells the model what it already did
(:func:`recap`: the latest searches and pages, bounded), so a model restarted from its report,
or whose oldest turns were dropped, does not search the same queries again: inside the summary
message, or in :func:`recap_message` after the question (keep-last-k, once turns are dropped).
"""

from __future__ import annotations

from collections.abc import Sequence

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

RECAP_QUERIES = "Searches already made (do not repeat them; search for something new):"
RECAP_PAGES = "Pages already opened:"
RECAP_OPENING = "The oldest turns of this research were removed to free context."
# The recap's bounds: the latest queries and pages, and characters in all.
RECAP_MAX_QUERIES = 30
RECAP_MAX_PAGES = 15
RECAP_MAX_CHARS = 1500
_ITEM_CHARS = 200  # one query or URL, cut past this


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


def summary_message(report: str, recap: str | None = None) -> dict[str, str]:
    """The user message after the question that carries the report (and the :func:`recap`, if
    any) into the restart."""
    parts = [SUMMARY_OPENING, report.strip(), *([recap] if recap else []), SUMMARY_CLOSING]
    return {"role": "user", "content": "\n\n".join(parts)}


def _section(title: str, items: Sequence[str], most: int, chars: int) -> str | None:
    """``title`` and the latest of ``items`` (at most ``most``, oldest first, one line each,
    within ``chars`` characters in all), with how many earlier ones are not listed."""
    cleaned = [line for line in (" ".join(str(i).split())[:_ITEM_CHARS] for i in items) if line]
    lines: list[str] = []
    size = len(title) + 40  # the title and the "not listed" line
    for item in reversed(cleaned):
        if len(lines) == most or size + len(item) + 3 > chars:
            break
        lines.append(f"- {item}")
        size += len(item) + 3
    if not lines:
        return None
    lines.reverse()
    if len(cleaned) > len(lines):
        lines.insert(0, f"- ({len(cleaned) - len(lines)} earlier not listed)")
    return "\n".join([title, *lines])


def recap(queries: Sequence[str], pages: Sequence[str] = ()) -> str | None:
    """The plain note of the searches and pages a run already made: the latest
    :data:`RECAP_MAX_QUERIES` queries and :data:`RECAP_MAX_PAGES` pages, oldest first, within
    :data:`RECAP_MAX_CHARS` characters (two thirds for the queries); None when it made none."""
    sections = [
        _section(RECAP_QUERIES, queries, RECAP_MAX_QUERIES, RECAP_MAX_CHARS * 2 // 3),
        _section(RECAP_PAGES, pages, RECAP_MAX_PAGES, RECAP_MAX_CHARS // 3),
    ]
    text = "\n\n".join(s for s in sections if s)
    return text or None


def recap_message(text: str) -> dict[str, str]:
    """The user message after the question that carries a :func:`recap` once keep-last-k has
    dropped turns (part of the conversation's head from then on)."""
    return {"role": "user", "content": f"{RECAP_OPENING}\n\n{text}"}


def is_recap(content: str) -> bool:
    return content.startswith(RECAP_OPENING)
