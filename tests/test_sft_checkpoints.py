"""SFT checkpoints that a stop cannot break (issue 43): Ctrl-C or SIGTERM while a checkpoint is
written waits for it, and ``--resume`` skips (and names) a checkpoint cut short by a kill,
resuming from the last complete one."""

from __future__ import annotations

import json
import logging
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from drvenus import signals
from drvenus.train.sft.config import SFTConfigError
from drvenus.train.sft.trainer import _resume_point, checkpoints, latest_checkpoint

STATES = st.sampled_from(["complete", "missing", "truncated", "not-a-dict"])


def _write(output: Path, step: int, state: str) -> Path:
    folder = output / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"weights")
    text = {"complete": json.dumps({"global_step": step}), "truncated": '{"global_step": ',
            "not-a-dict": "[]"}.get(state)
    if text is not None:
        (folder / "trainer_state.json").write_text(text)
    return folder


@settings(max_examples=40, deadline=None)
@given(found=st.dictionaries(st.integers(1, 120), STATES, max_size=6), resume=st.booleans())
def test_resume_takes_the_newest_complete_checkpoint(tmp_path_factory, found, resume):
    output = tmp_path_factory.mktemp("sft")
    for step, state in found.items():
        _write(output, step, state)
    complete = sorted(s for s, state in found.items() if state == "complete")
    expected = str(output / f"checkpoint-{complete[-1]}") if complete else None
    assert latest_checkpoint(output) == expected
    assert [n for n, _, _ in checkpoints(output)] == sorted(found)
    config = SimpleNamespace(output=str(output), resume=resume)
    cut = [s for s, state in found.items() if state != "complete"
           and (not complete or s > complete[-1])]
    if resume:
        assert _resume_point(config) == expected  # type: ignore[arg-type]
    elif found:
        with pytest.raises(SFTConfigError, match="--resume") as info:
            _resume_point(config)  # type: ignore[arg-type]
        assert ("incomplete" in str(info.value)) == bool(cut)
        for step in cut:
            assert f"checkpoint-{step}" in str(info.value)
    else:
        assert _resume_point(config) is None  # type: ignore[arg-type]


def test_resume_names_the_checkpoint_it_skips(tmp_path, caplog):
    _write(tmp_path, 8, "complete")
    _write(tmp_path, 10, "missing")  # the run was killed while writing it
    with caplog.at_level(logging.WARNING):
        found = _resume_point(SimpleNamespace(output=str(tmp_path), resume=True))  # type: ignore[arg-type]
    assert found == str(tmp_path / "checkpoint-8")
    assert "checkpoint-10 is incomplete" in caplog.text and "checkpoint-8" in caplog.text


# --------------------------------------------------------------------------- a real run
transformers = pytest.importorskip("transformers", reason="needs the train extra")


@pytest.fixture()
def sigterm_installed():
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signals._received.clear()
    signals.install()
    yield
    for s, handler in old.items():
        signal.signal(s, handler)
    signals._received.clear()


def test_sigterm_during_a_save_leaves_a_complete_checkpoint_that_resumes(
    tiny_policy, shared_data, tmp_path, monkeypatch, sigterm_installed, caplog
):
    from drvenus.train.sft import SFTConfig, read_conversations, train

    rows = read_conversations(shared_data / "trajectories" / "dr-venus-sft")
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"messages": [
        {**m, "content": m["content"][:200]} for m in r if m["role"] != "system"][:4]}) + "\n"
        for r in rows))
    config = SFTConfig(train=str(data), model=str(tiny_policy), output=str(tmp_path / "out"),
                       max_length=96, global_batch_size=2, max_steps=6, save_steps=2,
                       logging_steps=1, val_fraction=0.0, warmup_ratio=0.0)
    original = transformers.Trainer._save_rng_state
    saves = []

    def stopped_mid_save(self, output_dir):  # inside the save, before trainer_state.json
        saves.append(output_dir)
        if len(saves) == 2:
            signal.raise_signal(signal.SIGTERM)
        return original(self, output_dir)

    monkeypatch.setattr(transformers.Trainer, "_save_rng_state", stopped_mid_save)
    with pytest.raises(KeyboardInterrupt):
        train(config)
    monkeypatch.setattr(transformers.Trainer, "_save_rng_state", original)
    out = Path(config.output)
    assert [(n, ok) for n, _, ok in checkpoints(out)] == [(2, True), (4, True)]
    assert {"optimizer.pt", "scheduler.pt"} <= {p.name for p in (out / "checkpoint-4").iterdir()}

    # a kill while writing checkpoint-4 (nothing can defer SIGKILL): resume from checkpoint-2
    (out / "checkpoint-4" / "trainer_state.json").unlink()
    (out / "checkpoint-4" / "optimizer.pt").unlink()
    config.resume = True
    with caplog.at_level(logging.WARNING):
        result = train(config)
    assert result.resumed_from == str(out / "checkpoint-2") and result.global_step == 6
    assert "checkpoint-4 is incomplete" in caplog.text
    assert all(ok for _, _, ok in checkpoints(out))


def test_sft_stopped_says_where_resume_continues(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from drvenus.cli import app
    from drvenus.train.sft import trainer

    out = tmp_path / "out"
    _write(out, 4, "complete")
    _write(out, 6, "missing")
    (tmp_path / "train.jsonl").write_text('{"messages": []}\n')
    (tmp_path / "model").mkdir()

    def stopped(config, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(trainer, "train", stopped)
    res = CliRunner().invoke(app, ["sft", "--train", str(tmp_path / "train.jsonl"), "--model",
                                   str(tmp_path / "model"), "--output", str(out)])
    assert res.exit_code == 130, res.output
    assert "Traceback" not in res.output
    assert f"training stopped; --resume continues from {out / 'checkpoint-4'}" in " ".join(
        res.output.split())
