"""DR-Venus's RL environment texts, read from its pinned source: ``drvenus rl --protocol dr-venus``.

Nothing of DR-Venus is stored in drvenus: :func:`load_rl_texts` reads the pinned files through a
:class:`~drvenus.reference.store.ReferenceStore` (hash checked) and takes each text out of the
Python source by parsing it (never running it), finding it by the code's structure (where it is
sent), not by its wording:

- ``RL/scrl/llm_agent/dr_agent_loop.py`` (the async agent loop DR-Venus trains with), in
  ``DRAgentLoop.run``: the value of ``error_msg`` (the malformed-turn message, a whole
  ``<tool_response>`` user message); the user message put in place of the last one under the
  ``if`` that compares the prompt with ``self.max_len`` (context limit) and under the ``if`` on
  ``step == max_turns - 1`` (step limit); the string assigned under the ``if`` on
  ``_cutoff_triggered`` (the completion cut-off). In ``DRAgentLoop._call_tool``: the f-string
  of the ``except ...TimeoutError`` handler (the tool timeout; its one placeholder is the
  timeout, with its format spec) and the f-string of the ``except Exception`` handler of the
  tool call (a tool that raised; its placeholder is the exception's ``repr``).
- ``RL/tool_server/tool_prompt.py``: ``SYSTEM_PROMPT``, the system message the loop inserts
  (the name ``DRAgentLoop.init_class`` imports from there), sent verbatim with its own date.
- ``RL/verl/utils/reward_score/llm_judge.py`` (:func:`load_rl_judge`, read only for the LLM
  outcome): ``JUDGE_PROMPT_BC`` (the outcome judge's
  template: ``{question}``, ``{response}``, ``{correct_answer}``), the pattern of the first
  ``re.search`` in ``parse_judge_result`` (the verdict) and the string tuple that
  ``compute_score`` tests a short answer against with ``in`` (answers scored 0 unasked).

The numbers and behaviours around these texts (the 0.9 cut-off, the 150 s tool timeout, the
judge's sampling) are implemented in drvenus's own code (:mod:`drvenus.train.rl.environment`,
:mod:`drvenus.train.rl.judge`); docs/RL.md lists them with their sources.
"""

from __future__ import annotations

import ast
import logging
import re
import string
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from drvenus.protocol import TOOL_RESPONSE_CLOSE, TOOL_RESPONSE_OPEN
from drvenus.protocol.dr_venus import EnvTurn, search_view
from drvenus.reference.extract import (
    ExtractError,
    assigned_string,
    dict_value,
    literal_text,
    scope,
    string_of,
)
from drvenus.reference.store import PinnedFiles, ReferenceStore, read_once

log = logging.getLogger(__name__)

SOURCE = "DR-Venus"
AGENT_LOOP = "RL/scrl/llm_agent/dr_agent_loop.py"
TOOL_PROMPT = "RL/tool_server/tool_prompt.py"
LLM_JUDGE = "RL/verl/utils/reward_score/llm_judge.py"
EXECUTE_TOOLS = "RL/tool_server/execute_tools.py"
SEARCH_TOOL = "RL/tool_server/tool_search.py"
VISIT_TOOL = "RL/tool_server/tool_visit.py"
TOOL_FILES = (EXECUTE_TOOLS, SEARCH_TOOL, VISIT_TOOL)
RL_FILES = (AGENT_LOOP, TOOL_PROMPT, LLM_JUDGE, *TOOL_FILES)

_JUDGE_FIELDS = {"question", "response", "correct_answer"}


@dataclass(frozen=True)
class RLTexts:
    """The texts of DR-Venus's RL environment, as its code sends them.

    ``malformed`` is a whole user message (its ``<tool_response>`` frame included); the limit
    notices and the cut-off notice are plain user messages (no frame). ``tool_timeout`` and
    ``tool_error`` are :meth:`str.format` templates (``{seconds}``, ``{error}``)."""

    source: str  # "DR-Venus @6013141"
    files: Mapping[str, str]  # path -> sha256 of every file read
    system_prompt: str
    malformed: str
    context_limit: str
    step_limit: str
    cutoff: str
    tool_timeout: str
    tool_error: str
    unknown_tool: str  # custom_call_tool's answer to a name it does not route ({name})
    # what each tool answers a call without its fields (its ``call``'s bare except)
    bad_arguments: Mapping[str, str]

    def unknown_tool_text(self, name: object) -> str:
        return self.unknown_tool.format(name=name)

    def timeout_text(self, seconds: float) -> str:
        return self.tool_timeout.format(seconds=seconds)

    def error_text(self, exc: BaseException) -> str:
        return self.tool_error.format(error=exc)

    def refusal(self, turn: EnvTurn) -> str | None:
        """What a call that cannot run gets back: DR-Venus's tool server's own texts for a
        tool it does not route and for a call without a tool's fields (a search's as its
        dispatcher re-reads it: ``[]``); drvenus's reason for a
        value our tools cannot take; None for a call that runs."""
        if turn.problem == "unknown_tool":
            return self.unknown_tool_text(turn.call_name)
        if turn.problem == "missing_arguments" and turn.call_name in self.bad_arguments:
            text = self.bad_arguments[turn.call_name]
            # the dispatcher re-reads the search tool's text: its model reads "[]"
            return search_view(text) if turn.call_name == "search" else text
        if turn.kind == "tool_call" and turn.call is None:
            return str(turn.call_error)
        return None


