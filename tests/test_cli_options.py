"""Every numeric option of every ``drvenus`` command, given a bad value (negative, zero where
zero means nothing, nan, inf, beyond 64 bits), is one error line naming the option and exit 2,
before anything is loaded or written.

The options are read from the command objects themselves, so a new option is covered the day
it is added; the values an option legitimately takes (0 = off, -1 = unset) are listed below.
"""

from __future__ import annotations

import json
import sys
import types
import typing
from pathlib import Path

import pytest
import typer
from typer.core import TyperGroup

from drvenus.cli import app, main

# (command, option) -> the probe values it takes as valid (never probed)
VALID: dict[tuple[str, str], set[str]] = {
    ("sft", "--max-steps"): {"-1"},
    **{("sft", o): {"0"} for o in ("--val-fraction", "--warmup-ratio", "--weight-decay",
                                    "--adam-beta1", "--adam-beta2", "--max-grad-norm", "--seed",
                                    "--lora-dropout", "--machine-rank",
                                    "--loss-chunk-tokens")},  # 0: the loss from the full logits
    ("rl", "--top-k"): {"-1"},
    ("rl", "--total-steps"): {"-1"},
    **{("rl", o): {"0"} for o in ("--robust-max-retries", "--max-turns-jitter",
                                   "--completion-cutoff", "--format-penalty-scale",
                                   "--ig-crosscheck", "--gamma", "--ig-weight", "--kl-coef",
                                   "--entropy-coef", "--seed", "--trace-save-interval",
                                   "--weight-decay")},
    ("serve", "--port"): {"0"},
    ("serve", "--max-waiting"): {"0"},
    ("tools serve", "--port"): {"0"},
    ("tools serve", "--max-queue"): {"0"},
    ("tools serve", "--cache-size"): {"0"},
    **{("data clean", o): {"0"} for o in ("--f1-threshold", "--judge-retries", "--seed",
                                          "--short-max-turns", "--medium-max-turns",
                                          "--short-multiplier", "--medium-multiplier",
                                          "--long-multiplier")},
    **{(c, "--judge-retries"): {"0"} for c in ("eval", "eval run")},
    # keep-last-k with k = 0: every older tool response a stub
    **{(c, "--keep-last"): {"0"} for c in ("ask", "run", "serve", "mcp", "eval", "eval run", "rl")},
}
PROBES = {int: ("-1", "0", "nan", "inf", str(2**64)), float: ("-1", "0", "nan", "inf", "1e400")}


def _commands(command, path=()):
    if isinstance(command, TyperGroup):
        if command.callback is not None and command.invoke_without_command:
            yield " ".join(path), command
        for name, sub in command.commands.items():
            yield from _commands(sub, (*path, name))
    else:
        yield " ".join(path), command


def _number_type(param) -> type | None:
    descriptor = getattr(param, "type_descriptor", None)
    if descriptor is None or getattr(param, "is_flag", False):
        return None
    tp = descriptor.annotation
    members = typing.get_args(tp) if typing.get_origin(tp) in (typing.Union,
                                                                types.UnionType) else (tp,)
    return next((m for m in (float, int) if m in members), None)


def _cases():
    cases = []
    for name, command in _commands(typer.main.get_command(app)):
        for param in command.params:
            kind = _number_type(param)
            if kind is None:
                continue
            flag = max(param.opts, key=len)
            for value in PROBES[kind]:
                if value not in VALID.get((name, flag), set()):
                    cases.append(pytest.param(name, flag, value, id=f"{name} {flag} {value}"))
    return cases


CASES = _cases()


def test_every_command_with_numbers_is_probed():
    probed = {c.values[0] for c in CASES}
    assert {"ask", "run", "eval", "eval run", "sft", "rl", "serve", "mcp", "tools serve",
            "data clean"} <= probed
    numeric = {(name, max(param.opts, key=len))
               for name, command in _commands(typer.main.get_command(app))
               for param in command.params if _number_type(param) is not None}
    assert {(c.values[0], c.values[1]) for c in CASES} == numeric  # each one at least once


class _Loaded(Exception):
    """Something was loaded (a model, tools, a trainer): the option was not checked first."""


def _refuse(*args, **kwargs):
    raise _Loaded("a bad option value got past the checks")


