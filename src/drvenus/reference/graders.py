"""The benchmarks' official grader texts, taken from their pinned files by parsing them.

drvenus holds no grader text of its own for ``--grader official``: each function here reads the
pinned official files through a :class:`~drvenus.reference.store.ReferenceStore` (hash checked)
and takes out, with :mod:`ast` only, what the official code sends its judge: the prompt template
(filled with :meth:`str.format` and the same keywords, as the official code fills it), a system
message where its sampler adds one, the request fields its judge call sets (sampling, token cap,
structured output), and the judge model it names. How a reply is scored is drvenus's own code
(:mod:`drvenus.eval.official`); nothing fetched is ever run.

- ``browsecomp``: simple-evals (BrowseComp, used for BrowseComp-ZH too): ``GRADER_TEMPLATE``
  of ``browsecomp_eval.py``; the grading sampler built in ``simple_evals.py`` (its model, system
  message and token cap, the sampler's default temperature from
  ``sampler/chat_completion_sampler.py``).
- ``xbench``: xbench-evals: ``LLM_JUDGE_PROMPT`` of ``eval_grader.py``; the judge model that
  ``grade_question`` asks for, as ``language_models.py`` resolves it (its request sets nothing
  but the model and the messages).
- ``hle``: HLE: ``JUDGE_PROMPT`` of ``hle_eval/run_judge_results.py``; its judge call's token
  cap, the structured verdict it asks for (the fields of ``ExtractedAnswer``) and the default
  ``--judge`` model.
"""

from __future__ import annotations

import ast
import string
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from drvenus.reference import extract
from drvenus.reference.extract import ExtractError
from drvenus.reference.store import ReferenceStore, sha256


@dataclass(frozen=True)
class PinnedFile:
    """One official file a grader was read from: where, at which commit, with which hash."""

    source: str
    repo: str
    commit: str
    path: str
    sha256: str

    def to_dict(self) -> dict[str, str]:
        return {"source": self.source, "repo": self.repo, "commit": self.commit,
                "path": self.path, "sha256": self.sha256}


@dataclass(frozen=True)
class GraderTexts:
    """What one official grader sends its judge.

    ``template`` is filled with ``template.format(**{f: ... for f in fields})``; ``system``, when
    set, is sent as a system message before it; ``request`` holds the request fields the
    official judge call sets besides the model and the messages (nothing else is sent);
    ``verdict_fields``: the fields of a structured verdict (HLE), in order."""

    key: str
    title: str
    template: str
    fields: tuple[str, ...]
    files: tuple[PinnedFile, ...]
    system: str | None = None
    request: Mapping[str, Any] = field(default_factory=dict)
    judge_model: str | None = None
    verdict_fields: tuple[tuple[str, str], ...] = ()

    def fill(self, **values: str) -> str:
        """The prompt, as the official code builds it (``str.format`` with keywords)."""
        missing = set(self.fields) - set(values)
        if missing:
            raise ValueError(f"{self.title}: missing template fields {sorted(missing)}")
        return self.template.format(**values)

    def messages(self, **values: str) -> list[dict[str, str]]:
        """The judge's messages: the system message (if any), then the filled prompt."""
        out = [{"role": "system", "content": self.system}] if self.system else []
        return [*out, {"role": "user", "content": self.fill(**values)}]


