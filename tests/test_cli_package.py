"""The ``drvenus.cli`` package: every module imports on its own (no import circles through the
CLI), and every command reports a bad option the same way (one ``error: --flag: ...`` line)."""

from __future__ import annotations

import json
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import drvenus.cli as cli_package
from helpers.cli import ROOT, drvenus

CLI_MODULES = sorted(
    m.name for m in pkgutil.walk_packages(cli_package.__path__, prefix="drvenus.cli.")
)


def test_the_cli_package_has_its_command_modules():
    assert {"drvenus.cli.common", "drvenus.cli.agent", "drvenus.cli.serve"} <= set(CLI_MODULES)


@pytest.mark.parametrize("module", ["drvenus.cli", *CLI_MODULES])
def test_every_cli_module_imports_first_and_on_its_own(module):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True,
                          text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_nothing_below_the_cli_imports_it():
    src = ROOT / "src" / "drvenus"
    offenders = [
        str(path.relative_to(src))
        for path in src.rglob("*.py")
        if src / "cli" not in path.parents and path.name != "__main__.py"
        and any(line.lstrip().startswith(("from drvenus.cli", "import drvenus.cli"))
                for line in path.read_text(encoding="utf-8").splitlines())
    ]
    assert offenders == []


SEARCH_ERROR = "error: --search: unknown provider bogus; choose from serper, searxng, local"


def one_line(result) -> str:
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def test_ask_names_the_flag_and_its_choices(tmp_path):
    r = drvenus("ask", "q?", "--search", "bogus", cwd=tmp_path, timeout=120)
    assert one_line(r) == SEARCH_ERROR


def test_tools_serve_reports_a_bad_option_like_ask(tmp_path):
    r = drvenus("tools", "serve", "--search", "bogus", cwd=tmp_path, timeout=120)
    assert one_line(r) == SEARCH_ERROR


def test_run_reports_a_bad_option_like_ask(tmp_path: Path):
    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"id": "q0", "question": "Who?"}) + "\n")
    r = drvenus("run", str(questions), "-o", str(tmp_path / "out.jsonl"), "--search", "bogus",
                cwd=tmp_path, timeout=120)
    assert one_line(r) == SEARCH_ERROR


def test_data_clean_reports_a_bad_choice_like_ask(tmp_path):
    r = drvenus("data", "clean", "-i", str(tmp_path), "-o", str(tmp_path / "out"),
                "--correctness", "maybe", cwd=tmp_path, timeout=120)
    line = one_line(r)
    assert line.startswith("error: --correctness: ") and "'judge'" in line, line
