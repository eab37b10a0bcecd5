"""`drvenus eval` as a user runs it: subprocesses against the local stub server (agent and judge),
resume after kill -9, encrypted questions kept out of every file, reports and `compare`; and
(slow) the offline HotpotQA run with the embedded model."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from drvenus.eval.benchmarks import encrypt, xbench_key
from helpers.cli import drvenus_eval as drvenus
from helpers.cli import eval_env
from stub_server import StubServer

ROOT = Path(__file__).resolve().parents[1]
ANSWER = "<think>\nDone.\n</think>\n<answer>\nBram Stoker\n</answer>"
WRONG = "<think>\nDone.\n</think>\n<answer>\nJane Austen\n</answer>"


@pytest.fixture()
def corpus(tmp_path: Path) -> Path:
    rows = [{"id": "1", "title": "Dracula", "url": "https://en.wikipedia.org/wiki/Dracula",
             "text": "Dracula is an 1897 Gothic horror novel by the Irish author Bram Stoker."}]
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def qa_file(tmp_path: Path, n: int) -> Path:
    path = tmp_path / "qa.jsonl"
    path.write_text("".join(json.dumps({"id": f"q{i}", "question": f"Who wrote book {i}?",
                                        "answer": "Bram Stoker"}) + "\n" for i in range(n)))
    return path


def eval_args(data: Path, out: Path, server: StubServer, corpus: Path, *extra: str):
    return ("eval", "--benchmark", "jsonl", "--data", str(data), "--out", str(out),
            "--base-url", server.base_url, "--model-name", "stub", "--corpus", str(corpus),
            *extra)


def rows_of(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]


def test_eval_report_plots_and_rerun(tmp_path, corpus):
    data, out = qa_file(tmp_path, 3), tmp_path / "run"
    with StubServer([], default=ANSWER) as server:
        r = drvenus(*eval_args(data, out, server, corpus, "--runs", "2", "--workers", "2"))
        assert r.returncode == 0, r.stderr
        report = json.loads((out / "report.json").read_text())
        m = report["metrics"]
        assert (m["items"], m["rows"], m["avg_at_k"], m["pass_at_k"]) == (3, 6, 1.0,
                                                                            {"1": 1.0, "2": 1.0})
        assert report["scoring"].startswith("no judge")
        assert "no judge" in (out / "report.md").read_text()
        plots = sorted(p.name for p in (out / "plots").iterdir())
        assert plots == ["accuracy_per_run.png", "pass_at_k.png", "terminations.png",
                         "tool_calls.png", "turns.png"]
        calls = len(server.chat_requests)
        again = drvenus(*eval_args(data, out, server, corpus, "--runs", "2"))
        assert again.returncode == 0 and "are done" in again.stdout
        assert len(server.chat_requests) == calls  # nothing researched twice
    assert len(rows_of(out)) == 6


def test_kill_midway_then_resume_without_duplicates_or_losses(tmp_path, corpus):
    data, out = qa_file(tmp_path, 5), tmp_path / "run"
    with StubServer([], default=ANSWER, delay=0.4) as server:
        proc = subprocess.Popen(
            [sys.executable, "-m", "drvenus", *eval_args(data, out, server, corpus, "--runs", "2",
                                                          "--workers", "2")],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=eval_env())
        results = out / "results.jsonl"
        deadline = time.monotonic() + 120
        while not (results.exists() and results.read_bytes().count(b"\n") >= 3):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        killed = len(rows_of(out))
        assert 3 <= killed < 10
        r = drvenus(*eval_args(data, out, server, corpus, "--runs", "2"))
    assert r.returncode == 0, r.stderr
    assert "Resuming" in r.stdout
    ids = Counter(row["id"] for row in rows_of(out))
    assert len(ids) == 10 and set(ids.values()) == {1}  # every pair once: none lost, none twice
    assert json.loads((out / "report.json").read_text())["metrics"]["rows"] == 10


def test_compare_two_runs(tmp_path, corpus):
    data = qa_file(tmp_path, 2)
    with StubServer([], default=ANSWER) as good, StubServer([], default=WRONG) as bad:
        assert drvenus(*eval_args(data, tmp_path / "a", good, corpus, "--runs", "1")).returncode == 0
        assert drvenus(*eval_args(data, tmp_path / "b", bad, corpus, "--runs", "1")).returncode == 0
    r = drvenus("eval", "compare", str(tmp_path / "a"), str(tmp_path / "b"), "--json")
    assert r.returncode == 0, r.stderr
    diff = json.loads(r.stdout)
    assert diff["metrics"]["avg_at_k"] == {"a": 1.0, "b": 0.0}
    assert set(diff["a_better"]) == {"q0", "q1"} and not diff["b_better"]
    md = drvenus("eval", "compare", str(tmp_path / "a"), str(tmp_path / "b"), "-o",
                 str(tmp_path / "cmp.md"))
    assert md.returncode == 0 and "Better in A" in (tmp_path / "cmp.md").read_text()


def test_endpoints_round_robin(tmp_path, corpus):
    data, out = qa_file(tmp_path, 4), tmp_path / "run"
    with StubServer([], default=ANSWER) as one, StubServer([], default=ANSWER) as two:
        r = drvenus(*eval_args(data, out, one, corpus, "--runs", "1", "--workers", "1",
                               "--endpoint", two.base_url))
        assert r.returncode == 0, r.stderr
        assert len(one.chat_requests) == len(two.chat_requests) == 2  # one answer turn each
    assert json.loads((out / "eval.json").read_text())["endpoints"] == 2


def test_bad_input_is_one_line_exit_2(tmp_path):
    r = drvenus("eval", "--benchmark", "nope", "--data", str(tmp_path / "x"), "--out",
                str(tmp_path / "o"))
    assert r.returncode == 2 and "unknown benchmark" in r.stderr
    assert len([x for x in r.stderr.splitlines() if x.strip()]) == 1
    r = drvenus("eval", "--benchmark", "jsonl")
    assert r.returncode == 2 and "required" in r.stderr
    r = drvenus("eval", "compare", str(tmp_path), str(tmp_path))
    assert r.returncode == 2 and "no report.json" in r.stderr


def test_a_rerun_with_another_model_or_data_file_is_refused(tmp_path, corpus):
    """Results of one model (or data file) are never reused as another's."""
    out = tmp_path / "run"
    data = qa_file(tmp_path, 2)
    with StubServer([], default=ANSWER) as server:
        assert drvenus(*eval_args(data, out, server, corpus, "--runs", "1")).returncode == 0
        before = (out / "results.jsonl").read_bytes()
        r = drvenus("eval", "--benchmark", "jsonl", "--data", str(data), "--out", str(out),
                    "--runs", "1", "--base-url", server.base_url, "--model-name", "other",
                    "--corpus", str(corpus))
        assert r.returncode == 2 and "holds results of another model" in r.stderr, r.stderr
        assert "model_name=stub" in r.stderr and "model_name=other" in r.stderr
        other = tmp_path / "other.jsonl"
        other.write_bytes(data.read_bytes())
        r = drvenus(*eval_args(other, out, server, corpus, "--runs", "1"))
        assert r.returncode == 2 and "use another --out" in r.stderr
    assert (out / "results.jsonl").read_bytes() == before


