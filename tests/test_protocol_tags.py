"""The protocol's tags are written only in ``src/drvenus/protocol/``: any other module that
reads or writes a turn asks the protocol (its constants, readers and renderers). Docstrings and
comments may name a tag; code may not spell one."""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "drvenus"
TAG = re.compile(r"</?(think|tool_call|answer|tool_response)>")


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the string constants that stand alone as statements (docstrings)."""
    return {id(node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}


def tag_literals(source: str) -> list[tuple[int, str]]:
    tree = ast.parse(source)
    skip = _docstrings(tree)
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in skip and TAG.search(node.value)]


def test_the_check_finds_a_tag_in_code_not_in_a_docstring():
    code = '"""Reads <answer> blocks."""\nX = "<answer>"\ny = f"{X}</think>"\n# <think>\n'
    assert [line for line, _ in tag_literals(code)] == [2, 3]


def test_no_tag_literal_outside_protocol():
    found = [f"{path.relative_to(SRC)}:{line}: {text[:60]!r}"
             for path in sorted(SRC.rglob("*.py")) if "protocol" not in path.relative_to(SRC).parts
             for line, text in tag_literals(path.read_text(encoding="utf-8"))]
    assert found == []


def test_no_protocol_name_comparison_outside_the_registry():
    """Profiles are looked up by name (drvenus.reference.profiles), never compared."""
    from drvenus.protocol.profiles import PROTOCOLS

    registry = {Path("protocol/profiles.py"), Path("reference/profiles.py")}
    found = []
    for path in sorted(SRC.rglob("*.py")):
        if path.relative_to(SRC) in registry:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Compare) and any(
                    isinstance(o, ast.Constant) and o.value in PROTOCOLS
                    for o in (node.left, *node.comparators)):
                found.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert found == []
