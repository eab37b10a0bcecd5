"""Take strings and constants out of official Python source by parsing it, never running it.

The official files are read as text and parsed with :mod:`ast`; only literal nodes are turned
into values (string constants, their ``+`` and implicit concatenations, numbers, tuples, lists
and dicts of those). An f-string becomes a template whose placeholders are the source of its
expressions (``f"Date: {today}"`` -> ``"Date: {today}"``), for the caller to fill.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from typing import Any


class ExtractError(ValueError):
    """The official source does not hold what drvenus expects to find in it."""


def parse(text: str, where: str = "<reference>") -> ast.Module:
    try:
        return ast.parse(text, filename=where)
    except SyntaxError as exc:
        raise ExtractError(f"{where}: not Python source ({exc.msg}, line {exc.lineno})") from None


def string_of(node: ast.AST, *, fstrings: bool = False) -> str:
    """The string an expression spells: a constant, ``a + b`` of strings, or (with ``fstrings``)
    an f-string as a template; anything else is an :class:`ExtractError`."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return string_of(node.left, fstrings=fstrings) + string_of(node.right, fstrings=fstrings)
    if isinstance(node, ast.JoinedStr) and fstrings:
        parts: list[str] = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(str(value.value).replace("{", "{{").replace("}", "}}"))
            elif isinstance(value, ast.FormattedValue):
                parts.append("{" + ast.unparse(value.value) + "}")
        return "".join(parts)
    raise ExtractError(f"line {getattr(node, 'lineno', '?')}: not a string literal "
                       f"({type(node).__name__})")


def literal_of(node: ast.AST) -> Any:
    """A literal value (numbers, strings, tuples, lists, dicts, None, booleans)."""
    try:
        return ast.literal_eval(node)
    except ValueError:
        return string_of(node)


def scope(tree: ast.Module, within: str | None) -> ast.AST:
    """The module, or the first class or function called ``within`` (dotted for nesting:
    ``"Agent.run"``)."""
    if within is None:
        return tree
    node: ast.AST = tree
    for part in within.split("."):
        found = next(
            (n for n in ast.walk(node)
             if isinstance(n, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
             and n.name == part),
            None,
        )
        if found is None:
            raise ExtractError(f"no class or function {within!r}")
        node = found
    return node


def assignments(node: ast.AST, name: str) -> Iterator[ast.AST]:
    """The values assigned to ``name`` (a plain name or an attribute ending in it) under
    ``node``, in source order; annotated assignments and keyword defaults included."""
    for n in ast.walk(node):
        if isinstance(n, ast.Assign):
            for target in n.targets:
                if _names(target, name):
                    yield n.value
        elif isinstance(n, ast.AnnAssign) and n.value is not None and _names(n.target, name):
            yield n.value


def _names(target: ast.AST, name: str) -> bool:
    return (isinstance(target, ast.Name) and target.id == name) or (
        isinstance(target, ast.Attribute) and target.attr == name)


def assigned_string(text: str, name: str, *, within: str | None = None,
                    fstrings: bool = False, where: str = "<reference>") -> str:
    """The string first assigned to ``name`` (module level, or inside ``within``)."""
    for value in assignments(scope(parse(text, where), within), name):
        try:
            return string_of(value, fstrings=fstrings)
        except ExtractError:
            continue
    raise ExtractError(f"{where}: no string assigned to {name}"
                       + (f" in {within}" if within else ""))


def assigned_literal(text: str, name: str, *, within: str | None = None,
                     where: str = "<reference>") -> Any:
    """The literal first assigned to ``name`` (module level, or inside ``within``)."""
    for value in assignments(scope(parse(text, where), within), name):
        try:
            return literal_of(value)
        except (ExtractError, ValueError, SyntaxError):
            continue
    raise ExtractError(f"{where}: no literal assigned to {name}"
                       + (f" in {within}" if within else ""))


def strings(text: str, *, within: str | None = None, fstrings: bool = True,
            where: str = "<reference>") -> list[str]:
    """Every string literal under ``within`` (f-strings as templates), in source order; parts
    of a larger string expression are given once, as the whole."""
    root = scope(parse(text, where), within)
    out: list[str] = []
    inner: set[int] = set()
    for n in ast.walk(root):
        if id(n) in inner:
            continue
        if isinstance(n, ast.Constant | ast.JoinedStr | ast.BinOp):
            try:
                out.append((getattr(n, "lineno", 0), getattr(n, "col_offset", 0),
                            string_of(n, fstrings=fstrings)))  # type: ignore[arg-type]
            except ExtractError:
                continue
            inner.update(id(c) for c in ast.walk(n))
    return [s for *_, s in sorted(out)]  # type: ignore[misc]


def the_string(text: str, test: Callable[[str], bool], *, within: str | None = None,
               what: str = "string", where: str = "<reference>") -> str:
    """The one string literal (under ``within``) for which ``test`` holds."""
    found = [s for s in strings(text, within=within, where=where) if test(s)]
    if len(found) != 1:
        raise ExtractError(f"{where}: expected one {what}, found {len(found)}")
    return found[0]


def call_keywords(text: str, func: str, *, within: str | None = None,
                  where: str = "<reference>") -> list[dict[str, Any]]:
    """The literal keyword arguments of each call to ``func`` (a name or an attribute ending in
    it) under ``within``; non-literal values are left out."""
    calls: list[dict[str, Any]] = []
    for n in ast.walk(scope(parse(text, where), within)):
        if isinstance(n, ast.Call) and _names(n.func, func):
            kwargs: dict[str, Any] = {}
            for kw in n.keywords:
                if kw.arg is None:
                    continue
                try:
                    kwargs[kw.arg] = literal_of(kw.value)
                except (ExtractError, ValueError, SyntaxError):
                    pass
            calls.append(kwargs)
    return calls


def literal_text(node: ast.AST, where: str) -> str:
    """A string literal's text: constants, their ``+``, and f-strings without placeholders
    (``f"a\\n" "b"`` is one f-string to the parser) as their plain text."""
    if isinstance(node, ast.JoinedStr):
        if any(not isinstance(v, ast.Constant) for v in node.values):
            raise ExtractError(f"{where}: line {node.lineno}: a message with placeholders")
        return "".join(str(v.value) for v in node.values)  # type: ignore[attr-defined]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return literal_text(node.left, where) + literal_text(node.right, where)
    return string_of(node)


def dict_value(node: ast.AST, key: str) -> ast.AST | None:
    """The value node of the constant ``key`` in a dict display, or None."""
    if not isinstance(node, ast.Dict):
        return None
    for k, v in zip(node.keys, node.values, strict=True):
        if isinstance(k, ast.Constant) and k.value == key:
            return v
    return None