@dataclass(frozen=True)
class RLJudgeTexts:
    """DR-Venus's RL outcome judge: ``prompt`` a :meth:`str.format` template with
    ``{question}``, ``{response}`` and ``{correct_answer}``; ``verdict`` the regular expression
    whose group 1 is the verdict (searched with ``flags``); ``zero_answers`` the answers scored 0
    without asking."""

    source: str
    files: Mapping[str, str]
    prompt: str
    verdict: str
    flags: int
    zero_answers: tuple[str, ...]


# ---------------------------------------------------------------- structural finders


def _mentions(node: ast.AST, attr: str) -> bool:
    """Whether ``node`` reads a name or attribute called ``attr``."""
    return any((isinstance(n, ast.Attribute) and n.attr == attr)
               or (isinstance(n, ast.Name) and n.id == attr) for n in ast.walk(node))


def _is_last_turn_test(node: ast.AST) -> bool:
    """``step == max_turns - 1`` somewhere in an ``if`` test."""
    for n in ast.walk(node):
        if (isinstance(n, ast.Compare) and len(n.ops) == 1 and isinstance(n.ops[0], ast.Eq)
                and isinstance(n.left, ast.Name) and n.left.id == "step"):
            right = n.comparators[0]
            if (isinstance(right, ast.BinOp) and isinstance(right.op, ast.Sub)
                    and isinstance(right.left, ast.Name) and right.left.id == "max_turns"
                    and isinstance(right.right, ast.Constant) and right.right.value == 1):
                return True
    return False


def _replaced_last(branch: ast.If, where: str) -> list[str]:
    """The literal contents of the user messages assigned to ``messages[-1]`` in ``branch``."""
    found = []
    for n in ast.walk(branch):
        if not (isinstance(n, ast.Assign) and len(n.targets) == 1
                and isinstance(n.targets[0], ast.Subscript)):
            continue
        target = n.targets[0]
        if not (isinstance(target.value, ast.Name) and target.value.id == "messages"):
            continue
        role, content = dict_value(n.value, "role"), dict_value(n.value, "content")
        if isinstance(role, ast.Constant) and role.value == "user" and content is not None:
            try:
                found.append(literal_text(content, where))
            except ExtractError:
                continue  # a message built at run time (the cut-off's), not a literal
    return found


def _one(found: list[str], what: str, where: str) -> str:
    if len(set(found)) != 1:
        raise ExtractError(f"{where}: expected one {what}, found {len(set(found))}")
    return found[0]


def _branches(run: ast.AST) -> list[ast.If]:
    return [n for n in ast.walk(run) if isinstance(n, ast.If)]


def _loop_notices(files: PinnedFiles) -> dict[str, str]:
    where = files.where(AGENT_LOOP)
    run = scope(files.tree(AGENT_LOOP), "DRAgentLoop.run")
    branches = _branches(run)
    context = [t for b in branches if _mentions(b.test, "max_len")
               for t in _replaced_last(b, where)]
    step = [t for b in branches if _is_last_turn_test(b.test) for t in _replaced_last(b, where)]
    cutoff: list[str] = []
    for b in branches:
        if not _mentions(b.test, "_cutoff_triggered"):
            continue
        for n in b.body:
            if isinstance(n, ast.Assign):
                try:
                    cutoff.append(literal_text(n.value, where))
                except ExtractError:
                    continue
    malformed = assigned_string(files.text(AGENT_LOOP), "error_msg", within="DRAgentLoop.run",
                                where=where)
    if not (malformed.startswith(TOOL_RESPONSE_OPEN) and malformed.endswith(TOOL_RESPONSE_CLOSE)):
        raise ExtractError(f"{where}: error_msg is not one {TOOL_RESPONSE_OPEN} message")
    return {
        "malformed": malformed,
        "context_limit": _one(context, "context limit message (if ... self.max_len ...)", where),
        "step_limit": _one(step, "step limit message (if step == max_turns - 1 ...)", where),
        "cutoff": _one(cutoff, "cut-off message (if ... _cutoff_triggered ...)", where),
    }


