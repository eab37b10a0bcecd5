"""The `drvenus` command as a user runs it (subprocesses, real loopback servers)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers.cli import ANSWER, ROOT, drvenus, search_turn, visit_turn  # noqa: F401
from stub_server import StubServer


def test_help_reads_well():
    r = drvenus("--help")
    assert r.returncode == 0
    for word in ("ask", "run", "index", "data", "deep research"):
        assert word in r.stdout


def test_empty_question_is_one_line_error():
    r = drvenus("ask", "   ")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == ["error: the question is empty"]


def test_missing_corpus_is_one_line_error(tmp_path):
    r = drvenus("ask", "Who?", "--corpus", str(tmp_path / "nope.jsonl"), "--json")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "nope.jsonl" in r.stderr


def test_malformed_corpus_is_one_line_error(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{oops\nnot json either\n")
    r = drvenus("ask", "Who?", "--corpus", str(bad), "--json")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "skipped 2 malformed" in r.stderr  # counted and reported
    assert r.stderr.strip().splitlines()[-1].startswith("error: ")
    assert "no usable rows" in r.stderr.strip().splitlines()[-1]


def test_gguf_that_is_not_a_model(tmp_path, corpus):
    fake = tmp_path / "model.gguf"
    fake.write_text("this is not a model")
    r = drvenus("ask", "Who?", "--model", str(fake), "--corpus", str(corpus), "--json")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "model.gguf" in r.stderr


def test_base_url_without_model_name_uses_the_served_model(corpus):
    with StubServer([ANSWER], model="served-one") as server:
        r = drvenus("ask", "Who?", "--base-url", server.base_url, "--corpus", str(corpus), "--json")
        requests = server.chat_requests
    assert r.returncode == 0, r.stderr
    assert [req.json["model"] for req in requests] == ["served-one"]
    assert json.loads(r.stdout)["prediction"] == "Bram Stoker"


def test_version_prints_and_exits_0():
    r = drvenus("--version")
    assert r.returncode == 0 and r.stdout.startswith("drvenus ")


@pytest.mark.parametrize(
    ("args", "where", "message"),
    [
        (["run", "--workers", "abc", "q.jsonl"], "drvenus run:", "--workers"),
        (["run"], "drvenus run:", "Missing argument"),
        (["nosuchcommand"], "drvenus:", "nosuchcommand"),
        (["data", "clean"], "drvenus data clean:", "--input"),
        (["data", "from-runs", "runs.jsonl"], "drvenus data from-runs:", "--output"),
        (["ask", "q?", "--base-url", "ftp://host/v1"], "error:", "http://"),
        (["ask", "q?", "--context-strategy", "bogus"], "error:", "--context-strategy"),
        (["ask", "q?", "--keep-last", "-1"], "error:", "--keep-last"),
        (["ask", "q?", "--heavy", "0"], "error:", "--heavy"),
        (["ask", "q?", "--heavy-mode", "mean"], "error:", "--heavy-mode"),
        (["serve", "--heavy", "65"], "error:", "--heavy"),
        (["serve", "--heavy", "nan"], "drvenus serve:", "--heavy"),
        (["serve", "--max-heavy", "0"], "drvenus serve:", "--max-heavy"),
        (["serve", "--max-heavy", "four"], "drvenus serve:", "--max-heavy"),
        (["serve", "--heavy", "8", "--max-heavy", "4"], "error:", "over --max-heavy 4"),
        (["mcp", "--heavy", "0"], "error:", "--heavy"),
        (["ask", "q?", "--kv-cache", "q3"], "error:", "--kv-cache"),
        (["ask", "q?", "--retrieval", "dense"], "error:", "--retrieval"),
        (["index", "build", "--retrieval", "dense"], "error:", "--retrieval"),
        (["ask", "q?", "--kv-cache", "q8_0", "--base-url", "http://127.0.0.1:9/v1",
          "--model-name", "m"], "error:", "--kv-cache applies"),
    ],
)
def test_usage_errors_are_one_line_exit_2(args, where, message):
    r = drvenus(*args)
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(where) and message in lines[0], r.stderr


def test_bare_group_shows_its_help():
    r = drvenus("index")
    assert r.returncode == 0 and "build" in r.stdout and not r.stderr.strip()


def test_server_down_is_a_recorded_llm_error(corpus):
    r = drvenus(
        "ask", "Who wrote Dracula?", "--base-url", "http://127.0.0.1:9/v1", "--model-name", "m",
        "--corpus", str(corpus), "--json", env={"DRVENUS_MAX_ATTEMPTS": "2"}, timeout=120,
    )
    assert r.returncode == 1, r.stderr
    record = json.loads(r.stdout)
    assert record["termination"] == "llm_error" and record["error"]


def test_ask_against_a_local_server_runs_real_tools(corpus, tmp_path):
    replies = [
        search_turn("Dracula novel author"),
        visit_turn("https://en.wikipedia.org/wiki/Dracula", "who wrote it"),
        ANSWER,
    ]
    trace = tmp_path / "trace.jsonl"
    with StubServer(replies) as server:
        r = drvenus(
            "ask", "Who wrote the novel Dracula?", "--base-url", server.base_url,
            "--model-name", "dr-venus", "--corpus", str(corpus), "--json", "--trace", str(trace),
            env={"DRVENUS_API_KEY": "sk-secret-test"},
        )
        requests = server.chat_requests
    assert r.returncode == 0, r.stderr
    assert "sk-secret-test" not in r.stdout + r.stderr
    rec = json.loads(r.stdout)
    assert rec["termination"] == "answered" and rec["prediction"] == "Bram Stoker"
    assert rec["tool_call_count"] == 2
    search = json.loads(rec["messages"][3]["content"].split("\n", 1)[1].rsplit("\n", 1)[0])
    assert search[0]["web_page_info_list"][0]["url"] == "https://en.wikipedia.org/wiki/Dracula"
    assert "Bram Stoker" in rec["messages"][5]["content"]
    body = requests[0].json
    assert body["model"] == "dr-venus" and body["top_k"] == 20 and body["temperature"] == 1.0
    assert "<tool_response>" in body["stop"]
    assert requests[0].headers.get("Authorization") == "Bearer sk-secret-test"
    events = [json.loads(line)["type"] for line in trace.read_text().splitlines()]
    assert events[0] == "started" and events[-1] == "finished" and "tool_result" in events


def test_batch_run_is_resumable(corpus, tmp_path):
    qs = tmp_path / "questions.jsonl"
    qs.write_text("\n".join(
        [json.dumps({"id": f"q{i}", "question": f"Who wrote book {i}?", "answer": "x"}) for i in range(4)]
        + ["{broken"]
    ) + "\n")
    out = tmp_path / "results.jsonl"
    with StubServer([], default=ANSWER) as server:
        args = ("run", str(qs), "-o", str(out), "--workers", "3", "--base-url", server.base_url,
                "--model-name", "m", "--corpus", str(corpus))
        r1 = drvenus(*args)
        assert r1.returncode == 0, r1.stderr
        assert "1 malformed line" in r1.stderr
        rows = [json.loads(x) for x in out.read_text().splitlines()]
        assert sorted(r["id"] for r in rows) == ["q0", "q1", "q2", "q3"]
        assert all(r["termination"] == "answered" for r in rows)
        r2 = drvenus(*args)
        assert r2.returncode == 0 and "already" in r2.stdout
    assert len(out.read_text().splitlines()) == 4


def test_index_build_and_reuse(corpus, tmp_path):
    env = {"DRVENUS_CACHE_DIR": str(tmp_path / "cache")}
    r1 = drvenus("index", "build", str(corpus), env=env)
    assert r1.returncode == 0 and "2 documents" in r1.stdout
    r2 = drvenus("index", "build", str(corpus), env=env)
    assert r2.returncode == 0 and "reused" in r2.stdout


@pytest.mark.parametrize("command", [["merge-lora"], ["export-gguf"]])
def test_model_export_commands_refuse_a_folder_that_is_not_a_checkpoint(command, tmp_path):
    r = drvenus("models", *command, str(tmp_path / "nope"), "-o", str(tmp_path / "out"))
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "nope" in lines[0]


def test_every_command_loads_without_the_optional_extras():
    """`pip install drvenus` has no torch, numpy, transformers, fastapi, mcp or yaml: the CLI
    (every mounted command, ``rl`` and ``serve`` included) must still start."""

    blocked = ("torch", "numpy", "transformers", "fastapi", "uvicorn", "mcp", "yaml", "peft")
    for command in ("rl", "serve", "sft", "eval", "data"):
        code = ("import sys\n"
                f"for m in {blocked!r}:\n    sys.modules[m] = None\n"
                "from drvenus.cli import main\n"
                f"sys.argv = ['drvenus', {command!r}, '--help']\nmain()")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert done.returncode == 0, (command, done.stderr[-2000:])


def test_secrets_never_reach_records_traces_or_logs(corpus, tmp_path):
    """A gateway that echoes the refused key in its 401 body, a password inside --base-url,
    httpx's request log at -v: the key and the password appear nowhere the user can read."""
    key, password = "sk-test-1234567890abcdef", "pa55-w0rd-secret"
    with StubServer([]) as server:
        server.fail_next(10, status=401, message=f"invalid api key {key} (user bob)")
        url = server.base_url.replace("http://", f"http://bob:{password}@")
        trace = tmp_path / "trace.jsonl"
        r = drvenus("-v", "ask", "Who wrote Dracula?", "--base-url", url, "--model-name", "m",
                    "--corpus", str(corpus), "--json", "--trace", str(trace),
                    env={"DRVENUS_MAX_ATTEMPTS": "2", "DRVENUS_API_KEY": key}, timeout=120)
    record = json.loads(r.stdout)
    assert record["termination"] == "llm_error" and "invalid api key ***" in record["error"]
    everything = r.stdout + r.stderr + trace.read_text(encoding="utf-8")
    assert key not in everything and password not in everything
    assert "HTTP Request" in r.stderr or "127.0.0.1" in r.stderr  # -v did log the requests


def test_ask_heavy_runs_in_parallel_then_synthesises(corpus, tmp_path):
    trace = tmp_path / "trace.jsonl"
    replies = [search_turn("Dracula novel author"), search_turn("Dracula novel author"),
               ANSWER, ANSWER]
    with StubServer(replies, default=ANSWER) as server:
        r = drvenus(
            "ask", "Who wrote the novel Dracula?", "--base-url", server.base_url,
            "--model-name", "dr-venus", "--corpus", str(corpus), "--json", "--heavy", "2",
            "--trace", str(trace), env={"DRVENUS_MAX_ATTEMPTS": "1"},
        )
        requests = server.chat_requests
    assert r.returncode == 0, r.stderr
    rec = json.loads(r.stdout)
    assert rec["prediction"] == "Bram Stoker" and rec["extra"]["heavy"]["chosen_by"] == "synthesis"
    assert len(rec["extra"]["heavy"]["runs"]) == 2 and len(requests) == 5
    from drvenus.agent import read_trace

    runs = read_trace(trace)
    assert len(runs) == 3 and runs[-1][0]["data"]["heavy"] == 2
