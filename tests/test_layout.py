"""The package's layout rules, checked on the source: no import circles (every import counts,
lazy and type-only ones too), the layers of docs/ARCHITECTURE.md point down, no function
is longer than MAX_FUNCTION_LINES, and the small agent has one home (no lever named outside
``drvenus/small/``; ``protocol/`` imports nothing of it)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from drvenus.small.levers import Levers

SRC = Path(__file__).resolve().parents[1] / "src"


def _modules() -> dict[str, Path]:
    mods = {}
    for path in SRC.rglob("*.py"):
        name = ".".join(path.relative_to(SRC).with_suffix("").parts)
        mods[name.removesuffix(".__init__")] = path
    return mods


def _imports(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """The package's modules that ``name`` imports (a module's own package excluded)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in mods:
                target = target.rpartition(".")[0]
            if target and target != name and not name.startswith(target + "."):
                found.add(target)
    return found


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {name: _imports(name, path, mods) for name, path in mods.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (iterative Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def test_the_walk_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circles():
    assert _cycles(_graph()) == []


# Layers, lowest first: a module may import its own layer or lower ones, never a higher one.
LAYERS = [
    {"protocol", "text", "jsonl", "flags", "net", "records", "signals"},
    {"config", "reference", "questions", "corpus", "llm", "grading"},
    {"agent", "tools"},
    {"small"},  # the small agent: above the loop it steers, below what assembles it
    {"stack", "batch"},
    {"data", "train", "eval", "serve", "recipe"},
    {"cli", "__main__"},
]


def _layer(name: str) -> int:
    if name == "drvenus":  # the package root: only its version
        return 0
    top = name.split(".")[1]
    for level, members in enumerate(LAYERS):
        if top in members:
            return level
    raise AssertionError(f"{name}: not in a layer of LAYERS (add its package there)")


def test_imports_point_down():
    upward = [
        f"{src} -> {dst}"
        for src, targets in _graph().items()
        for dst in targets
        if _layer(dst) > _layer(src)
    ]
    assert upward == []


MAX_FUNCTION_LINES = 80  # decorators excluded, docstring included


def _long_functions(tree: ast.AST, limit: int) -> list[tuple[str, int]]:
    return [
        (node.name, node.end_lineno - node.lineno + 1)
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None and node.end_lineno - node.lineno + 1 > limit
    ]


def test_the_length_check_finds_a_long_function():
    body = "\n".join(f"    x{i} = {i}" for i in range(5))
    tree = ast.parse(f"def short():\n    return 1\n\nasync def long():\n{body}\n")
    assert _long_functions(tree, 5) == [("long", 6)]


def test_no_function_over_the_limit():
    long = [
        f"{path.relative_to(SRC)}: {name} ({lines} lines)"
        for path in sorted(SRC.rglob("*.py"))
        for name, lines in _long_functions(ast.parse(path.read_text(encoding="utf-8")),
                                           MAX_FUNCTION_LINES)
    ]
    assert long == []


# -- the small agent's one home (issue 41) ------------------------------------------------------

SMALL = SRC / "drvenus" / "small"


def _lever_mentions(text: str, names: tuple[str, ...]) -> set[str]:
    return {n for n in names if re.search(rf"(?<![\w.]){re.escape(n)}(?!\w)", text)}


def test_the_lever_check_finds_a_lever():
    assert _lever_mentions("x = options.span_rank\nspan_rank=1", ("span_rank",)) == {"span_rank"}
    assert not _lever_mentions("answer_spans_rank max_span_words", ("span_rank", "span_words"))


def test_no_lever_is_named_outside_the_small_agent():
    """A lever (a field of :class:`drvenus.small.levers.Levers`) is named only in
    ``drvenus/small/``: every other module gets the policy through the small agent."""
    names = Levers.names()
    found = [
        f"{path.relative_to(SRC)}: {', '.join(sorted(hits))}"
        for path in sorted(SRC.rglob("*.py"))
        if SMALL not in path.parents
        and (hits := _lever_mentions(path.read_text(encoding="utf-8"), names))
    ]
    assert found == []


def test_the_protocol_imports_nothing_of_the_small_agent():
    graph = _graph()
    assert not [f"{src} -> {dst}" for src, targets in graph.items() for dst in targets
                if src.startswith("drvenus.protocol") and dst.startswith("drvenus.small")]
