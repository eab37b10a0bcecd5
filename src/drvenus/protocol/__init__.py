"""The DR-Venus conversation protocol: the single source of truth for every other module.

Pure functions and data only (no I/O beyond reading a prompt file the caller names). Everything
that knows what a valid turn looks like lives here: the prompt, the tool specs and call
normalisation, turn repair and parsing, the RL format check, the result renderers, the GBNF
grammar of a valid turn (``grammar``), and the rules for reading legacy tool calls in raw
REDSearcher data (``legacy``). Callers: the agent parses turns with ``repair_turn`` +
``parse_turn``; the data pipeline reads raw rows with ``legacy`` and renders with ``render``;
RL scores format with ``check_turn_format``.
"""

from drvenus.protocol.format import check_turn_format
from drvenus.protocol.grammar import grammar_for_kind, protocol_grammar
from drvenus.protocol.parse import (
    ParsedTurn,
    after_thinking,
    assistant_text,
    extract_answer,
    first_answer_block,
    parse_turn,
    repair_turn,
)
from drvenus.protocol.prompt import (
    build_system_prompt,
    initial_messages,
    load_system_prompt,
    template_prefills_think,
    tools_section,
)
from drvenus.protocol.render import (
    ANSWER_SPLIT,
    CONTEXT_LIMIT_MESSAGE,
    FORMAT_ERROR_MESSAGE,
    IG_PSEUDO_ANSWER,
    STEP_LIMIT_MESSAGE,
    TOOL_RESPONSE_CLOSE,
    TOOL_RESPONSE_OPEN,
    TRAJECTORY_LAYOUT,
    VISIT_SEPARATOR,
    classify_tool_response,
    join_visits,
    parse_search_body,
    parse_visit_body,
    render_answer_turn,
    render_search,
    render_tool_call_turn,
    render_visit,
    render_visit_failure,
    search_entry,
    unwrap_tool_response,
    wrap_tool_response,
)
from drvenus.protocol.tools import (
    MISSING_ARGUMENT,
    SEARCH,
    TOOL_NAMES,
    TOOL_SPECS,
    VISIT,
    ToolCall,
    ToolCallError,
    normalize_arguments,
    normalize_tool_call,
    tool_error_message,
    unknown_tool_message,
)

STOP_STRINGS: tuple[str, ...] = ("<tool_response>", "\n<tool_response>")

__all__ = [
    "ANSWER_SPLIT",
    "CONTEXT_LIMIT_MESSAGE",
    "FORMAT_ERROR_MESSAGE",
    "IG_PSEUDO_ANSWER",
    "MISSING_ARGUMENT",
    "SEARCH",
    "STEP_LIMIT_MESSAGE",
    "STOP_STRINGS",
    "TOOL_RESPONSE_CLOSE",
    "TOOL_RESPONSE_OPEN",
    "TRAJECTORY_LAYOUT",
    "TOOL_NAMES",
    "TOOL_SPECS",
    "VISIT",
    "VISIT_SEPARATOR",
    "ParsedTurn",
    "after_thinking",
    "ToolCall",
    "ToolCallError",
    "assistant_text",
    "build_system_prompt",
    "check_turn_format",
    "classify_tool_response",
    "extract_answer",
    "first_answer_block",
    "grammar_for_kind",
    "initial_messages",
    "join_visits",
    "load_system_prompt",
    "normalize_arguments",
    "normalize_tool_call",
    "parse_search_body",
    "parse_turn",
    "parse_visit_body",
    "protocol_grammar",
    "render_answer_turn",
    "render_search",
    "render_tool_call_turn",
    "render_visit",
    "render_visit_failure",
    "repair_turn",
    "search_entry",
    "template_prefills_think",
    "tool_error_message",
    "tools_section",
    "unknown_tool_message",
    "unwrap_tool_response",
    "wrap_tool_response",
]