# ---------------------------------------------------------------------------- AST helpers
class _File:
    """One pinned file, read (hash checked) and parsed."""

    def __init__(self, store: ReferenceStore, source: str, path: str) -> None:
        src = store.source(source)
        data = store.read_bytes(source, path)
        self.where = f"{src.name}/{path}"
        self.text = data.decode("utf-8")
        with warnings.catch_warnings():  # official strings may hold escapes such as "\%"
            warnings.simplefilter("ignore", SyntaxWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            self.tree = extract.parse(self.text, self.where)
        self.pinned = PinnedFile(src.name, src.repo, src.commit, path, sha256(data))

    def scope(self, within: str | None) -> ast.AST:
        try:
            return extract.scope(self.tree, within)
        except ExtractError as exc:
            raise ExtractError(f"{self.where}: {exc}") from None

    def value(self, name: str, within: str | None = None) -> ast.AST:
        """The expression first assigned to ``name``."""
        for value in extract.assignments(self.scope(within), name):
            return value
        raise ExtractError(f"{self.where}: nothing assigned to {name}"
                           + (f" in {within}" if within else ""))

    def text_of(self, name: str, within: str | None = None) -> str:
        return _text(self.value(name, within), self.where)

    def calls(self, func: str, within: str | None = None) -> list[ast.Call]:
        return [n for n in ast.walk(self.scope(within))
                if isinstance(n, ast.Call) and _called(n, func)]


def _called(call: ast.Call, func: str) -> bool:
    f = call.func
    return (isinstance(f, ast.Name) and f.id == func) or (
        isinstance(f, ast.Attribute) and f.attr == func)


def _text(node: ast.AST, where: str) -> str:
    """A string literal, or ``<string literal>.strip()`` (how the official templates are
    written); anything else is an :class:`ExtractError`."""
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "strip" and not node.args and not node.keywords):
        return _text(node.func.value, where).strip()
    try:
        return extract.string_of(node)
    except ExtractError as exc:
        raise ExtractError(f"{where}: {exc}") from None


def _keywords(call: ast.Call) -> dict[str, ast.AST]:
    return {kw.arg: kw.value for kw in call.keywords if kw.arg is not None}


def _literal(node: ast.AST, where: str) -> Any:
    try:
        return ast.literal_eval(node)
    except ValueError:
        raise ExtractError(f"{where}: line {getattr(node, 'lineno', '?')}: not a literal"
                           ) from None


def _defaults(fn: ast.FunctionDef | ast.AsyncFunctionDef, where: str) -> dict[str, Any]:
    """The literal defaults of a function's parameters."""
    args = fn.args
    positional = args.posonlyargs + args.args
    out = {a.arg: _literal(d, where)
           for a, d in zip(positional[len(positional) - len(args.defaults):], args.defaults,
                           strict=True)}
    out.update({a.arg: _literal(d, where)
                for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is not None})
    return out


def _fields(template: str, title: str) -> tuple[str, ...]:
    names = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    if any(not n.isidentifier() for n in names):
        raise ExtractError(f"{title}: the template has positional or odd fields {names}")
    return tuple(dict.fromkeys(names))


def _expect_fields(template: str, fields: set[str], title: str) -> tuple[str, ...]:
    found = _fields(template, title)
    if set(found) != fields:
        raise ExtractError(f"{title}: the template fills {sorted(found)}, the official code "
                           f"passes {sorted(fields)}")
    return found


def _format_keywords(file: _File, name: str, within: str) -> set[str]:
    """The keywords with which ``within`` calls ``<name>.format(...)``."""
    for call in file.calls("format", within):
        f = call.func
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == name:
            return set(_keywords(call))
    raise ExtractError(f"{file.where}: {within} does not fill {name}")


