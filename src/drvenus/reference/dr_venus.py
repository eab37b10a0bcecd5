"""DR-Venus's own words, read from its pinned source: the texts of ``--protocol dr-venus``.

Nothing of DR-Venus is stored in drvenus: :func:`load_dr_venus_texts` reads the pinned files
through a :class:`~drvenus.reference.store.ReferenceStore` (hash checked) and takes each text
out of the Python source by parsing it, finding it by the code's structure (what is sent where),
not by its wording:

- ``Inference/run_demo.py``: the system message of ``ResearchProblemSolver.__init__`` (the
  module string it names: ``SYSTEM_PROMPT``, sent verbatim, its own ``Current date:`` line
  included); in ``ResearchProblemSolver.solve`` the user message appended when a step still
  fails to parse (under ``if status == 2``) and the two messages put in place of the last one
  right before ``return self._force_answer("answered_token_limit", ...)`` (context limit) and
  ``..._force_answer("answered_max_steps", ...)`` (step limit); the literal keywords of the
  chat call in ``ResearchProblemSolver._call_llm_once`` (the agent's sampling).
- ``Inference/tool_server/tool_prompt.py``: ``EXTRACTOR_PROMPT``, the page extractor's
  template (``{webpage_content}``, ``{goal}``).
- ``Inference/tool_server/tool_visit.py``: the constant evidence and summary of the visit
  failure frame (the literals between ``"Evidence in page: \\n"`` / ``"Summary: \\n"`` and
  ``"\\n\\n"``), and the literal keywords of the extractor's chat call in
  ``Visit.call_server`` (its sampling).

To extend (e.g. the RL environment's texts from ``RL/...``): add the fields to
:class:`DrVenusTexts` with defaults, or a sibling dataclass, and a part function like
:func:`_inference` that reads through the same
:class:`~drvenus.reference.store.PinnedFiles` (so the hashes of every file read are kept), and
list it in :data:`PARTS`.
"""

from __future__ import annotations

import ast
import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from drvenus.protocol import (
    TOOL_RESPONSE_OPEN,
    ProtocolTexts,
    unwrap_tool_response,
    wrap_tool_response,
)
from drvenus.reference.extract import (
    ExtractError,
    assigned_string,
    call_keywords,
    dict_value,
    literal_text,
    scope,
    strings,
)
from drvenus.reference.store import PinnedFiles, ReferenceStore

SOURCE = "DR-Venus"
PROFILE = "dr-venus"  # its name in the registry (drvenus.reference.profiles)
RUN_DEMO = "Inference/run_demo.py"
TOOL_PROMPT = "Inference/tool_server/tool_prompt.py"
TOOL_VISIT = "Inference/tool_server/tool_visit.py"
INFERENCE_FILES = (RUN_DEMO, TOOL_PROMPT, TOOL_VISIT)

# the visit frame around the failure texts (protocol facts, PROTOCOL.md "Tools")
_FRAME_HEAD = "The useful information in {url} for user goal {goal} as follows: \n\n"
_EVIDENCE_HEAD = "Evidence in page: \n"
_SUMMARY_HEAD = "Summary: \n"
_PART_END = "\n\n"
# the keywords of a chat call (extra_body's merged in) that are sampling settings, and those
# that are not
_SAMPLING_KEYS = frozenset({"temperature", "top_p", "top_k", "presence_penalty", "max_tokens",
                            "stop", "seed"})
_NOT_SAMPLING = frozenset({"model", "messages", "stream"})
# the terminations whose forced answer follows each limit notice (PROTOCOL.md, result record)
_LIMITS = {"answered_token_limit": "context_limit", "answered_max_steps": "step_limit"}


@dataclass(frozen=True)
class DrVenusTexts:
    """DR-Venus's texts, as its code sends them. The notices are whole user messages, their
    ``<tool_response>`` tags included; :meth:`protocol_texts` gives drvenus's profile of them.
    ``agent_sampling`` / ``extractor_sampling``: the literal sampling keywords of the two chat
    calls (``extra_body`` keys merged in); a key not there is not sent by DR-Venus."""

    source: str  # "DR-Venus @6013141"
    files: Mapping[str, str]  # path -> sha256 of every file read
    # inference (Inference/run_demo.py, Inference/tool_server/)
    system_prompt: str
    format_error: str
    context_limit: str
    step_limit: str
    agent_sampling: Mapping[str, Any]
    visit_failed_evidence: str
    visit_failed_summary: str
    extractor_prompt: str
    extractor_sampling: Mapping[str, Any]
    extra: Mapping[str, Any] = field(default_factory=dict)  # texts of later parts (see PARTS)

    def protocol_texts(self) -> ProtocolTexts:
        """The profile the agent loop and the visit tool take (notices without their tags)."""
        return ProtocolTexts(
            name=PROFILE,
            system_prompt=self.system_prompt,
            format_error=_body(self.format_error, "the parse error notice"),
            context_limit=_body(self.context_limit, "the context limit notice"),
            step_limit=_body(self.step_limit, "the step limit notice"),
            visit_failed_evidence=self.visit_failed_evidence,
            visit_failed_summary=self.visit_failed_summary,
            source=f"{self.source} ({RUN_DEMO})",
        )