def test_eval_json_records_the_agent_settings_and_keeps_them(tmp_path, corpus):
    """A number traces back to its settings: eval.json records the context strategy, Heavy
    mode and the KV cache; more runs with other settings are refused (the results would mix)."""
    data, out = qa_file(tmp_path, 1), tmp_path / "run"
    with StubServer([], default=ANSWER) as server:
        r = drvenus(*eval_args(data, out, server, corpus, "--runs", "1", "--heavy", "2",
                               "--heavy-mode", "vote", "--context-strategy", "keep-last-k",
                               "--keep-last", "2", "--max-steps", "7"))
        assert r.returncode == 0, r.stderr
        agent = json.loads((out / "eval.json").read_text())["agent"]
        assert agent == {"max_steps": 7, "max_context_tokens": agent["max_context_tokens"],
                         "context_strategy": "keep-last-k", "keep_last": 2, "heavy": 2,
                         "heavy_mode": "vote", "kv_cache": "f16"}
        assert json.loads((out / "report.json").read_text())["agent"] == agent
        assert "context keep-last-k (keep 2) · heavy 2 (vote) · KV cache f16" in (
            out / "report.md").read_text()
        before = (out / "results.jsonl").read_bytes()
        r = drvenus(*eval_args(data, out, server, corpus, "--runs", "2", "--max-steps", "7",
                               "--context-strategy", "keep-last-k", "--keep-last", "2"))
    assert r.returncode == 2, r.stderr
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "holds results of other agent settings" in lines[0]
    assert "heavy 2 -> 1" in lines[0] and "heavy_mode vote -> synthesise" in lines[0]
    assert (out / "results.jsonl").read_bytes() == before


