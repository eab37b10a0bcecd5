"""Tool specifications and tool-call normalisation for the DR-Venus protocol.

Only two tools exist: ``search`` and ``visit``. A call is normalised into a
:class:`ToolCall` with canonical argument shapes (lists of strings), legacy keys
mapped, and unknown keys dropped. Unknown tool names raise :class:`ToolCallError`
whose message lists the available tools.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from drvenus.protocol._json import loads_json5

SEARCH = "search"
VISIT = "visit"
TOOL_NAMES: tuple[str, ...] = (SEARCH, VISIT)

SEARCH_SPEC: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": SEARCH,
        "description": (
            "Run web searches and return the top results (title, url, snippet) for each query. "
            "Several queries may be given at once."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "query": {
                    "type": "array",
                    "items": {"type": "string", "description": "One search query."},
                    "minItems": 1,
                    "description": "The search queries to run.",
                }
            },
            "required": ["query"],
        },
    },
}

VISIT_SPEC: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": VISIT,
        "description": (
            "Open one or more web pages and return the evidence they hold for the stated goal, "
            "with a summary."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "url": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "The URL or URLs to open.",
                },
                "goal": {
                    "type": "string",
                    "description": "What information to look for on the page(s).",
                },
            },
            "required": ["url", "goal"],
        },
    },
}

TOOL_SPECS: dict[str, dict[str, Any]] = {SEARCH: SEARCH_SPEC, VISIT: VISIT_SPEC}

# Accepted argument keys per tool, with the legacy spelling each maps from.
_ARG_ALIASES: dict[str, dict[str, str]] = {
    SEARCH: {"query": "query", "queries": "query"},
    VISIT: {"url": "url", "urls": "url", "goal": "goal"},
}


class ToolCallError(ValueError):
    """A tool call that cannot be executed (unknown tool, bad or missing arguments)."""


@dataclass(frozen=True)
class ToolCall:
    """A normalised tool call: ``search(query=[...])`` or ``visit(url=[...], goal=...)``."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "arguments": dict(self.arguments)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False)

    def key(self) -> str:
        """Identity of the call for duplicate detection: name + arguments, keys sorted."""
        return json.dumps(self.to_dict(), sort_keys=True, ensure_ascii=False)

    def signature(self) -> tuple[str, tuple[str, ...]]:
        """(tool, sorted unique queries/urls): the SFT pipeline's duplicate signature."""
        items = self.arguments.get("query" if self.name == SEARCH else "url", [])
        return self.name, tuple(sorted({str(x) for x in items}))


def unknown_tool_message(name: object) -> str:
    return f"Unknown tool '{name}'. Available tools: {', '.join(TOOL_NAMES)}"


# What each tool needs, said to the model when a call lacks it.
MISSING_ARGUMENT = {
    SEARCH: "search needs 'query': a list of search queries",
    VISIT: "visit needs 'url': a URL or a list of URLs",
}


def tool_error_message(name: str, reason: str) -> str:
    """The tool response for a call that failed (bad arguments, a crash, a timeout): one line
    the model can read and react to."""
    if reason in MISSING_ARGUMENT.values():
        return f"ERROR: {reason}"
    return f"ERROR: {name} failed: {reason}"


def _as_str_list(value: Any, what: str) -> list[str]:
    if isinstance(value, str):
        items = [value]
    elif isinstance(value, list | tuple):
        items = [v if isinstance(v, str) else json.dumps(v, ensure_ascii=False) for v in value]
    else:
        raise ToolCallError(f"'{what}' must be a string or a list of strings")
    items = [s.strip() for s in items if isinstance(s, str) and s.strip()]
    if not items:
        raise ToolCallError(f"'{what}' needs at least one non-empty value")
    return items


def normalize_arguments(name: str, arguments: Any) -> dict[str, Any]:
    """Canonical arguments for ``name``; raises :class:`ToolCallError` when unusable."""
    if name not in TOOL_SPECS:
        raise ToolCallError(unknown_tool_message(name))
    if isinstance(arguments, str):
        try:
            arguments = loads_json5(arguments)
        except Exception as exc:  # any decoding failure is a bad call
            raise ToolCallError(f"arguments are not a JSON object: {exc}") from exc
    if not isinstance(arguments, Mapping):
        raise ToolCallError("'arguments' must be a JSON object")
    aliases = _ARG_ALIASES[name]
    raw: dict[str, Any] = {}
    for key, value in arguments.items():
        canon = aliases.get(str(key))
        if canon is None:
            continue  # unknown keys are dropped
        if canon not in raw or key == canon:
            raw[canon] = value  # the canonical key wins over a legacy one
    if name == SEARCH:
        if "query" not in raw:
            raise ToolCallError("search needs 'query': a list of search queries")
        return {"query": _as_str_list(raw["query"], "query")}
    if "url" not in raw:
        raise ToolCallError("visit needs 'url': a URL or a list of URLs")
    goal = raw.get("goal", "")
    if isinstance(goal, list | tuple):
        goal = goal[0] if goal else ""
    if not isinstance(goal, str):
        goal = json.dumps(goal, ensure_ascii=False)
    goal = goal.strip()
    if not goal:
        raise ToolCallError("visit needs 'goal': what to look for on the page")
    return {"url": _as_str_list(raw["url"], "url"), "goal": goal}


def normalize_tool_call(obj: Any) -> ToolCall:
    """Normalise a decoded ``{"name": ..., "arguments": ...}`` object into a :class:`ToolCall`."""
    if not isinstance(obj, Mapping):
        raise ToolCallError("a tool call must be a JSON object with 'name' and 'arguments'")
    if "name" not in obj or "arguments" not in obj:
        raise ToolCallError("a tool call needs both 'name' and 'arguments'")
    name = obj["name"]
    if not isinstance(name, str) or name not in TOOL_SPECS:
        raise ToolCallError(unknown_tool_message(name))
    return ToolCall(name=name, arguments=normalize_arguments(name, obj["arguments"]))
