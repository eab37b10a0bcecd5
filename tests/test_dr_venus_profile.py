"""``--protocol dr-venus``: DR-Venus's texts, found by the structure of its pinned files, are what
the agent, the visit tool, the page extractor and ``data clean`` send, byte for byte.

The files read here (tests/fixtures/reference/DR-Venus/...) are laid out like the official ones
(same paths, names and structure) and worded by us; the real files are checked by hand (see
docs/AGENT.md) and by the last test (helpers.reference: where the real files can be had)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import typer.main
from typer.testing import CliRunner

from data_fixtures import tiny_clean_row, write_parquet
from drvenus import protocol as P
from drvenus.agent import AgentConfig, ResearchAgent
from drvenus.cli import app
from drvenus.config import Settings
from drvenus.reference import SOURCES, ReferenceStore, Source
from drvenus.reference.dr_venus import INFERENCE_FILES, RUN_DEMO, load_dr_venus_texts
from drvenus.reference.extract import ExtractError
from helpers.reference import NEEDS_REFERENCE, real_store
from scripted import ScriptedModel, ScriptedTools, answer, call
from stub_server import StubServer

FIXTURES = Path(__file__).parent / "fixtures" / "reference"
# the fixtures' hashes, pinned as sources.py pins the official files'
FIXTURE_FILES = {
    "Inference/run_demo.py":
        "914e763fd0453e3dede6b1b12fe773c8a7dec92f0a68a49930290f29b194bdb4",
    "Inference/tool_server/tool_prompt.py":
        "fb82cb458d5ee2f817b86ff9b4b96208429ce96eeb1e1c642c4c6b3b5a631739",
    "Inference/tool_server/tool_visit.py":
        "ca01d31b6bed0db1b5c49056eaa9804e95a19b7ee03a7a6fcbe41e049dbcaabd",
}
FIXTURE_SOURCE = Source(name="DR-Venus", repo="example/dr-venus-fixture", commit="b" * 40,
                        files=FIXTURE_FILES)
REAL_SOURCE = SOURCES["DR-Venus"]

# what the fixtures hold (their own wording), as the code there sends it
PROMPT = (
    "FIXTURE-PROMPT: you research questions. Give the answer in `<answer></answer>`.\n\n"
    "# Tools\n\n<tools>\n"
    '{"type": "function", "function": {"name": "search", "description": "FIXTURE search."}}\n'
    '{"type": "function", "function": {"name": "visit", "description": "FIXTURE visit."}}\n'
    "</tools>\n\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call>\n\nCurrent date: 2031-07-09\n"
)
PARSE_NOTICE = ("<tool_response>\nFIXTURE-PARSE: that turn was not usable {sic}.\n"
                "Call one tool properly, or answer in `<answer></answer>`.\n</tool_response>")
CONTEXT_NOTICE = ("<tool_response>\nFIXTURE-CONTEXT: the context is full. "
                  "Answer in `<answer></answer>` now.\n</tool_response>")
STEPS_NOTICE = ("<tool_response>\nFIXTURE-STEPS: no tool calls are left. "
                "Answer in `<answer></answer>` now.\n</tool_response>")
EVIDENCE = "FIXTURE-EVIDENCE: nothing could be read there."
SUMMARY = "FIXTURE-SUMMARY: the page gave nothing for the goal."
EXTRACTOR = ("FIXTURE-EXTRACTOR. Goal: {goal}\nPage:\n{webpage_content}\n"
             'Reply with one JSON object {{"rational": "...", "evidence": "...", '
             '"summary": "..."}}.\n')


def failure_frame(url: str, goal: str) -> str:
    return (f"The useful information in {url} for user goal {goal} as follows: \n\n"
            f"Evidence in page: \n{EVIDENCE}\n\nSummary: \n{SUMMARY}\n\n")


@pytest.fixture()
def store(tmp_path: Path) -> ReferenceStore:
    return ReferenceStore(cache_dir=tmp_path / "cache", local_dir=FIXTURES,
                          sources={"DR-Venus": FIXTURE_SOURCE}, download=False)


@pytest.fixture()
def fixture_env(monkeypatch, tmp_path: Path) -> None:
    """The environment of a command reading the fixtures: DRVENUS_REFERENCE_DIR at them, the
    DR-Venus source pinned to their hashes, no stray .env or DRVENUS_* settings."""
    for name in list(os.environ):
        if name.startswith("DRVENUS_") or name in ("OPENAI_API_KEY", "SERPER_KEY_ID"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DRVENUS_REFERENCE_DIR", str(FIXTURES))
    monkeypatch.setenv("DRVENUS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setitem(SOURCES, "DR-Venus", FIXTURE_SOURCE)


# ---------------------------------------------------------------- extraction


def test_the_texts_are_found_by_where_the_code_sends_them(store):
    texts = load_dr_venus_texts(store)
    assert texts.system_prompt == PROMPT  # the system message's SYSTEM_PROMPT, not the decoy
    assert (texts.format_error, texts.context_limit, texts.step_limit) == (
        PARSE_NOTICE, CONTEXT_NOTICE, STEPS_NOTICE)
    assert (texts.visit_failed_evidence, texts.visit_failed_summary) == (EVIDENCE, SUMMARY)
    assert texts.extractor_prompt == EXTRACTOR
    assert texts.extractor_sampling == {"temperature": 0.3}
    assert texts.agent_sampling == {"stop": ("<tool_response>",), "temperature": 0.6,
                                    "max_tokens": 1234, "top_p": 0.8, "presence_penalty": 0.5,
                                    "top_k": 7}
    assert texts.files == FIXTURE_FILES and texts.source == "DR-Venus @bbbbbbb"
    profile = texts.protocol_texts()
    assert P.wrap_tool_response(profile.format_error) == PARSE_NOTICE
    assert profile.prompt() == PROMPT  # its own date line, verbatim
    assert profile.prompt("2032-01-02") == PROMPT.replace("2031-07-09", "2032-01-02")


def test_a_file_without_what_is_expected_is_one_line_naming_it(tmp_path):
    root = tmp_path / "checkouts"
    for path in INFERENCE_FILES:
        (root / "DR-Venus" / path).parent.mkdir(parents=True, exist_ok=True)
        (root / "DR-Venus" / path).write_bytes((FIXTURES / "DR-Venus" / path).read_bytes())
    demo = root / "DR-Venus" / RUN_DEMO
    demo.write_text(demo.read_text().replace('"answered_max_steps"', '"elsewhere"'))
    files = {p: hashlib.sha256((root / "DR-Venus" / p).read_bytes()).hexdigest()
             for p in INFERENCE_FILES}
    edited = ReferenceStore(cache_dir=tmp_path / "cache", local_dir=root, download=False,
                            sources={"DR-Venus": Source("DR-Venus", "x/y", "c" * 40, files)})
    with pytest.raises(ExtractError) as info:
        load_dr_venus_texts(edited)
    assert "\n" not in str(info.value)
    assert str(info.value).startswith("DR-Venus/Inference/run_demo.py: ")
    assert "answered_max_steps" in str(info.value)


# ---------------------------------------------------------------- what is sent


def test_the_agent_sends_the_prompt_and_notices_byte_for_byte(store):
    texts = load_dr_venus_texts(store).protocol_texts()
    config = AgentConfig(texts=texts, max_attempts=1, backoff_base=0.0, max_steps=2)
    model = ScriptedModel(["no tags at all", call("search", query=["x"]), answer("42")])
    rec = asyncio.run(ResearchAgent(model, ScriptedTools(), config).run("q?"))
    contents = [m["content"] for m in rec.messages]
    assert contents[0] == PROMPT and contents[1] == "q?"
    assert contents[3] == PARSE_NOTICE
    assert contents[5] == STEPS_NOTICE and rec.termination == "answered_max_steps"

    config = AgentConfig(texts=texts, max_attempts=1, max_context_tokens=1000)
    model = ScriptedModel([call("search", query=["x"]), answer("42")])
    rec = asyncio.run(ResearchAgent(model, ScriptedTools("y" * 8000), config).run("q?"))
    assert rec.messages[-2]["content"] == CONTEXT_NOTICE
    assert rec.termination == "answered_token_limit"


def test_the_visit_failure_frame_is_the_profile_s(store):
    from drvenus.tools.pages import FetchReader
    from drvenus.tools.visit import Visit

    texts = load_dr_venus_texts(store).protocol_texts()
    visit = Visit([FetchReader()], texts=texts)
    body = asyncio.run(visit({"url": ["not-a-web-url", "ftp://x"], "goal": "g"}))
    assert body == P.join_visits([failure_frame("not-a-web-url", "g"), failure_frame("ftp://x", "g")])
    frames = P.parse_visit_body(body)
    # read in the profile's words, handed in (no table filled by an earlier load)
    assert frames and all(P.is_visit_failure(f["summary"], texts) for f in frames)
    assert P.classify_tool_response(STEPS_NOTICE, texts) == "message"
    assert not any(P.is_visit_failure(f["summary"]) for f in frames)  # not drvenus's words
    assert P.classify_tool_response(STEPS_NOTICE) is None


def test_the_extractor_sends_its_prompt_and_only_its_sampling(fixture_env):
    from drvenus.stack import build_extractor

    reply = json.dumps({"rational": "r", "evidence": "the evidence", "summary": "the summary"})
    with StubServer(default=reply) as server:
        settings = Settings(protocol="dr-venus", extractor_base_url=server.base_url,
                            extractor_model="extractor")
        extractor = build_extractor(settings)
        page = "A page about {braces} and facts."
        got = asyncio.run(extractor.extract(page, "the goal", "https://example.org/p"))
        asyncio.run(extractor.aclose())
    assert got is not None and got.evidence == "the evidence"
    body = server.requests[-1].json
    assert body["messages"] == [
        {"role": "user", "content": EXTRACTOR.format(webpage_content=page, goal="the goal")}]
    assert body["temperature"] == 0.3
    assert not {"top_p", "top_k", "presence_penalty", "max_tokens"} & set(body)
    assert extractor.fallback is None  # a page DR-Venus cannot summarise gets its failure frame


# ---------------------------------------------------------------- the commands


def _corpus(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.jsonl"
    path.write_text(json.dumps({"id": "1", "title": "Dracula",
                                "url": "https://en.wikipedia.org/wiki/Dracula",
                                "text": "Dracula is an 1897 novel by Bram Stoker."}) + "\n")
    return path


def test_ask_with_protocol_dr_venus_sends_its_texts(fixture_env, tmp_path):
    visit = json.dumps({"name": "visit", "arguments": {"url": ["https://nowhere.example/x"],
                                                       "goal": "who wrote it"}})
    script = ["no tags at all", P.render_tool_call_turn("Open it.", visit),
              P.render_answer_turn("Done.", "Bram Stoker")]
    with StubServer(script) as server:
        res = CliRunner().invoke(app, [
            "ask", "Who wrote Dracula?", "--protocol", "dr-venus", "--json",
            "--base-url", server.base_url, "--model-name", "stub-model",
            "--corpus", str(_corpus(tmp_path)), "--max-steps", "2",
        ], env={"DRVENUS_MAX_ATTEMPTS": "1"})
    assert res.exit_code == 0, res.output
    first = next(r.json for r in server.requests if r.path.endswith("/chat/completions"))
    assert first["messages"][0] == {"role": "system", "content": PROMPT}
    assert (first["temperature"], first["top_p"], first["top_k"], first["presence_penalty"],
            first["max_tokens"], first["stop"]) == (0.6, 0.8, 7, 0.5, 1234, ["<tool_response>"])
    record = json.loads(res.stdout.strip().splitlines()[-1])
    contents = [m["content"] for m in record["messages"]]
    assert contents[0] == PROMPT and contents[3] == PARSE_NOTICE
    assert contents[5] == STEPS_NOTICE  # the failure frame it replaced is in the trace
    assert record["termination"] == "answered_max_steps"


def test_the_visit_failure_frame_reaches_the_model_from_the_cli(fixture_env, tmp_path):
    visit = json.dumps({"name": "visit", "arguments": {"url": ["https://nowhere.example/x"],
                                                       "goal": "who wrote it"}})
    script = [P.render_tool_call_turn("Open it.", visit),
              P.render_answer_turn("Done.", "Bram Stoker")]
    with StubServer(script) as server:
        res = CliRunner().invoke(app, [
            "ask", "Who wrote Dracula?", "--protocol", "dr-venus", "--json",
            "--base-url", server.base_url, "--model-name", "stub-model",
            "--corpus", str(_corpus(tmp_path)),
        ])
    assert res.exit_code == 0, res.output
    second = [r.json for r in server.requests if r.path.endswith("/chat/completions")][1]
    frame = failure_frame("https://nowhere.example/x", "who wrote it").strip()
    assert second["messages"][-1] == {"role": "user", "content": P.wrap_tool_response(frame)}


@pytest.mark.parametrize("break_it", ["hash", "missing"])
def test_a_wrong_or_missing_file_is_one_line_and_exit_2(fixture_env, tmp_path, monkeypatch,
                                                        break_it):
    if break_it == "hash":  # the real pins over the fixtures' bytes: another version
        monkeypatch.setitem(SOURCES, "DR-Venus", REAL_SOURCE)
        expected = (f"DR-Venus/{RUN_DEMO}: sha256 {FIXTURE_FILES[RUN_DEMO]} where "
                    f"{REAL_SOURCE.files[RUN_DEMO]} is expected")
    else:
        monkeypatch.setenv("DRVENUS_REFERENCE_DIR", str(tmp_path / "empty"))
        expected = f"DR-Venus/{RUN_DEMO}: not found in DRVENUS_REFERENCE_DIR"
    for args in (["ask", "q?", "--protocol", "dr-venus", "--base-url", "http://127.0.0.1:9",
                  "--model-name", "m"],
                 ["data", "clean", "-i", str(tmp_path), "-o", str(tmp_path / "out"),
                  "--file-pattern", "*.parquet", "--protocol", "dr-venus"]):
        if args[0] == "data":
            write_parquet([tiny_clean_row(0)], tmp_path / "train-0.parquet")
        res = CliRunner().invoke(app, args)
        lines = res.stderr.strip().splitlines()
        assert res.exit_code == 2, res.output
        assert len(lines) == 1 and lines[0].startswith(f"error: {expected}"), res.stderr
        assert "Traceback" not in res.output


def test_data_clean_writes_its_system_prompt(fixture_env, tmp_path):
    source = write_parquet([tiny_clean_row(k) for k in range(2)], tmp_path / "in" / "train-0.parquet")
    for extra, date in (([], "2031-07-09"), (["--current-date", "2030-01-02"], "2030-01-02")):
        out = tmp_path / f"out-{date}"
        res = CliRunner().invoke(app, ["data", "clean", "-i", str(source.parent), "-o", str(out),
                                       "--protocol", "dr-venus", "--correctness", "off", *extra])
        assert res.exit_code == 0, res.output
        rows = pq.read_table(out / "cleaned_resampled.parquet").to_pylist()
        assert rows and {r["messages"][0]["content"] for r in rows} == {
            PROMPT.replace("2031-07-09", date)}
        stats = json.loads((out / "stats.json").read_text())
        assert (stats["protocol"], stats["current_date"]) == ("dr-venus", date)


def test_every_agent_command_takes_protocol():
    cli = typer.main.get_command(app)
    for path in (["ask"], ["run"], ["eval"], ["serve"], ["mcp"], ["tools", "serve"],
                 ["data", "clean"]):
        command = cli
        for name in path:
            command = command.commands[name]  # type: ignore[attr-defined]
        assert "protocol" in {p.name for p in command.params}, path


def test_a_real_model_on_our_wording_is_told_how_to_get_dr_venus_s(fixture_env):
    from drvenus.stack import protocol_note

    note = protocol_note(Settings(base_url="http://127.0.0.1:9/v1"))
    assert note is not None and "\n" not in note and len(note) < 100
    assert "--protocol dr-venus" in note and "drvenus reference pull" in note
    assert protocol_note(Settings(model_path=Path("m.gguf"))) == note
    assert protocol_note(Settings()) is None  # the embedded model: our wording is its own
    assert protocol_note(Settings(base_url="http://127.0.0.1:9/v1"), "prompt.txt") is None
    mine = protocol_note(Settings(base_url="http://127.0.0.1:9/v1", protocol="dr-venus"))
    assert mine is not None and "DR-Venus @bbbbbbb" in mine and FIXTURE_FILES[RUN_DEMO][:12] in mine


def test_the_cli_says_it_once_and_only_with_v(tmp_path):
    """Our own wording is the default: said only with -v, once."""
    from helpers.cli import drvenus

    env = {k: v for k, v in os.environ.items() if not k.startswith("DRVENUS_")}
    env["DRVENUS_CACHE_DIR"] = str(tmp_path / "cache")
    args = ("ask", "q?", "--base-url", None, "--model-name", "stub-model",
            "--corpus", str(_corpus(tmp_path)))
    with StubServer(default=P.render_answer_turn("Done.", "42")) as server:
        call = [server.base_url if a is None else a for a in args]
        quiet = drvenus(*call, env=env, cwd=tmp_path)
        verbose = drvenus("-v", *call, env=env, cwd=tmp_path)
    assert quiet.returncode == 0 and verbose.returncode == 0, quiet.stderr + verbose.stderr
    assert "--protocol dr-venus" not in quiet.stderr
    assert verbose.stderr.count("drvenus's own wording") == 1, verbose.stderr  # (log lines wrap)


def test_unknown_protocol_is_named_by_its_flag(fixture_env):
    res = CliRunner().invoke(app, ["ask", "q?", "--protocol", "venus", "--base-url",
                                   "http://127.0.0.1:9", "--model-name", "m"])
    assert res.exit_code == 2
    assert res.stderr.strip().startswith("error: --protocol: ")


# ---------------------------------------------------------------- the real files


@NEEDS_REFERENCE
def test_the_real_files_give_what_run_demo_sends():
    """With the official files: the system prompt sent is run_demo.py's SYSTEM_PROMPT literal
    (cut out of the file's text here, independently of the AST extraction)."""
    real = real_store()
    texts = load_dr_venus_texts(real)
    source = real.location("DR-Venus", RUN_DEMO).read_text(encoding="utf-8")
    literal = re.search(r'^SYSTEM_PROMPT = """(.*?)"""', source, re.DOTALL | re.MULTILINE)
    assert literal is not None and texts.system_prompt == literal.group(1)
    config = AgentConfig(texts=texts.protocol_texts(), max_attempts=1)
    model = ScriptedModel([answer("42")])
    rec = asyncio.run(ResearchAgent(model, ScriptedTools(), config).run("q?"))
    assert rec.messages[0]["content"] == literal.group(1)
    assert texts.files == {p: REAL_SOURCE.files[p] for p in INFERENCE_FILES}