def test_a_malformed_judge_endpoint_fails_before_any_agent_run(tmp_path, corpus):
    out = tmp_path / "run"
    with StubServer([], default=ANSWER) as server:
        r = drvenus(*eval_args(qa_file(tmp_path, 2), out, server, corpus, "--judge-base-url",
                               "ftp://judge.example", "--judge-model", "j"))
        assert server.chat_requests == []  # the agent never ran
    assert r.returncode == 2 and "judge endpoint" in r.stderr and "http" in r.stderr
    assert len([x for x in r.stderr.splitlines() if x.strip()]) == 1
    assert not (out / "results.jsonl").exists()


@pytest.mark.parametrize("heavy", [(), ("--heavy", "2")], ids=["one-run", "heavy"])
def test_encrypted_benchmark_with_judge_writes_no_plaintext(tmp_path, corpus, heavy):
    canary = "SYNTHETIC CANARY for a test"
    question, answer = "SECRETQUESTION 谁写了德古拉？", "SECRETANSWER 布莱姆·斯托克"
    key = xbench_key(canary)
    data = tmp_path / "xb.csv"
    data.write_text("id,prompt,answer,reference_steps,canary\n"
                    f"1,{encrypt(question, key)},{encrypt(answer, key)},,{canary}\n")

    def reply(request):
        prompt = request.json["messages"][-1]["content"]
        if "标准答案" in prompt:  # the xbench judge
            return "最终答案: Bram Stoker\n解释: SECRETANSWER 同一人\n结论: 正确"
        return ANSWER

    out = tmp_path / "run"
    with StubServer([], default=reply) as server:
        r = drvenus("eval", "--benchmark", "xbench-deepsearch", "--data", str(data), "--out",
                    str(out), "--runs", "1", "--base-url", server.base_url, "--model-name",
                    "stub", "--corpus", str(corpus), "--judge-base-url", server.base_url,
                    "--judge-model", "stub", *heavy)
    assert r.returncode == 0, r.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["metrics"]["avg_at_k"] == 1.0 and report["judge_model"] == "stub"
    for path in out.rglob("*"):
        if path.is_file():
            blob = path.read_bytes()
            assert b"SECRET" not in blob and "谁写了".encode() not in blob, path.name
    assert "SECRET" not in r.stdout + r.stderr


@pytest.mark.slow
def test_offline_hotpotqa_with_the_embedded_model(shared_data, tmp_path, embedded_gguf):
    out = tmp_path / "hotpot"
    data = shared_data / "qa" / "hotpotqa-dev-500-with-paragraphs.jsonl"
    r = drvenus("eval", "--benchmark", "hotpotqa-paragraphs", "--data", str(data), "--limit", "2",
                "--runs", "2", "--out", str(out), timeout=900)
    assert r.returncode in (0, 1), r.stderr  # 1: a pair failed (reported, retried on rerun)
    report = json.loads((out / "report.json").read_text())
    m = report["metrics"]
    assert (m["items"], m["runs"], m["rows"]) == (2, 2, 4)
    assert m["recall"]["retrieved"] is not None  # the embedded agent always searches first
    assert (out / "corpus.jsonl").read_bytes().count(b"\n") == 4858
    assert len(list((out / "plots").glob("*.png"))) == 5
    assert "Gold paragraph recall" in (out / "report.md").read_text()