def _body(message: str, what: str) -> str:
    body = unwrap_tool_response(message)
    if body is None or wrap_tool_response(body) != message:
        raise ExtractError(f"{SOURCE}/{RUN_DEMO}: {what} is not one {TOOL_RESPONSE_OPEN} message")
    return body


# ---------------------------------------------------------------- structural finders


def _is_role(node: ast.AST, role: str) -> bool:
    value = dict_value(node, "role")
    return isinstance(value, ast.Constant) and value.value == role


def _is_self_attr(node: ast.AST, attr: str) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == attr
            and isinstance(node.value, ast.Name) and node.value.id == "self")


def _system_prompt(files: PinnedFiles) -> str:
    """The content of the system message the solver starts its conversation with."""
    where = files.where(RUN_DEMO)
    tree = files.tree(RUN_DEMO)
    init = scope(tree, "ResearchProblemSolver.__init__")
    found = [dict_value(n, "content") for n in ast.walk(init) if _is_role(n, "system")]
    if len(found) != 1 or found[0] is None:
        raise ExtractError(f"{where}: expected one system message in "
                           f"ResearchProblemSolver.__init__, found {len(found)}")
    content = found[0]
    if isinstance(content, ast.Name):
        return assigned_string(files.text(RUN_DEMO), content.id, where=where)
    return literal_text(content, where)


def _is_status(node: ast.AST, value: int) -> bool:
    return (isinstance(node, ast.Compare) and isinstance(node.left, ast.Name)
            and node.left.id == "status" and len(node.ops) == 1
            and isinstance(node.ops[0], ast.Eq) and isinstance(node.comparators[0], ast.Constant)
            and node.comparators[0].value == value)


def _parse_error_notice(files: PinnedFiles, solve: ast.AST) -> str:
    """The user message ``solve`` appends when a step still fails to parse."""
    where = files.where(RUN_DEMO)
    found: list[str] = []
    for branch in ast.walk(solve):
        if not (isinstance(branch, ast.If) and _is_status(branch.test, 2)):
            continue
        for n in ast.walk(branch):
            if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                    and n.func.attr == "append" and _is_self_attr(n.func.value, "messages")
                    and n.args and _is_role(n.args[0], "user")):
                content = dict_value(n.args[0], "content")
                if content is not None:
                    found.append(literal_text(content, where))
    if len(found) != 1:
        raise ExtractError(f"{where}: expected one parse error message under 'if status == 2' "
                           f"in ResearchProblemSolver.solve, found {len(found)}")
    return found[0]


def _limit_notices(files: PinnedFiles, solve: ast.AST) -> dict[str, str]:
    """The messages put in place of the last one right before each forced answer, by the
    termination of that answer."""
    where = files.where(RUN_DEMO)
    found: dict[str, list[str]] = {}
    blocks = [b for node in ast.walk(solve) for b in (getattr(node, "body", None),
                                                      getattr(node, "orelse", None))
              if isinstance(b, list)]
    for body in blocks:
        for first, then in zip(body, body[1:], strict=False):
            if not (isinstance(first, ast.Assign) and len(first.targets) == 1
                    and isinstance(first.targets[0], ast.Subscript)
                    and _is_self_attr(first.targets[0].value, "messages")
                    and _is_role(first.value, "user")):
                continue
            if not (isinstance(then, ast.Return) and isinstance(then.value, ast.Call)
                    and _is_self_attr(then.value.func, "_force_answer") and then.value.args
                    and isinstance(then.value.args[0], ast.Constant)):
                continue
            content = dict_value(first.value, "content")
            if content is not None:
                found.setdefault(str(then.value.args[0].value), []).append(
                    literal_text(content, where))
    out: dict[str, str] = {}
    for termination, name in _LIMITS.items():
        texts = found.get(termination, [])
        if len(texts) != 1:
            raise ExtractError(f"{where}: expected one message before the forced answer "
                               f"{termination!r} in ResearchProblemSolver.solve, found "
                               f"{len(texts)}")
        out[name] = texts[0]
    return out


def _sampling(files: PinnedFiles, path: str, within: str) -> dict[str, Any]:
    """The literal sampling keywords of the one chat call ``...create(...)`` in ``within``
    (``extra_body``'s merged in); any other literal keyword is refused, so that nothing
    DR-Venus sends is silently dropped."""
    where = files.where(path)
    calls = call_keywords(files.text(path), "create", within=within, where=where)
    if len(calls) != 1:
        raise ExtractError(f"{where}: expected one chat call in {within}, found {len(calls)}")
    kwargs = {k: v for k, v in calls[0].items() if k not in _NOT_SAMPLING}
    extra = kwargs.pop("extra_body", {})
    if not isinstance(extra, dict):
        raise ExtractError(f"{where}: extra_body of the chat call in {within} is not a dict")
    kwargs.update(extra)
    unknown = sorted(set(kwargs) - _SAMPLING_KEYS)
    if unknown:
        raise ExtractError(f"{where}: the chat call in {within} sets {', '.join(unknown)}, "
                           "which drvenus does not send")
    if "stop" in kwargs:
        kwargs["stop"] = tuple(kwargs["stop"])
    return kwargs