def _template(node: ast.JoinedStr, name: str, where: str) -> str:
    """An f-string with one placeholder as a :meth:`str.format` template whose field is
    ``name`` (its conversion and format spec kept; ``repr(x)`` becomes ``!r``)."""
    parts: list[str] = []
    fields = 0
    for v in node.values:
        if isinstance(v, ast.Constant):
            parts.append(str(v.value).replace("{", "{{").replace("}", "}}"))
            continue
        assert isinstance(v, ast.FormattedValue)
        fields += 1
        conversion = {-1: "", 115: "!s", 114: "!r", 97: "!a"}[v.conversion]
        expr = v.value
        if (isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name)
                and expr.func.id == "repr" and len(expr.args) == 1 and not conversion):
            conversion = "!r"
        spec = ""
        if v.format_spec is not None:
            spec = ":" + literal_text(v.format_spec, where)
        parts.append("{" + name + conversion + spec + "}")
    if fields != 1:
        raise ExtractError(f"{where}: line {node.lineno}: expected one placeholder, found {fields}")
    return "".join(parts)


def _handler_fstrings(node: ast.AST, kind: str) -> list[ast.JoinedStr]:
    """The f-strings assigned or returned in the ``except <...kind>`` handlers under ``node``."""
    out = []
    for h in ast.walk(node):
        if not (isinstance(h, ast.ExceptHandler) and h.type is not None
                and ast.unparse(h.type).split(".")[-1] == kind):
            continue
        for n in h.body:
            value = n.value if isinstance(n, ast.Assign | ast.Return) else None
            if isinstance(value, ast.JoinedStr):
                out.append(value)
    return out


def _tool_texts(files: PinnedFiles) -> dict[str, str]:
    where = files.where(AGENT_LOOP)
    call = scope(files.tree(AGENT_LOOP), "DRAgentLoop._call_tool")
    timeouts = [_template(f, "seconds", where) for f in _handler_fstrings(call, "TimeoutError")]
    errors = [_template(f, "error", where) for f in _handler_fstrings(call, "Exception")]
    return {"tool_timeout": _one(timeouts, "tool timeout message", where),
            "tool_error": _one(errors, "tool error message", where)}


def _tool_server_texts(files: PinnedFiles) -> dict[str, Any]:
    """The tool server's own texts: an unknown tool (the f-string ``custom_call_tool`` returns
    for a name it does not route) and each tool's answer to a call without its fields (the
    string its ``call`` returns from a bare ``except``)."""
    where = files.where(EXECUTE_TOOLS)
    route = scope(files.tree(EXECUTE_TOOLS), "custom_call_tool")
    unknown = [_template(n.value, "name", where) for n in ast.walk(route)
               if isinstance(n, ast.Return) and isinstance(n.value, ast.JoinedStr)]
    bad: dict[str, str] = {}
    for tool, path, cls in (("search", SEARCH_TOOL, "Search"), ("visit", VISIT_TOOL, "Visit")):
        here = files.where(path)
        call = scope(files.tree(path), f"{cls}.call")
        found = [literal_text(n.value, here) for h in ast.walk(call)
                 if isinstance(h, ast.ExceptHandler) and h.type is None
                 for n in h.body if isinstance(n, ast.Return) and n.value is not None]
        bad[tool] = _one(found, f"{cls}.call's invalid request text", here)
    return {"unknown_tool": _one(unknown, "the unknown tool text", where), "bad_arguments": bad}


def _system_prompt(files: PinnedFiles) -> str:
    where = files.where(AGENT_LOOP)
    init = scope(files.tree(AGENT_LOOP), "DRAgentLoop.init_class")
    imported = [a.name for n in ast.walk(init) if isinstance(n, ast.ImportFrom)
                and (n.module or "").endswith("tool_prompt") for a in n.names]
    if imported != ["SYSTEM_PROMPT"]:
        raise ExtractError(f"{where}: DRAgentLoop.init_class does not take SYSTEM_PROMPT from "
                           f"{TOOL_PROMPT}")
    return assigned_string(files.text(TOOL_PROMPT), "SYSTEM_PROMPT", where=files.where(TOOL_PROMPT))


