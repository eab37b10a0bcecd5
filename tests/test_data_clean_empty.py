"""`data clean` that keeps no row (issue 43): an error naming why, nothing written, exit 2 on
the command line; a run that keeps any row is unchanged."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from data_fixtures import tiny_clean_row, write_parquet
from drvenus.cli import app
from drvenus.data.pipeline import CleanOptions, NothingKeptError, run_clean

FATES = st.sampled_from(["kept", "wrong_answer", "no_answer_turn"])


def _row(k: int, fate: str) -> dict:
    row = tiny_clean_row(k)
    if fate == "wrong_answer":  # dropped by the correctness filter
        row["gt"] = f"not A{k}"
    elif fate == "no_answer_turn":  # not a valid trajectory
        row["messages"] = row["messages"][:-1]
    return row


@settings(max_examples=15, deadline=None)
@given(fates=st.lists(FATES, min_size=1, max_size=5))
def test_a_run_that_keeps_no_row_is_an_error_and_writes_nothing(fates):
    with tempfile.TemporaryDirectory() as tmp:
        inp = write_parquet([_row(k, f) for k, f in enumerate(fates)],
                            Path(tmp) / "in" / "train-0.parquet")
        out = Path(tmp) / "out"
        opts = CleanOptions(input=inp, output_dir=out, correctness="em",
                            current_date="2026-03-01", workers=1)
        if "kept" in fates:
            stats = run_clean(opts)
            assert stats["rows"]["final_resampled"] >= 1
            return
        try:
            run_clean(opts)
        except NothingKeptError as exc:
            message = str(exc)
        else:
            raise AssertionError("a run that kept no row succeeded")
        assert message.startswith("no row kept") and "nothing written" in message
        assert f"{len(fates)} source rows" in message
        if "no_answer_turn" not in fates:
            assert "correctness filter" in message
        assert not out.exists() or not any(out.iterdir())


def test_the_command_exits_2_with_one_line(tmp_path):
    inp = write_parquet([_row(0, "wrong_answer")], tmp_path / "in" / "train-0.parquet")
    res = CliRunner().invoke(app, ["data", "clean", "-i", str(inp), "-o", str(tmp_path / "out"),
                                   "--correctness", "em", "--workers", "1"])
    assert res.exit_code == 2, res.output
    errors = [ln for ln in res.output.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "no row kept" in errors[0], res.output