@pytest.fixture()
def nothing_loads(monkeypatch):
    import drvenus.data.pipeline
    import drvenus.serve.agents
    import drvenus.stack

    for name in ("build_stack", "build_model", "build_toolbox"):
        monkeypatch.setattr(drvenus.stack, name, _refuse)
    monkeypatch.setattr(drvenus.data.pipeline, "run_clean", _refuse)
    monkeypatch.setattr(drvenus.serve.agents, "pool_from_settings", _refuse)
    for module in ("drvenus.train.sft.trainer", "drvenus.train.rl.trainer",
                   "drvenus.train.sft.verl_engine"):
        fake = types.ModuleType(module)
        fake.train = fake.run_verl = _refuse
        monkeypatch.setitem(sys.modules, module, fake)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("options")
    qa = root / "qa.jsonl"
    qa.write_text(json.dumps({"id": "1", "question": "Who wrote Dracula?",
                              "answer": "Bram Stoker"}) + "\n")
    model = root / "model"
    model.mkdir()
    return {"root": root, "qa": qa, "model": model}


def _base_args(name: str, files: dict[str, Path], out: Path) -> list[str]:
    qa, model = str(files["qa"]), str(files["model"])
    return {
        "ask": ["Who wrote Dracula?"],
        "run": [qa, "-o", str(out / "results.jsonl")],
        "eval": ["-b", "jsonl", "--data", qa, "-o", str(out)],
        "eval run": ["-b", "jsonl", "--data", qa, "-o", str(out)],
        "sft": ["--train", qa, "--model", model, "--output", str(out)],
        "rl": ["--train", qa, "--model", model, "--output", str(out), "--reward-type", "f1"],
        "data clean": ["-i", qa, "-o", str(out)],
    }.get(name, [])


