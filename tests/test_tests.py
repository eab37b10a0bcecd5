"""The test suite's own layout (issue 43): no test file imports another; what tests share lives
in tests/helpers/ (or the helper modules beside the tests, or conftest fixtures)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def test_files_imported():
    source = "import os\nfrom test_a import x\ndef f():\n    import test_b\n"
    assert _imported_test_files(source) == {"test_a", "test_b"}


def _imported_test_files(source: str) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.split(".")[0])
    return {name for name in found if name.startswith("test_")}


def test_no_test_file_imports_another():
    offenders = {
        path.name: sorted(names)
        for path in sorted(TESTS.glob("test_*.py"))
        if (names := _imported_test_files(path.read_text(encoding="utf-8")))
    }
    assert offenders == {}, "move shared helpers to tests/helpers/: " + str(offenders)