# ---------------------------------------------------------------------------- simple-evals
def browsecomp_grader(store: ReferenceStore) -> GraderTexts:
    """simple-evals' BrowseComp grader: ``GRADER_TEMPLATE``, and the grading sampler of
    ``simple_evals.py`` (model, system message, token cap; temperature: the sampler's default).
    """
    title = "simple-evals BrowseComp grader"
    evals = _File(store, "simple-evals", "browsecomp_eval.py")
    runner = _File(store, "simple-evals", "simple_evals.py")
    sampler = _File(store, "simple-evals", "sampler/chat_completion_sampler.py")

    template = evals.text_of("GRADER_TEMPLATE")
    fields = _expect_fields(template, _format_keywords(evals, "GRADER_TEMPLATE", "grade_sample"),
                            title)

    built = runner.value("grading_sampler", "main")
    if not (isinstance(built, ast.Call) and _called(built, "ChatCompletionSampler")):
        raise ExtractError(f"{runner.where}: grading_sampler is not a ChatCompletionSampler")
    given = _keywords(built)
    init = sampler.scope("ChatCompletionSampler.__init__")
    assert isinstance(init, ast.FunctionDef | ast.AsyncFunctionDef)
    settings = _defaults(init, sampler.where)
    system: str | None = None
    for name, node in given.items():
        if name == "system_message" and isinstance(node, ast.Name):
            system = sampler.text_of(node.id)  # a constant of the sampler module
        else:
            settings[name] = _literal(node, runner.where)
    settings.setdefault("system_message", None)
    if system is None and settings["system_message"] is not None:
        system = str(settings["system_message"])

    # what the sampler's request sets: check that it is what is taken here
    sent = set()
    for call in sampler.calls("create", "ChatCompletionSampler.__call__"):
        sent |= set(_keywords(call))
    if sent != {"model", "messages", "temperature", "max_tokens"}:
        raise ExtractError(f"{sampler.where}: the sampler's request sets {sorted(sent)}")
    return GraderTexts(
        key="browsecomp", title=title, template=template, fields=fields,
        files=(evals.pinned, runner.pinned, sampler.pinned), system=system,
        request={"temperature": settings["temperature"], "max_tokens": settings["max_tokens"]},
        judge_model=settings.get("model"),
    )


# ---------------------------------------------------------------------------- xbench-evals
def xbench_grader(store: ReferenceStore) -> GraderTexts:
    """xbench-evals' judge: ``LLM_JUDGE_PROMPT``; the model ``grade_question`` asks for, as
    ``get_llm_response`` resolves it; the request sets the model and the messages only."""
    title = "xbench-evals judge"
    grader = _File(store, "xbench-evals", "eval_grader.py")
    models = _File(store, "xbench-evals", "language_models.py")

    template = grader.text_of("LLM_JUDGE_PROMPT")
    fields = _expect_fields(
        template, _format_keywords(grader, "LLM_JUDGE_PROMPT", "grade_question"), title)
    asks = [_keywords(c) for c in grader.calls("get_llm_response", "grade_question")]
    judged = [k for k in asks if "judge" in k and _literal(k["judge"], grader.where) is True]
    if len(judged) != 1 or "model" not in judged[0]:
        raise ExtractError(f"{grader.where}: expected one judge call in grade_question")
    alias = _literal(judged[0]["model"], grader.where)

    model = None
    think = False
    for node in ast.walk(models.scope("get_llm_response")):
        if not isinstance(node, ast.match_case):
            continue
        pattern = node.pattern
        if not (isinstance(pattern, ast.MatchValue)
                and isinstance(pattern.value, ast.Constant) and pattern.value.value == alias):
            continue
        for stmt in node.body:
            for call in (n for n in ast.walk(stmt) if isinstance(n, ast.Call)):
                if _called(call, "get_api_response"):
                    kws = _keywords(call)
                    model = _literal(kws["model"], models.where)
                    think = "think_mode" in kws and bool(_literal(kws["think_mode"],
                                                                  models.where))
    if model is None:
        raise ExtractError(f"{models.where}: get_llm_response does not resolve {alias!r}")
    if think:
        raise ExtractError(f"{models.where}: the judge {alias!r} is asked in think mode")
    # without think mode the request is the plain one: the model and the messages
    plain = [set(_keywords(c)) for c in models.calls("create", "get_api_response")]
    if {"model", "messages"} not in plain:
        raise ExtractError(f"{models.where}: no plain request in get_api_response")
    return GraderTexts(key="xbench", title=title, template=template, fields=fields,
                       files=(grader.pinned, models.pinned), request={}, judge_model=model)


# ---------------------------------------------------------------------------- HLE
_SCHEMA_TYPES = {"str": "string", "int": "integer", "float": "number", "bool": "boolean"}