@pytest.mark.parametrize(("name", "flag", "value"), CASES)
def test_bad_number_is_one_line_and_exit_2(name, flag, value, files, tmp_path, monkeypatch,
                                           capsys, nothing_loads):
    for var in ("DRVENUS_JUDGE_BASE_URL", "DRVENUS_JUDGE_MODEL", "DRVENUS_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    out = tmp_path / "out"
    argv = ["drvenus", *name.split(), *_base_args(name, files, out), f"{flag}={value}"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exit_:
        main()
    stderr = capsys.readouterr().err.strip()
    assert exit_.value.code == 2, (argv, stderr)
    assert len(stderr.splitlines()) == 1, stderr
    assert flag in stderr, stderr
    assert not out.exists(), f"{argv}: wrote {sorted(p.name for p in out.iterdir())}"


# ---------------------------------------------------------------- the cases behind the table
def _run_main(monkeypatch, capsys, *args: str) -> tuple[int, str]:
    monkeypatch.setattr(sys, "argv", ["drvenus", *args])
    with pytest.raises(SystemExit) as exit_:
        main()
    return exit_.value.code, capsys.readouterr().err.strip()


@pytest.mark.parametrize("extra", [
    ["--max-steps", "-1"], ["--max-steps", "0"], ["--max-context", "10"], ["--time-limit", "-1"],
    ["--endpoint", "http://127.0.0.1:9/v1"],  # without --base-url
    ["--base-url", "http://127.0.0.1:9/v1", "--endpoint", "ftp://127.0.0.1/v1"],
    ["--judge-base-url", "http://127.0.0.1:9/v1"],  # without --judge-model
    ["--judge-timeout", "0"],
])
def test_eval_checks_every_option_before_writing(extra, files, tmp_path, monkeypatch, capsys,
                                                 nothing_loads):
    for var in ("DRVENUS_JUDGE_BASE_URL", "DRVENUS_JUDGE_MODEL", "DRVENUS_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    out = tmp_path / "out"
    code, stderr = _run_main(monkeypatch, capsys, "eval", "-b", "jsonl", "--data",
                             str(files["qa"]), "-o", str(out), *extra)
    assert code == 2 and len(stderr.splitlines()) == 1, stderr
    assert "Traceback" not in stderr
    assert not out.exists()  # no eval.json, no empty results.jsonl


def test_eval_judge_url_without_model_says_what_to_add(files, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("DRVENUS_JUDGE_MODEL", raising=False)
    code, stderr = _run_main(monkeypatch, capsys, "eval", "-b", "jsonl", "--data",
                             str(files["qa"]), "-o", str(tmp_path / "o"),
                             "--judge-base-url", "http://127.0.0.1:9/v1")
    assert code == 2 and "--judge-model" in stderr


@pytest.mark.parametrize(("key", "value"), [("learning_rate", ".nan"), ("learning_rate", ".inf"),
                                            ("epochs", ".nan"), ("weight_decay", "-1"),
                                            ("max_grad_norm", "-1"), ("save_total_limit", "-1")])
def test_sft_yaml_config_is_checked_like_flags(key, value, files, tmp_path, monkeypatch, capsys,
                                               nothing_loads):
    config = tmp_path / "sft.yaml"
    config.write_text(f"{key}: {value}\n")
    code, stderr = _run_main(monkeypatch, capsys, "sft", "--config", str(config),
                             *_base_args("sft", files, tmp_path / "out"))
    assert code == 2 and len(stderr.splitlines()) == 1, stderr
    assert "--" + key.replace("_", "-") in stderr


@pytest.mark.parametrize("extra", [["--learning-rate", "inf"], ["--learning-rate", "nan"],
                                   ["--temperature", "nan"]])
def test_rl_dry_run_refuses_non_finite_values(extra, files, tmp_path, monkeypatch, capsys):
    code, stderr = _run_main(monkeypatch, capsys, "rl", "--dry-run",
                             *_base_args("rl", files, tmp_path / "out"), *extra)
    assert code == 2 and extra[0] in stderr and len(stderr.splitlines()) == 1


def test_rl_yaml_nan_is_refused():
    from drvenus.train.rl.config import RLConfig, RLConfigError

    with pytest.raises(RLConfigError, match="--temperature nan: not a finite number"):
        RLConfig(train="t", model="m", output="o", reward_type="f1",
                 temperature=float("nan")).validate()


def test_report_says_failed_runs_count_as_wrong():
    from drvenus.eval.metrics import RunResult, summarize
    from drvenus.eval.report import _headline

    results = [RunResult("a", 0, True), RunResult("b", 0, False, termination="llm_error")]
    metrics = summarize(results)
    assert metrics["failed_runs"] == 1 and metrics["avg_at_k"] == 0.5
    row = next(line for line in _headline(metrics) if "Failed runs" in line)
    assert "counted as wrong" in row and row.endswith("| 1 |")


def test_rl_refuses_a_misspelt_protocol_setting(files, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DRVENUS_PROTOCOL", "dr_venus")
    code, stderr = _run_main(monkeypatch, capsys, "rl", "--dry-run",
                             *_base_args("rl", files, tmp_path / "out"))
    assert code == 2 and "DRVENUS_PROTOCOL 'dr_venus'" in stderr, stderr


# ---------------------------------------------------------------- sft --model runs/nosuch
class _Hub:
    """A hub on 127.0.0.1 that knows no model (counts its requests)."""

    def __init__(self) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        hub = self
        self.paths: list[str] = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                hub.paths.append(self.path)
                body = b'{"error": "Repository not found"}'
                self.send_response(404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("hub", ["unknown", "unreachable", "offline"])
def test_sft_model_that_is_neither_here_nor_on_the_hub(hub, files, tmp_path, monkeypatch,
                                                        capsys, nothing_loads):
    constants = pytest.importorskip("huggingface_hub.constants")
    server = _Hub()
    try:
        if hub == "unreachable":
            server.close()  # nothing listens on its port any more
        monkeypatch.setattr(constants, "ENDPOINT", server.url)
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", hub == "offline")
        code, stderr = _run_main(monkeypatch, capsys, "sft", "--train", str(files["qa"]),
                                 "--model", "runs/nosuch", "--output", str(tmp_path / "out"))
    finally:
        if hub != "unreachable":
            server.close()
    assert code == 2 and len(stderr.splitlines()) == 1, stderr
    assert "--model runs/nosuch: no such folder here" in stderr
    asked = [p for p in server.paths if p.startswith("/api/models/")]
    assert asked == (["/api/models/runs/nosuch"] if hub == "unknown" else [])  # once, no retries


def test_a_corpus_benchmark_on_another_file_names_that_file_and_writes_nothing(
        files, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    code, stderr = _run_main(monkeypatch, capsys, "eval", "-b", "hotpotqa-paragraphs",
                             "--data", str(files["qa"]), "-o", str(out))
    assert code == 2 and len(stderr.splitlines()) == 1, stderr
    assert "qa.jsonl" in stderr and "corpus.jsonl" not in stderr
    assert not out.exists()