def _operands(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _operands(node.left) + _operands(node.right)
    return [node]


def _visit_failure_texts(files: PinnedFiles) -> tuple[str, str]:
    """The constant evidence and summary the visit tool writes into a failure frame."""
    where = files.where(TOOL_VISIT)
    tree = files.tree(TOOL_VISIT)
    parts: dict[str, set[str]] = {_EVIDENCE_HEAD: set(), _SUMMARY_HEAD: set()}
    for n in ast.walk(scope(tree, "Visit")):
        if not (isinstance(n, ast.AugAssign) and isinstance(n.op, ast.Add)):
            continue
        ops = _operands(n.value)
        if len(ops) != 3 or not all(isinstance(o, ast.Constant) for o in (ops[0], ops[2])):
            continue
        head, end = ops[0].value, ops[2].value  # type: ignore[attr-defined]
        if head in parts and end == _PART_END and isinstance(ops[1], ast.Constant) \
                and isinstance(ops[1].value, str):
            parts[head].add(ops[1].value)
    for head, texts in parts.items():
        if len(texts) != 1:
            raise ExtractError(f"{where}: expected one constant {head.strip()!r} text of the "
                               f"failure frame, found {len(texts)}")
    heads = {s for s in strings(files.text(TOOL_VISIT), within="Visit", fstrings=False,
                                where=where) if s.startswith("The useful information in")}
    if heads != {_FRAME_HEAD}:
        raise ExtractError(f"{where}: the visit frame's first line is not the protocol's")
    (evidence,), (summary,) = parts[_EVIDENCE_HEAD], parts[_SUMMARY_HEAD]
    return evidence, summary


def _extractor_prompt(files: PinnedFiles) -> str:
    where = files.where(TOOL_PROMPT)
    prompt = assigned_string(files.text(TOOL_PROMPT), "EXTRACTOR_PROMPT", where=where)
    try:
        names = {f for _, f, _, _ in string.Formatter().parse(prompt) if f is not None}
    except ValueError as exc:
        raise ExtractError(f"{where}: EXTRACTOR_PROMPT is not a format template ({exc})") \
            from None
    if not {"webpage_content", "goal"} <= names <= {"webpage_content", "goal", "url", "page"}:
        raise ExtractError(f"{where}: EXTRACTOR_PROMPT has the fields {sorted(names)}, not "
                           "webpage_content and goal")
    imported = any(isinstance(n, ast.ImportFrom) and any(a.name == "EXTRACTOR_PROMPT"
                                                         for a in n.names)
                   for n in ast.walk(files.tree(TOOL_VISIT)))
    if not imported:
        raise ExtractError(f"{files.where(TOOL_VISIT)}: does not use EXTRACTOR_PROMPT")
    return prompt


# ---------------------------------------------------------------- the parts and the loader


def _inference(files: PinnedFiles) -> dict[str, Any]:
    """The texts of DR-Venus's inference: its demo solver and its tool server."""
    solve = scope(files.tree(RUN_DEMO), "ResearchProblemSolver.solve")
    evidence, summary = _visit_failure_texts(files)
    return {
        "system_prompt": _system_prompt(files),
        "format_error": _parse_error_notice(files, solve),
        **_limit_notices(files, solve),
        "agent_sampling": _sampling(files, RUN_DEMO, "ResearchProblemSolver._call_llm_once"),
        "visit_failed_evidence": evidence,
        "visit_failed_summary": summary,
        "extractor_prompt": _extractor_prompt(files),
        "extractor_sampling": _sampling(files, TOOL_VISIT, "Visit.call_server"),
    }


# every part's fields, merged into one DrVenusTexts
PARTS: tuple[Callable[[PinnedFiles], dict[str, Any]], ...] = (_inference,)


def load_dr_venus_texts(store: ReferenceStore) -> DrVenusTexts:
    """DR-Venus's texts from the pinned files of ``store``. Raises
    :class:`~drvenus.reference.store.ReferenceError` (a file missing or of another version)
    or :class:`~drvenus.reference.extract.ExtractError` (a file without what is expected);
    both are one line naming the file."""
    files = PinnedFiles(store, SOURCE)
    values: dict[str, Any] = {}
    for part in PARTS:
        values.update(part(files))
    known = {f for f in DrVenusTexts.__dataclass_fields__ if f != "extra"}
    extra = {k: values.pop(k) for k in list(values) if k not in known}
    return DrVenusTexts(source=files.source.short, files=dict(files.hashes), extra=extra,
                        **values)


__all__ = ["INFERENCE_FILES", "PARTS", "PROFILE", "SOURCE", "DrVenusTexts",
           "load_dr_venus_texts"]
