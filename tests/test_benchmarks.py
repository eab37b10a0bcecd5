"""Every benchmark script runs as documented: each on its smallest size, as a subprocess, must
exit 0 and print its table. Nothing here looks at timings (the numbers live in
docs/BENCHMARKS.md).

The scripts run from a scratch copy of benchmarks/ (with src/, tests/ and the shared data folder
linked next to it, where the scripts look for them), so what they write under benchmarks/out
never replaces a real run's results. A script whose optional extra is not installed (bm25s in
``bench``), or that needs the shared data folder when it is absent, is skipped with the reason.
Up to ``DRVENUS_BENCH_SMOKE_JOBS`` scripts (default 2) run at once.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import SHARED_DATA

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
TIMEOUT = 600  # seconds per script: a hung script fails, a slow machine does not
JOBS = int(os.environ.get("DRVENUS_BENCH_SMOKE_JOBS", "2"))


@dataclass(frozen=True)
class Case:
    """One script on its smallest size: ``expect`` must be in its stdout (its table's header);
    ``modules``: importable modules it needs; ``shared``: needs the shared data folder;
    ``skip``: why it never runs here."""

    script: str
    args: tuple[str, ...] = ()
    expect: str = "|"
    modules: tuple[str, ...] = ()
    shared: bool = False
    skip: str | None = None


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


CASES = (
    Case("bench_agent_overhead.py", ("--steps", "10", "--tokens-per-result", "100"),
         expect="ratio baseline / ours (server usage)"),
    Case("bench_context_strategies.py", ("--steps", "30"), expect="re-prefilled per step"),
    Case("bench_data_clean.py", ("--rows", "20", "--variants", "ours", "--workers", "1",
                                 "--dir", "{tmp}/data_clean"),
         expect="| variant |", shared=True),
    Case("bench_embedded_questions.py", ("--limit", "1", "--variants", "ours", "--parallel", "1",
                                         "--max-steps", "1", "--max-tokens", "48"),
         expect="well-formed"),
    Case("bench_fresh_install.py", skip="installs the project into a new venv from the network "
         "(minutes); run it by hand: python benchmarks/bench_fresh_install.py"),
    Case("bench_gpu.py", skip="its --smoke run (the GPU checks' code on the CPU, tiny shapes) is "
         "tests/test_bench_gpu.py; the full run needs a GPU (docs/SFT.md, Running on a GPU)"),
    Case("bench_ig.py", ("--turns", "3", "--clip-chars", "200", "--hidden", "64", "--layers", "1",
                         "--same-process"),
         expect="| path | CPU s | wall s | peak MiB |", modules=("torch", "transformers"),
         shared=True),
    Case("bench_heavy_headroom.py", ("--sample", "3"), expect="| member / combiner |",
         modules=("wordllama",)),
    Case("bench_hybrid_recall.py", ("--limit", "5"), expect="| engine | kind |",
         modules=("wordllama",)),
    Case("bench_index.py", ("--passages", "2000", "--queries", "20", "--budget", "10",
                            "--engines", "ours", "fts5",
                            *(("bm25s",) if _has("bm25s") else ())),
         expect="| engine |", shared=True),
    Case("bench_retrieval.py", (), expect="| engine |", modules=("bm25s",), shared=True),
    Case("bench_reader.py", ("--sets", "dev,hotpotqa", "--readers", "linear,neural,reranked",
                             "--limit", "3", "--out", "{tmp}/reader.json"),
         expect="top-1", shared=True),
    Case("bench_rl_rollout.py", ("--trajectories", "2", "--concurrency", "2", "--max-num-seqs",
                                 "2", "--think-tokens", "10", "--turns", "5"),
         expect="| server max_num_seqs | collector |", modules=("torch", "transformers"),
         shared=True),
    Case("bench_runtime.py", ("--part", "cache", "--steps", "1", "--max-tokens", "32"),
         expect="median evaluated tokens per later call"),
    Case("bench_sft_precision.py", ("--lengths", "1024", "--steps", "1", "--batch", "1"),
         expect="fp32 tok/s",
         modules=("torch", "transformers", "peft", "gguf"), shared=True),
    Case("bench_sft_tokenize.py", ("--repeat", "1", "--rows", "1", "--messages", "12",
                                   "--pack-lengths", "4096"),
         expect="| method | seconds", modules=("transformers",), shared=True),
    Case("bench_sft_train.py", ("--epochs", "1", "--trajectories", "1",
                                "--max-length", "128"), expect="tokens/s",
         modules=("torch", "transformers", "peft"), shared=True),
    Case("bench_tool_server.py", ("--requests", "40", "--clients", "4", "--processes", "1",
                                  "--distinct", "8"),
         expect="| mode | requests | req/s |", modules=("fastapi", "uvicorn")),
)


def skip_reason(case: Case) -> str | None:
    if case.skip:
        return case.skip
    missing = [m for m in case.modules if not _has(m)]
    if missing:
        return f"needs {', '.join(missing)} (an optional extra: see pyproject.toml)"
    if case.shared and not SHARED_DATA.is_dir():
        return f"needs the shared data folder {SHARED_DATA} (only present in the dev tree)"
    return None


def test_every_script_has_a_case() -> None:
    scripts = {p.name for p in BENCHMARKS.glob("bench_*.py")}
    assert scripts == {c.script for c in CASES}


def _workspace(tmp: Path) -> Path:
    """benchmarks/ copied to ``tmp/w/benchmarks``; src, tests, recipes and the shared data linked where
    the scripts find them (``parents[1]`` and ``parents[2]`` of a script)."""
    work = tmp / "w"
    shutil.copytree(BENCHMARKS, work / "benchmarks",
                    ignore=shutil.ignore_patterns("out", "__pycache__"))
    (work / "src").symlink_to(ROOT / "src")
    (work / "tests").symlink_to(ROOT / "tests")
    (work / "recipes").symlink_to(ROOT / "recipes")
    if SHARED_DATA.parent.is_dir():
        (tmp / "shared").symlink_to(SHARED_DATA.parent)
    return work


def _run(case: Case, work: Path, tmp: Path) -> subprocess.CompletedProcess[str]:
    args = [a.replace("{tmp}", str(tmp)) for a in case.args]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    try:
        return subprocess.run(
            [sys.executable, str(work / "benchmarks" / case.script), *args], cwd=work,
            env=env, capture_output=True, text=True, timeout=TIMEOUT,
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        return subprocess.CompletedProcess(exc.cmd, -9, out, f"timed out after {TIMEOUT} s")


@pytest.fixture(scope="module")
def runs(request, tmp_path_factory, embedded_gguf) -> dict[str, Future]:
    """The selected, runnable cases, started at once (``JOBS`` at a time)."""
    selected = {
        item.callspec.params["case"].script
        for item in request.session.items
        if getattr(item, "originalname", "") == "test_benchmark_runs"
    }
    tmp = tmp_path_factory.mktemp("benchmarks")
    work = _workspace(tmp)
    pool = ThreadPoolExecutor(max_workers=max(1, JOBS))
    futures = {
        c.script: pool.submit(_run, c, work, tmp)
        for c in CASES
        if c.script in selected and skip_reason(c) is None
    }
    yield futures
    pool.shutdown(wait=True)


@pytest.mark.parametrize("case", CASES, ids=[c.script for c in CASES])
def test_benchmark_runs(case: Case, runs: dict[str, Future]) -> None:
    reason = skip_reason(case)
    if reason:
        pytest.skip(reason)
    done = runs[case.script].result()
    tail = f"\n--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}"
    assert done.returncode == 0, f"{case.script} exited {done.returncode}{tail}"
    assert case.expect in done.stdout, f"{case.script} printed no table{tail}"
