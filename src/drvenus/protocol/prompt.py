"""The system prompt: research instructions, tool signatures, call syntax, current date."""

from __future__ import annotations

import datetime as _dt
import json
import re
from collections.abc import Sequence
from pathlib import Path

from drvenus.protocol.tools import TOOL_NAMES, TOOL_SPECS
from drvenus.records import TRAJECTORY_SUFFIXES, first_trajectory_messages

INSTRUCTIONS = (
    "You are a deep research assistant. Investigate every question thoroughly: search several "
    "independent sources, open the most promising pages, and cross-check each fact before you "
    "rely on it. Work on open-domain and specialist questions alike, and keep going until the "
    "evidence is solid. When you are ready to give your definitive response, put the entire "
    "final answer inside `<answer></answer>` tags."
)


def tools_section(tools: Sequence[str] = TOOL_NAMES) -> str:
    """The ``# Tools`` section: signatures in ``<tools>`` (one JSON per line) and call syntax."""
    lines = [json.dumps(TOOL_SPECS[name], ensure_ascii=False) for name in tools]
    return (
        "# Tools\n\n"
        "You may call one or more functions to help answer the user query.\n\n"
        "The function signatures are given inside <tools></tools> XML tags:\n"
        "<tools>\n" + "\n".join(lines) + "\n</tools>\n\n"
        "To call a function, return a JSON object with the function name and its arguments "
        "inside <tool_call></tool_call> XML tags:\n"
        "<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n'
        "</tool_call>"
    )


def build_system_prompt(
    current_date: _dt.date | str | None = None,
    *,
    tools: Sequence[str] = TOOL_NAMES,
    instructions: str = INSTRUCTIONS,
) -> str:
    """The full system prompt, ending with the ``Current date: YYYY-MM-DD`` line."""
    date_text = _date_text(_dt.date.today() if current_date is None else current_date)
    return f"{instructions}\n\n{tools_section(tools)}\n\nCurrent date: {date_text}\n"


_DATE_LINE = re.compile(r"^Current date: (\d{4}-\d{2}-\d{2})[ \t]*$", re.MULTILINE)


def _date_text(current_date: _dt.date | str) -> str:
    text = current_date.isoformat() if isinstance(current_date, _dt.date) else str(current_date)
    _dt.date.fromisoformat(text)  # raises ValueError on a malformed date
    return text


def with_current_date(prompt: str, current_date: _dt.date | str) -> str:
    """``prompt`` with the date of its last ``Current date: YYYY-MM-DD`` line replaced
    (a fixed prompt run on another day); ValueError when it has no such line."""
    matches = list(_DATE_LINE.finditer(prompt))
    if not matches:
        raise ValueError("the system prompt has no 'Current date: YYYY-MM-DD' line to set")
    start, end = matches[-1].span(1)
    return prompt[:start] + _date_text(current_date) + prompt[end:]


def prompt_date(prompt: str) -> str | None:
    """The date of a prompt's last ``Current date:`` line, if it has one."""
    matches = list(_DATE_LINE.finditer(prompt))
    return matches[-1].group(1) if matches else None


def load_system_prompt(path: str | Path) -> str:
    """A user-supplied system prompt that replaces ours verbatim (e.g. a checkpoint's own).

    A ``.json`` / ``.jsonl`` / ``.parquet`` file is read as trajectories (SFT rows with a
    ``messages`` list, or a bare message list) and the first row's system message is used, so
    a released checkpoint runs with the exact prompt it was trained on. Any other file is the
    prompt text itself. Raises ``ValueError`` (one readable line) when there is no prompt.
    """
    path = Path(path)
    if path.name.lower().endswith(TRAJECTORY_SUFFIXES):
        text = _trajectory_system_prompt(path)
    else:
        text = path.read_text(encoding="utf-8")
    if not text.strip():
        raise ValueError(f"system prompt file {path} is empty")
    return text


def _trajectory_system_prompt(path: Path) -> str:
    messages = first_trajectory_messages(path)
    for message in messages or ():
        if isinstance(message, dict) and message.get("role") == "system":
            return str(message.get("content") or "")
    raise ValueError(f"{path}: the first trajectory has no system message")


def initial_messages(question: str, system_prompt: str) -> list[dict[str, str]]:
    """The conversation start: system prompt, then the question verbatim."""
    return [
        {"role": "system", "content": system_prompt},
        {"role": "user", "content": question},
    ]


def template_prefills_think(chat_template: str) -> bool:
    """Whether a Jinja chat template's generation prompt ends inside an open ``<think>``
    (Qwen3-Thinking does: the model's turn then starts with the thought itself, and the tag
    must be restored in the sampled text and left out of a grammar)."""
    cut = chat_template.rfind("add_generation_prompt")
    if cut < 0:
        return False
    tail = chat_template[cut:]
    return "<think>" in tail and "</think>" not in tail.split("<think>", 1)[1][:40]
