"""The embedded recipe end to end in miniature (``recipes/embedded/rebuild.py --mini``): data
through the real pipeline, SFT and IGPO on the real embedded weights, both adapters exported to
GGUF, and the three stages evaluated by ``drvenus eval``. A few rows and steps, so that the recipe
cannot rot; the full run and its numbers are in docs/BENCHMARKS.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="needs the train extra")
pytest.importorskip("peft", reason="needs the train extra")
pytest.importorskip("gguf", reason="needs the train extra")

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_recipe_rebuilds_in_miniature(tmp_path, embedded_gguf):
    out = tmp_path / "recipe"
    done = subprocess.run(
        [sys.executable, str(ROOT / "recipes/embedded/rebuild.py"), "--out", str(out), "--mini",
         "--base", str(embedded_gguf)],
        capture_output=True, text=True, timeout=1200,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # SFT: the curves on disk, an adapter, its GGUF
    history = [json.loads(x) for x in (out / "sft/history.jsonl").read_text().splitlines()]
    assert any("loss" in e for e in history) and any("eval_loss" in e for e in history)
    assert (out / "sft/final/adapter_config.json").is_file()
    # RL: one step from the SFT adapter, checkpointed as an adapter
    metrics = [json.loads(x) for x in (out / "rl/run/metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1] and "reward/outcome_mean" in metrics[0]
    ckpt = out / "rl/run/checkpoints/step-000001"
    assert (ckpt / "adapter_config.json").is_file()
    for gguf in (out / "sft.gguf", out / "rl.gguf"):
        assert 0 < gguf.stat().st_size < 20_000_000
    # evaluation: three stages on the recipe questions (HotpotQA-paragraphs: --hotpot N)
    table = (out / "eval-runs/table.md").read_text()
    assert [line.split("|")[1].strip() for line in table.splitlines()[2:]] == \
        ["base", "sft", "sft+rl"]
    rows = json.loads((out / "eval-runs/table.json").read_text())
    assert all(r["overall"] is not None and r["cost"]["seconds"] > 0 for r in rows)
    assert "sft+rl" in done.stdout


def test_the_default_base_is_the_embedded_model_where_drvenus_keeps_it(tmp_path, monkeypatch,
                                                                       embedded_gguf):
    """Without --base and without a models folder setting, the recipe finds the embedded GGUF
    under the cache (it once divided None by a file name)."""
    sys.path.insert(0, str(ROOT / "recipes/embedded"))
    from rebuild import default_base

    from drvenus.llm import embedded

    monkeypatch.setattr(embedded, "_installed_package_file", lambda: None)
    monkeypatch.delenv("DRVENUS_MODELS_DIR", raising=False)
    monkeypatch.setenv("DRVENUS_CACHE_DIR", str(tmp_path))
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / embedded.EMBEDDED_FILE).symlink_to(embedded_gguf)
    assert default_base() == tmp_path / "models" / embedded.EMBEDDED_FILE
