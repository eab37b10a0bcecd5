"""``benchmarks/bench_gpu.py --smoke`` (issue 45): the GPU checks' code, run on the CPU with tiny
shapes so that it cannot rot while no GPU is at hand. Every check must leave its rows in
``gpu.json`` without an error and with sane numbers, and ``gpu.md`` its tables; nothing here
looks at timings beyond their being positive."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="needs the train extra")
pytest.importorskip("transformers", reason="needs the train extra")
pytest.importorskip("peft", reason="needs the train extra")

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_gpu.py"


def _run(out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    done = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--out", str(out), *args],
                          capture_output=True, text=True, timeout=600, cwd=out, env=env)
    assert done.returncode == 0, (f"exit {done.returncode}\n--- stdout\n{done.stdout[-4000:]}"
                                  f"\n--- stderr\n{done.stderr[-4000:]}")
    return done


@pytest.fixture(scope="module")
def smoke(tmp_path_factory, embedded_tokenizer_dir: Path) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("bench-gpu")
    done = _run(out, "--tokenizer", str(embedded_tokenizer_dir))
    data = json.loads((out / "gpu.json").read_text())
    return {"out": out, "stdout": done.stdout, "meta": data["meta"], "rows": data["rows"]}


def _rows(smoke: dict[str, Any], check: int) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in smoke["rows"] if r["check"] == check}


def _finite(x: Any) -> bool:
    return isinstance(x, int | float) and math.isfinite(x)


def test_every_check_ran_without_an_error(smoke):
    assert smoke["meta"]["mode"] == "smoke" and smoke["meta"]["complete"] is True
    assert {r["check"] for r in smoke["rows"]} == {1, 2, 3, 4}
    bad = [(r["name"], r["status"], r["error"]) for r in smoke["rows"] if r["status"] != "ok"]
    assert bad == []
    assert smoke["meta"]["matmul_tflops"] > 0


def test_sft_at_shape_ours_and_the_baseline(smoke):
    rows = _rows(smoke, 1)
    assert set(rows) == {"128, LoRA", "256, LoRA", "128, all weights", "256, LoRA, packed rows"}
    for name, row in rows.items():
        v = row["values"]
        assert v["ours tok/s"] > 0 and 0 < v["ours MFU"] and _finite(v["ours 1st loss"]), name
        assert v["tokens/seq"] > 0 and row["details"]["trained_tokens"] > 0
        if "packed" in name:
            assert row["details"]["rows_per_sequence"] == [4, 4]  # rows never attend across
            continue
        assert v["baseline tok/s"] > 0 and v["ours / baseline"] > 0
        # the same model, rows and labels: the first step's loss is the same
        assert abs(v["ours 1st loss"] - v["baseline 1st loss"]) < 1e-3, name


def test_cpu_and_gpu_losses_agree_and_the_checkpoint_answers(smoke):
    rows = _rows(smoke, 2)
    ref = rows["CPU reference, fp32"]["values"]["losses"]
    assert len(ref) == 5 and all(_finite(x) for x in ref)
    for precision in ("fp32", "bf16"):
        row = rows[f"CPU {precision} vs CPU"]["values"]
        assert len(row["losses"]) == 5 and all(_finite(x) for x in row["losses"])
        assert row["agree"] is True and row["max rel diff vs CPU"] <= 2e-2
    ask = rows["drvenus ask --model final/"]["values"]
    assert ask["exit"] in (0, 1) and ask["termination"]


def test_embedded_recipe_sft_and_igpo_steps(smoke):
    rows = _rows(smoke, 3)
    sft = rows["SFT, recipes/embedded/sft.yaml"]["values"]
    assert sft["s/step"] > 0 and sft["tokens/s"] > 0 and all(_finite(x) for x in sft["losses"])
    rl = rows["IGPO, recipes/embedded/rl.yaml"]["values"]
    assert rl["steps"] >= 1 and rl["s/step"] > 0 and rl["recipe RL est. s"] > 0


def test_ig_scoring_paths_agree(smoke):
    rows = _rows(smoke, 4)
    assert len(rows) == 6
    timed = [r["values"] for name, r in rows.items() if name != "model and trajectory"]
    assert all(v["seconds"] > 0 and v["x last-token forward"] > 0 for v in timed)
    diffs = [v["max abs score diff vs ours"] for v in timed if "max abs score diff vs ours" in v]
    assert len(diffs) == 2 and all(d is not None and d < 1e-3 for d in diffs)


def test_markdown_table_and_printed_rows(smoke):
    md = (smoke["out"] / "gpu.md").read_text()
    for check in ("## 1. SFT at DR-Venus's shape", "## 2. CPU and GPU agree",
                  "## 3. The embedded recipe on the GPU", "## 4. IG scoring at 4B shape"):
        assert check in md
    assert "| case | status | s | tokens/seq | ours tok/s |" in md
    assert smoke["stdout"].count("[check ") == len(smoke["rows"])


def test_byte_tokenizer_fallback(tmp_path):
    """Without a prepared tokenizer the script builds a byte-level ChatML one (the device has
    no network to fetch the embedded model's)."""
    _run(tmp_path, "--tokenizer", "byte", "--only", "4")
    data = json.loads((tmp_path / "gpu.json").read_text())
    assert data["meta"]["tokenizer"].startswith("byte-level")
    assert [r["status"] for r in data["rows"]] == ["ok"] * 6