def _judge(files: PinnedFiles) -> dict[str, Any]:
    where = files.where(LLM_JUDGE)
    text = files.text(LLM_JUDGE)
    prompt = assigned_string(text, "JUDGE_PROMPT_BC", where=where)
    try:
        names = {f for _, f, _, _ in string.Formatter().parse(prompt) if f is not None}
    except ValueError as exc:
        raise ExtractError(f"{where}: JUDGE_PROMPT_BC is not a format template ({exc})") from None
    if names != _JUDGE_FIELDS:
        raise ExtractError(f"{where}: JUDGE_PROMPT_BC has the fields {sorted(names)}, not "
                           f"{sorted(_JUDGE_FIELDS)}")
    tree = files.tree(LLM_JUDGE)
    searches = [n for n in ast.walk(scope(tree, "parse_judge_result"))
                if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                and n.func.attr == "search" and n.args]
    if not searches:
        raise ExtractError(f"{where}: no re.search in parse_judge_result")
    verdict = string_of(searches[0].args[0])
    flags = _re_flags(searches[0], where)
    try:
        if re.compile(verdict, flags).groups < 1:
            raise ExtractError(f"{where}: the verdict pattern has no group")
    except re.error as exc:
        raise ExtractError(f"{where}: the verdict pattern is not a regular expression ({exc})") \
            from None
    zero: list[tuple[str, ...]] = []
    for n in ast.walk(scope(tree, "compute_score")):
        if (isinstance(n, ast.Compare) and len(n.ops) == 1 and isinstance(n.ops[0], ast.In)
                and isinstance(n.comparators[0], ast.Tuple)):
            items = n.comparators[0].elts
            if items and all(isinstance(e, ast.Constant) and isinstance(e.value, str)
                             for e in items):
                zero.append(tuple(e.value for e in items))  # type: ignore[attr-defined]
    if len(zero) != 1:
        raise ExtractError(f"{where}: expected one tuple of answers scored 0 in compute_score, "
                           f"found {len(zero)}")
    return {"prompt": prompt, "verdict": verdict, "flags": flags, "zero_answers": zero[0]}


def _re_flags(call: ast.Call, where: str) -> int:
    """The ``re`` flags of a ``re.search(pattern, text, flags)`` call (``re.I | re.S`` ...)."""
    node = call.args[2] if len(call.args) > 2 else next(
        (k.value for k in call.keywords if k.arg == "flags"), None)
    if node is None:
        return 0
    names = [n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)]
    if not names or not all(isinstance(getattr(re, n, None), re.RegexFlag) for n in names):
        raise ExtractError(f"{where}: line {call.lineno}: flags that are not re's")
    flags = 0
    for n in names:
        flags |= int(getattr(re, n))
    return flags


def load_rl_texts(store: ReferenceStore) -> RLTexts:
    """DR-Venus's RL environment texts (the loop's and its system prompt) from the pinned files
    of ``store``. Raises :class:`~drvenus.reference.store.ReferenceError` (a file missing or of
    another version) or :class:`~drvenus.reference.extract.ExtractError` (a file without what
    is expected); both are one line naming the file."""
    files = PinnedFiles(store, SOURCE)
    values: dict[str, Any] = {"system_prompt": _system_prompt(files)}
    values.update(_loop_notices(files))
    values.update(_tool_texts(files))
    values.update(_tool_server_texts(files))
    return RLTexts(source=files.source.short, files=dict(files.hashes), **values)


def load_rl_judge(store: ReferenceStore) -> RLJudgeTexts:
    """DR-Venus's RL outcome judge texts from ``store`` (errors as :func:`load_rl_texts`)."""
    files = PinnedFiles(store, SOURCE)
    values = _judge(files)
    return RLJudgeTexts(source=files.source.short, files=dict(files.hashes), **values)


def _cached(kind: str, load: Any, store: ReferenceStore | None) -> Any:
    if store is None:
        from drvenus.reference.store import reference_store

        store = reference_store()

    def logged(s: ReferenceStore) -> Any:
        texts = load(s)
        log.info("DR-Venus RL %s from %s (%s)", kind, texts.source,
                 ", ".join(f"{p} {h[:12]}" for p, h in texts.files.items()))
        return texts

    return read_once(f"DR-Venus RL {kind}", logged, store)


def rl_texts(store: ReferenceStore | None = None) -> RLTexts:
    """:func:`load_rl_texts` of ``store`` (default: the settings' store), read once per store
    location in a process (every rollout of a run shares them)."""
    return _cached("texts", load_rl_texts, store)  # type: ignore[no-any-return]


def rl_judge_texts(store: ReferenceStore | None = None) -> RLJudgeTexts:
    """:func:`load_rl_judge` of ``store`` (default: the settings' store), read once."""
    return _cached("judge", load_rl_judge, store)  # type: ignore[no-any-return]


__all__ = ["AGENT_LOOP", "EXECUTE_TOOLS", "LLM_JUDGE", "RL_FILES", "SEARCH_TOOL", "SOURCE",
           "TOOL_FILES", "TOOL_PROMPT", "VISIT_TOOL",
           "RLJudgeTexts", "RLTexts", "load_rl_judge", "load_rl_texts", "rl_judge_texts",
           "rl_texts"]