def _field_schema(annotation: ast.AST, where: str) -> dict[str, Any]:
    """A JSON schema of one pydantic field annotation (``str``, ``int``, ``Literal[...]``)."""
    if isinstance(annotation, ast.Name) and annotation.id in _SCHEMA_TYPES:
        return {"type": _SCHEMA_TYPES[annotation.id]}
    if (isinstance(annotation, ast.Subscript) and isinstance(annotation.value, ast.Name)
            and annotation.value.id == "Literal"):
        inner = annotation.slice
        values = [_literal(e, where) for e in
                  (inner.elts if isinstance(inner, ast.Tuple) else [inner])]
        kinds = {type(v) for v in values}
        if len(kinds) != 1 or kinds.pop().__name__ not in _SCHEMA_TYPES:
            raise ExtractError(f"{where}: a Literal of mixed or odd values {values}")
        return {"type": _SCHEMA_TYPES[type(values[0]).__name__], "enum": values}
    raise ExtractError(f"{where}: an unexpected field type {ast.unparse(annotation)}")


def hle_grader(store: ReferenceStore) -> GraderTexts:
    """HLE's judge: ``JUDGE_PROMPT``; the judge call of ``extract_answer`` (its token cap and
    structured verdict, the fields of the ``response_format`` class); the default ``--judge``."""
    title = "HLE judge"
    judge = _File(store, "hle", "hle_eval/run_judge_results.py")
    template = judge.text_of("JUDGE_PROMPT")
    fields = _expect_fields(template, _format_keywords(judge, "JUDGE_PROMPT", "extract_answer"),
                            title)
    parses = judge.calls("parse", "extract_answer")
    if len(parses) != 1:
        raise ExtractError(f"{judge.where}: expected one judge call in extract_answer")
    kws = _keywords(parses[0])
    fmt = kws.get("response_format")
    if not isinstance(fmt, ast.Name):
        raise ExtractError(f"{judge.where}: the judge call names no response_format class")
    cls = judge.scope(fmt.id)
    verdict = tuple((n.target.id, ast.unparse(n.annotation)) for n in ast.iter_child_nodes(cls)
                    if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name))
    props = {n.target.id: _field_schema(n.annotation, judge.where)
             for n in ast.iter_child_nodes(cls)
             if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    request: dict[str, Any] = {
        name: _literal(node, judge.where) for name, node in kws.items()
        if name not in ("model", "messages", "response_format")
    }
    request["response_format"] = {
        "type": "json_schema",
        "json_schema": {
            "name": fmt.id, "strict": True,
            "schema": {"type": "object", "title": fmt.id, "properties": props,
                       "required": list(props), "additionalProperties": False},
        },
    }
    model = None
    for call in judge.calls("add_argument"):
        if call.args and isinstance(call.args[0], ast.Constant) and call.args[0].value == "--judge":
            model = _literal(_keywords(call)["default"], judge.where)
    return GraderTexts(key="hle", title=title, template=template, fields=fields,
                       files=(judge.pinned,), request=request, judge_model=model,
                       verdict_fields=verdict)


GRADER_TEXTS: dict[str, Callable[[ReferenceStore], GraderTexts]] = {
    "browsecomp": browsecomp_grader,
    "xbench": xbench_grader,
    "hle": hle_grader,
}


def grader_texts(key: str, store: ReferenceStore) -> GraderTexts:
    """The official texts of grader ``key`` (``browsecomp``, ``xbench``, ``hle``)."""
    try:
        make = GRADER_TEXTS[key]
    except KeyError:
        raise ValueError(f"no official grader texts for {key!r} "
                         f"(known: {', '.join(GRADER_TEXTS)})") from None
    return make(store)


__all__ = [
    "GRADER_TEXTS",
    "GraderTexts",
    "PinnedFile",
    "browsecomp_grader",
    "grader_texts",
    "hle_grader",
    "xbench_grader",
]
