"""drvenus data clean|export|stats on bad input: one readable line on stderr, exit code 2, no
output; the options of ``data clean`` come from one declaration (CleanOptions)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import typer.main
from typer.testing import CliRunner

from data_fixtures import tiny_clean_row, write_parquet
from drvenus.cli.data import data_app
from drvenus.data.options import CleanOptions
from drvenus.data.resample import ResamplePolicy
from drvenus.grading.judge import JudgeConfig

runner = CliRunner()


@pytest.fixture
def good_input(tmp_path) -> Path:
    return write_parquet([tiny_clean_row(k) for k in range(3)], tmp_path / "in" / "train-0.parquet")


@pytest.fixture(autouse=True)
def _no_judge_env(monkeypatch, tmp_path):
    for var in ("DRVENUS_JUDGE_BASE_URL", "DRVENUS_JUDGE_MODEL", "DRVENUS_JUDGE_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)  # no stray .env


def one_error_line(res) -> str:
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == 2, res.output
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert "Traceback" not in res.output
    return lines[0]


# --------------------------------------------------------------------------- one declaration


def _option_fields() -> set[str]:
    fields = {f for f in CleanOptions.model_fields if f not in ("policy", "judge")}
    fields |= {f.name for f in dataclasses.fields(ResamplePolicy)}
    fields |= {f"judge_{f.name}" for f in dataclasses.fields(JudgeConfig)
               if f.name not in ("api_key", "max_tokens")}
    return fields


def test_clean_options_come_from_the_options_classes():
    params = typer.main.get_command(data_app).commands["clean"].params
    assert {p.name for p in params} - {"help"} == _option_fields()
    by_name = {p.name: p for p in params}
    for name, info in CleanOptions.model_fields.items():
        if name in by_name and not info.is_required() and not isinstance(info.default, tuple):
            assert by_name[name].default == info.default, name
    assert by_name["short_max_turns"].default == ResamplePolicy().short_max_turns
    assert by_name["judge_timeout_s"].opts == ["--judge-timeout"]
    assert by_name["shuffle"].secondary_opts == ["--no-shuffle"]


def test_clean_runs_with_cli_values(good_input, tmp_path):
    out = tmp_path / "out"
    res = runner.invoke(data_app, ["clean", "-i", str(good_input), "-o", str(out), "--correctness",
                                   "em", "--allowed-tools", "search,visit", "--allowed-tools", "x",
                                   "--long-multiplier", "3", "--workers", "1"])
    assert res.exit_code == 0, res.output
    assert pq.read_metadata(out / "cleaned_resampled.parquet").num_rows == 3


def test_options_are_validated_in_the_library_too():
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        CleanOptions(input=Path("x"), output_dir=Path("y"), workers=0)
    with pytest.raises(ValueError, match="at least short_max_turns"):
        ResamplePolicy(short_max_turns=10, medium_max_turns=5)
    assert "secret" not in repr(JudgeConfig("http://j/v1", "m", api_key="secret"))


@pytest.mark.parametrize(("args", "flag"), [
    (["--workers", "0"], "--workers"),
    (["--workers", "-3"], "--workers"),
    (["--chunk-rows", "0"], "--chunk-rows"),
    (["--f1-threshold", "1.5"], "--f1-threshold"),
    (["--seed", "-1"], "--seed"),
    (["--correctness", "maybe"], "--correctness"),
    (["--system-prompt-mode", "mine"], "--system-prompt-mode"),
    (["--current-date", "2026-02-30"], "--current-date"),
    (["--allowed-tools", " , "], "--allowed-tools"),
    (["--long-multiplier", "-1"], "--long-multiplier"),
    (["--short-max-turns", "60", "--medium-max-turns", "50"], "short_max_turns"),
    (["--judge-base-url", "http://j/v1", "--judge-model", "m", "--judge-concurrency", "0"],
     "--judge-concurrency"),
    (["--correctness", "judge"], "--judge-base-url"),
])
def test_bad_options_exit_2_before_any_output(good_input, tmp_path, args, flag):
    out = tmp_path / "out"
    res = runner.invoke(data_app, ["clean", "-i", str(good_input), "-o", str(out), *args])
    assert flag in one_error_line(res)
    assert not out.exists()


# --------------------------------------------------------------------------- wrong columns


def test_clean_on_wrong_columns_names_file_and_columns(tmp_path):
    bad = write_parquet([{"a": 1, "b": "x"}], tmp_path / "in" / "train-0.parquet")
    out = tmp_path / "out"
    line = one_error_line(runner.invoke(data_app, ["clean", "-i", str(bad), "-o", str(out)]))
    assert "train-0.parquet" in line and "wrong schema" in line
    assert ("missing column(s) messages and meta (raw input) or question, gt (clean input) "
            "(found: a, b)") in line
    assert not out.exists()
    no_gt = write_parquet([{k: v for k, v in tiny_clean_row(0).items() if k != "gt"}],
                          tmp_path / "in2" / "train-0.parquet")
    line = one_error_line(runner.invoke(data_app, ["clean", "-i", str(no_gt), "-o", str(out)]))
    assert "missing column(s) gt" in line


@pytest.mark.parametrize(("column", "value", "named"), [
    ("question", 7, "question is int64"), ("gt", [1], "gt is list<element: int64>"),
    ("messages", [{"role": 1, "content": "hi"}], "messages.role is int64"),
])
def test_clean_on_wrongly_typed_columns_is_an_error_not_zero_rows(tmp_path, column, value,
                                                                  named):
    row = {**tiny_clean_row(0), column: value}
    bad = write_parquet([row], tmp_path / "in" / "train-0.parquet")
    out = tmp_path / "out"
    line = one_error_line(runner.invoke(data_app, ["clean", "-i", str(bad), "-o", str(out),
                                                   "--correctness", "off"]))
    assert "train-0.parquet" in line and f"wrong schema: {named}, not a string" in line
    assert not out.exists()


def test_clean_skips_a_wrong_file_among_good_ones(good_input, tmp_path):
    write_parquet([{"a": 1}], good_input.parent / "train-1.parquet")
    out = tmp_path / "out"
    res = runner.invoke(data_app, ["clean", "-i", str(good_input.parent), "-o", str(out),
                                   "--correctness", "off", "--workers", "1"])
    assert res.exit_code == 0, res.output
    assert "train-1.parquet" in res.stderr and "wrong schema" in res.stderr
    assert pq.read_metadata(out / "cleaned_resampled.parquet").num_rows == 3


def test_clean_on_missing_input(tmp_path):
    out = tmp_path / "out"
    line = one_error_line(runner.invoke(data_app, ["clean", "-i", str(tmp_path / "nope"),
                                                   "-o", str(out)]))
    assert "no input files found" in line and not out.exists()


@pytest.mark.parametrize("command", ["export", "stats"])
def test_export_and_stats_on_bad_input(tmp_path, command):
    extra = ["-f", "verl", "-o", str(tmp_path / "o" / "x.parquet")] if command == "export" else []
    wrong = write_parquet([{"question": "q", "gt": "a"}], tmp_path / "wrong.parquet")
    line = one_error_line(runner.invoke(data_app, [command, "-i", str(wrong), *extra]))
    assert "wrong.parquet" in line and "missing column(s) messages" in line
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"not parquet")
    line = one_error_line(runner.invoke(data_app, [command, "-i", str(garbage), *extra]))
    assert "garbage.parquet" in line and "not a readable parquet file" in line
    line = one_error_line(runner.invoke(data_app, [command, "-i", str(tmp_path / "none.parquet"),
                                                   *extra]))
    assert "none.parquet" in line
    assert not (tmp_path / "o").exists()


def test_export_hf_on_wrong_columns_creates_nothing(tmp_path):
    wrong = write_parquet([{"messages": ["not a message"]}], tmp_path / "wrong.parquet")
    res = runner.invoke(data_app, ["export", "-i", str(wrong), "-f", "hf", "-o",
                                   str(tmp_path / "hf")])
    assert "not a list of {role, content}" in one_error_line(res)
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize("fmt", ["verl", "sharegpt", "swift"])
def test_export_never_writes_over_its_input(good_input, tmp_path, fmt):
    """``-o`` naming the input (by another spelling too) is refused and the input is intact."""
    cleaned = tmp_path / "out" / "cleaned_resampled.parquet"
    assert runner.invoke(data_app, ["clean", "-i", str(good_input), "-o", str(cleaned.parent),
                                    "--correctness", "em", "--workers", "1"]).exit_code == 0
    before = cleaned.read_bytes()
    other = cleaned.parent / ".." / "out" / cleaned.name
    for target in (cleaned, other):
        line = one_error_line(runner.invoke(data_app, ["export", "-i", str(cleaned), "-f", fmt,
                                                       "-o", str(target)]))
        assert "write over its input" in line
    assert cleaned.read_bytes() == before
    res = runner.invoke(data_app, ["export", "-i", str(cleaned), "-f", "hf", "-o",
                                   str(tmp_path / "hf")])
    assert res.exit_code == 0, res.output
    hf_data = tmp_path / "hf" / "data" / "train-00000-of-00001.parquet"
    line = one_error_line(runner.invoke(data_app, ["export", "-i", str(hf_data), "-f", "hf",
                                                   "-o", str(tmp_path / "hf")]))
    assert "write over its input" in line and pq.read_metadata(hf_data).num_rows == 3


def test_export_replaces_its_output_only_when_complete(good_input, tmp_path, monkeypatch):
    from drvenus.data import export as export_module

    cleaned = tmp_path / "out" / "cleaned_resampled.parquet"
    runner.invoke(data_app, ["clean", "-i", str(good_input), "-o", str(cleaned.parent),
                             "--correctness", "em", "--workers", "1"])
    target = tmp_path / "sft.jsonl"
    target.write_text("previous export\n", encoding="utf-8")

    def broken(row):
        raise OSError("disk full")

    monkeypatch.setattr(export_module, "_sharegpt", broken)
    line = one_error_line(runner.invoke(data_app, ["export", "-i", str(cleaned), "-f",
                                                   "sharegpt", "-o", str(target)]))
    assert "disk full" in line
    assert target.read_text(encoding="utf-8") == "previous export\n"
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_clean_refuses_an_output_folder_whose_outputs_are_its_inputs(good_input, tmp_path):
    """Cleaning a folder into itself twice would read the first run's output as raw input."""
    folder = good_input.parent
    args = ["clean", "-i", str(folder), "-o", str(folder), "--file-pattern", "*.parquet",
            "--correctness", "em", "--workers", "1"]
    assert runner.invoke(data_app, args).exit_code == 0
    final = folder / "cleaned_resampled.parquet"
    before = final.read_bytes()
    line = one_error_line(runner.invoke(data_app, args))
    assert "cleaned_resampled.parquet" in line and "write over" in line
    assert final.read_bytes() == before and pq.read_metadata(final).num_rows == 3
