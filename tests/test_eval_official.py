"""``--grader official``: the official graders' texts taken from pinned files (fixture files of
our own wording laid out like the real ones, tests/fixtures/reference), sent to the judge byte
for byte with the official request fields, and the replies scored as the official code scores
them (first match, case as written, no verdict = wrong); GAIA without a judge; DeepSearchQA's
starter metrics; the report naming the grader, its commit and its file hashes."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from drvenus.eval import official as O
from drvenus.eval.benchmarks import EvalItem, load
from drvenus.eval.judges import Grade
from drvenus.eval.metrics import RunResult, calibration_error, summarize
from drvenus.eval.report import build_report, render_markdown
from drvenus.grading.judge import JudgeClient, JudgeConfig
from drvenus.reference import ReferenceError, ReferenceStore, Source
from drvenus.reference.graders import grader_texts
from stub_server import StubServer

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "reference"
REPOS = {"simple-evals": "openai/simple-evals", "xbench-evals": "xbench-ai/xbench-evals",
         "hle": "centerforaisafety/hle"}


def _sources() -> dict[str, Source]:
    out = {}
    for name, repo in REPOS.items():
        folder = FIXTURES / name
        files = {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
                 for p in sorted(folder.rglob("*.py"))}
        out[name] = Source(name=name, repo=repo, commit="f" * 40, files=files, licence="test")
    return out


@pytest.fixture()
def store(tmp_path: Path) -> ReferenceStore:
    return ReferenceStore(cache_dir=tmp_path / "cache", local_dir=FIXTURES, sources=_sources())


def _client(server: StubServer, tmp_path: Path, **kw) -> JudgeClient:
    cfg = JudgeConfig(base_url=server.base_url, model="judge-x",
                      cache_path=tmp_path / "cache.sqlite", retries=kw.pop("retries", 1), **kw)
    return JudgeClient(cfg)


def _grade(grader: O.OfficialGrader, item: EvalItem, prediction: str,
           judge: JudgeClient | None) -> Grade:
    async def go() -> Grade:
        try:
            return await grader.grade(item, prediction, judge)
        finally:
            if judge is not None:
                await judge.aclose()

    return asyncio.run(go())


ITEM = EvalItem("7", "Which {year}?", "1937", ["1937"])
OWN_SAMPLING = ("top_k", "top_p", "presence_penalty", "stop", "stream", "temperature",
                "max_tokens")


# ---------------------------------------------------------------------------- extraction
def test_texts_are_taken_from_the_pinned_files(store):
    bc = grader_texts("browsecomp", store)
    assert bc.template.startswith("Fixture grader. Compare a {{reply}}") and bc.template.endswith(
        "correct: no")  # .strip() applied, as the official code applies it
    assert bc.fields == ("question", "response", "correct_answer")
    assert bc.system == "Fixture system line: grade carefully."
    assert dict(bc.request) == {"temperature": 0.25, "max_tokens": 777}  # default temperature
    assert bc.judge_model == "fixture-grader-1"
    assert [f.path for f in bc.files] == ["browsecomp_eval.py", "simple_evals.py",
                                          "sampler/chat_completion_sampler.py"]
    assert all(f.commit == "f" * 40 and len(f.sha256) == 64 for f in bc.files)

    xb = grader_texts("xbench", store)
    assert xb.template.startswith("夹具评分") and xb.system is None and dict(xb.request) == {}
    assert xb.judge_model == "fixture-judge-flash"

    hle = grader_texts("hle", store)
    assert hle.request["max_completion_tokens"] == 321 and hle.judge_model == "fixture-o-mini"
    schema = hle.request["response_format"]["json_schema"]
    assert schema["name"] == "ExtractedAnswer" and schema["strict"] is True
    props = schema["schema"]["properties"]
    assert list(props) == ["extracted_final_answer", "reasoning", "correct", "confidence",
                           "strict"]
    assert props["correct"] == {"type": "string", "enum": ["yes", "no"]}
    assert props["confidence"] == {"type": "integer"}
    assert props["strict"] == {"type": "boolean", "enum": [True]}
    assert schema["schema"]["required"] == list(props)


def test_a_missing_or_edited_file_is_refused_with_one_line(tmp_path: Path):
    sources = _sources()
    empty = ReferenceStore(cache_dir=tmp_path / "c", local_dir=tmp_path / "none",
                           sources=sources)
    with pytest.raises(ReferenceError) as info:
        O.official_grader("browsecomp", empty)
    line = str(info.value)
    assert "\n" not in line and "simple-evals/browsecomp_eval.py" in line
    assert sources["simple-evals"].files["browsecomp_eval.py"] in line
    with pytest.raises(ValueError, match="no official grader"):
        O.official_grader("qa", empty)


# ---------------------------------------------------------------------------- BrowseComp
def test_browsecomp_prompt_is_sent_byte_for_byte_with_the_official_request(store, tmp_path):
    grader = O.official_grader("browsecomp", store)
    with StubServer(["explanation...\ncorrect: yes\nconfidence: 90%"]) as server:
        grade = _grade(grader, ITEM, "It was {1937}.", _client(server, tmp_path))
    assert (grade.correct, grade.method, grade.grader) == (True, "official", "browsecomp")
    body = server.chat_requests[0].json
    assert body["messages"] == [
        {"role": "system", "content": "Fixture system line: grade carefully."},
        {"role": "user", "content": "Fixture grader. Compare a {reply} with the truth.\n\n"
                                    "Q> Which {year}?\nR> It was {1937}.\nT> 1937\n\n"
                                    "Finish with the line: correct: yes or correct: no"},
    ]
    assert body["model"] == "judge-x"
    assert (body["temperature"], body["max_tokens"]) == (0.25, 777)
    assert not {"top_k", "top_p", "presence_penalty", "stop"} & set(body)


@pytest.mark.parametrize(
    ("reply", "correct", "method"),
    [
        ("correct: yes", True, "official"),
        ("correct: no", False, "official"),
        ("correct: no\ncorrect: yes", False, "official"),  # the first match wins
        ("reasoning: fine\ncorrect: yes\n\ncorrect: no", True, "official"),
        ("Correct: yes", False, O.NO_VERDICT),  # case as written
        ("correct: Yes", False, O.NO_VERDICT),
        ("**correct:** yes", False, O.NO_VERDICT),
        ("correct:yes", False, O.NO_VERDICT),
        ("the answer is incorrect: yes", True, "official"),  # a plain search, as there
        ("<think>correct: no</think>\ncorrect: yes", True, "official"),  # content only
    ],
)
def test_browsecomp_replies_are_scored_as_simple_evals_does(store, tmp_path, reply, correct,
                                                            method):
    grader = O.official_grader("browsecomp", store)
    with StubServer([reply]) as server:
        grade = _grade(grader, ITEM, "1937", _client(server, tmp_path))
    assert (grade.correct, grade.method) == (correct, method)


def test_an_empty_reply_is_asked_again_and_a_dead_judge_is_a_judge_error(store, tmp_path):
    grader = O.official_grader("browsecomp", store)
    with StubServer(["", "correct: yes"]) as server:
        assert _grade(grader, ITEM, "1937", _client(server, tmp_path)).correct is True
    assert len(server.chat_requests) == 2
    with StubServer() as server:
        server.fail_next(10, status=500)
        dead = _grade(grader, ITEM, "1937", _client(server, tmp_path / "b", retries=0))
    assert dead.correct is None and dead.error


def test_verdicts_are_cached_without_the_reply(store, tmp_path):
    grader = O.official_grader("browsecomp", store)
    with StubServer(["reasoning: SECRET WORDS\ncorrect: yes"]) as server:
        first = _grade(grader, ITEM, "1937", _client(server, tmp_path))
        second = _grade(grader, ITEM, "1937", _client(server, tmp_path))
    assert first == second and first.correct and len(server.chat_requests) == 1
    assert b"SECRET WORDS" not in (tmp_path / "cache.sqlite").read_bytes()


# ---------------------------------------------------------------------------- xbench
XB = EvalItem("x1", "首都？", "北京", ["北京"])


def test_xbench_prompt_byte_for_byte_and_no_sampling_fields(store, tmp_path):
    grader = O.official_grader("xbench", store)
    with StubServer(["结论: 正确"]) as server:
        grade = _grade(grader, XB, "北京市", _client(server, tmp_path))
    assert grade.correct is True
    body = server.chat_requests[0].json
    assert body["messages"] == [{"role": "user", "content":
                                 "夹具评分：比较[回答]与[正确答案]。{保留}\n\n题目: 首都？\n"
                                 "标准: 北京\n回答: 北京市\n\n最后一行写 结论: 正确 或 结论: 错误"}]
    assert set(body) == {"model", "messages"}  # the official request sets nothing else


@pytest.mark.parametrize(
    ("reply", "correct", "method"),
    [
        ("结论: 正确", True, "official"),
        ("结论:正确", True, "official"),
        ("结论: 错误\n结论: 正确", False, "official"),  # the first match wins
        ("结论：正确", False, "official"),  # a full-width colon reads as the whole match
        ("结论 正确", False, "official"),
        ("结论:: 正确", False, "official"),  # the text between the first two colons
        ("结论正确", False, O.NO_VERDICT),
        ("结论:  正确", False, O.NO_VERDICT),
        ("判断: 正确", False, O.NO_VERDICT),
    ],
)
def test_xbench_replies_are_scored_as_xbench_evals_does(store, tmp_path, reply, correct, method):
    grader = O.official_grader("xbench", store)
    with StubServer([reply]) as server:
        grade = _grade(grader, XB, "北京市", _client(server, tmp_path))
    assert (grade.correct, grade.method) == (correct, method)


def test_xbench_exact_shortcut_reads_the_final_answer_line(store, tmp_path):
    grader = O.official_grader("xbench", store)
    with StubServer() as server:
        hit = _grade(grader, XB, "理由……\n最终答案: 北京 ", _client(server, tmp_path))
    assert (hit.correct, hit.method) == (True, "official-exact") and not server.chat_requests
    assert O.xbench_answer("最终答案：北京") == "最终答案：北京"  # no ASCII colon: all of it
    assert O.xbench_answer("最终答案:北京:海淀") == "北京"
    assert O.xbench_answer("北京") is None


# ---------------------------------------------------------------------------- HLE
def _hle(**changes) -> str:
    verdict = {"extracted_final_answer": "1937", "reasoning": "SECRET", "correct": "yes",
               "confidence": 85, "strict": True, **changes}
    return json.dumps({k: v for k, v in verdict.items() if v is not None})


def test_hle_prompt_and_structured_request(store, tmp_path):
    grader = O.official_grader("hle", store)
    with StubServer([_hle()]) as server:
        grade = _grade(grader, ITEM, "1937 (sure: 85%)", _client(server, tmp_path))
    assert (grade.correct, grade.confidence, grade.extracted) == (True, 85.0, "1937")
    body = server.chat_requests[0].json
    assert body["messages"] == [{"role": "user", "content":
                                 "Fixture judge. Read the {response} and decide.\n\n"
                                 "question = Which {year}?\nresponse = 1937 (sure: 85%)\n"
                                 "truth = 1937\n\nGive extracted_final_answer, reasoning, "
                                 "correct (yes/no) and confidence (0-100)."}]
    assert body["max_completion_tokens"] == 321
    assert body["response_format"]["type"] == "json_schema"
    assert not set(OWN_SAMPLING) & set(body)
    assert b"SECRET" not in (tmp_path / "cache.sqlite").read_bytes()


@pytest.mark.parametrize(
    ("reply", "correct", "method"),
    [
        (_hle(correct="no"), False, "official"),
        (_hle(confidence="70"), True, "official"),  # pydantic reads digits as an integer
        (_hle(correct="Yes"), False, O.NO_VERDICT),
        (_hle(strict=None), False, O.NO_VERDICT),
        (_hle(confidence="high"), False, O.NO_VERDICT),
        ("correct: yes", False, O.NO_VERDICT),
        ("```json\n" + _hle() + "\n```", False, O.NO_VERDICT),
    ],
)
def test_hle_replies_without_a_valid_verdict_are_wrong(store, tmp_path, reply, correct, method):
    grader = O.official_grader("hle", store)
    with StubServer([reply]) as server:
        grade = _grade(grader, ITEM, "1937", _client(server, tmp_path))
    assert (grade.correct, grade.method) == (correct, method)


def test_hle_calibration_skips_the_last_bin():
    conf = [float(i % 100) for i in range(250)]
    right = [i % 3 == 0 for i in range(250)]
    assert calibration_error(conf, right, skip_last=True) != calibration_error(conf, right)
    assert calibration_error(conf[:150], right[:150], skip_last=True) == 0.0


# ---------------------------------------------------------------------------- GAIA
def test_gaia_official_scorer_never_asks_a_judge(tmp_path):
    grader = O.official_grader("gaia")
    assert grader.texts is None and not grader.needs_judge
    with StubServer() as server:
        item = EvalItem("g", "q", "7", ["7"])
        assert _grade(grader, item, "7.0", _client(server, tmp_path)).correct is True
        assert _grade(grader, item, "seven", _client(server, tmp_path)).correct is False
        cjk = EvalItem("c", "q", "北京上海", ["北京上海"])
        assert _grade(grader, cjk, "北京，上海", None).correct is False
    assert not server.chat_requests


# ---------------------------------------------------------------------------- DeepSearchQA
def _dsqa(details: dict[str, bool], extra: list[str]) -> str:
    return "```json\n" + json.dumps({"explanation": "x", "correctness_details": details,
                                      "excessive_answers": extra}) + "\n```"


def test_dsqa_starter_metrics_for_both_answer_types(tmp_path):
    grader = O.official_grader("deepsearchqa")
    set_item = EvalItem("s", "Name them", "Paris, Lyon", ["Paris, Lyon"],
                        {"answer_type": "Set Answer"})
    single = EvalItem("t", "Which?", "Rome", ["Rome"], {"answer_type": "Single Answer"})
    replies = [_dsqa({"Paris": True, "Lyon": True}, []),
               _dsqa({"Paris": True, "Lyon": True}, ["Nice"]),
               _dsqa({"Paris": False, "Lyon": False}, ["Nice"]),
               _dsqa({"Rome": True}, []),
               "no json here"]
    with StubServer(replies) as server:
        grades = [_grade(grader, set_item, f"answer {k}", _client(server, tmp_path))
                  for k in range(3)]
        grades += [_grade(grader, single, f"answer {k}", _client(server, tmp_path))
                   for k in range(2)]
    assert [g.correct for g in grades] == [True, False, False, True, False]
    assert grades[1].score == pytest.approx(0.8) and grades[2].score == 0.0
    assert grades[4].method == O.NO_VERDICT
    prompt = server.chat_requests[0].json["messages"][0]["content"]
    assert "Answer type: Set Answer" in prompt and "Paris, Lyon" in prompt
    assert O.dsqa_metrics(2, 2, 1)["correct_with_excessive"]
    assert O.dsqa_metrics(0, 0, 0)["fully_correct"] and O.dsqa_metrics(3, 0, 0)["fully_incorrect"]

    rows = [RunResult(item_id=i.id, run=k, correct=g.correct, score=g.score,
                      is_set=i.meta["answer_type"] == "Set Answer", grade=g.to_dict())
            for k, (i, g) in enumerate(zip([set_item] * 3 + [single] * 2, grades, strict=True))]
    m = summarize(rows)["deepsearchqa_official"]
    assert m["rows"] == 5 and m["fully_correct"] == pytest.approx(2 / 5)
    assert m["correct_with_excessive"] == pytest.approx(1 / 5)
    assert m["fully_incorrect"] == pytest.approx(1 / 5)
    assert m["fully_correct_by_type"] == {"set": pytest.approx(1 / 3), "single": 0.5}
    assert summarize(rows)["no_verdict"] == 1


# ---------------------------------------------------------------------------- report
def test_the_report_names_the_grader_its_commit_and_file_hashes(store):
    grader = O.official_grader("browsecomp", store)
    rows = [RunResult(item_id="1", run=0, correct=True, grade={"method": "official"}),
            RunResult(item_id="2", run=0, correct=False,
                      grade={"method": O.NO_VERDICT})]
    report = build_report({"benchmark": "browsecomp", "items": 2, "runs": 1}, rows,
                          "browsecomp", "judge-x", grader.describe())
    files = report["grading"]["files"]
    assert report["grading"]["grader"] == "official" and len(files) == 3
    assert report["scoring"].startswith("official grader: simple-evals BrowseComp grader")
    assert "openai/simple-evals @fffffff browsecomp_eval.py sha256" in report["scoring"]
    assert "the official code uses fixture-grader-1" in report["scoring"]
    md = render_markdown(report)
    assert files[0]["sha256"] in md and "f" * 40 in md and "differs from the official" in md
    assert "temperature=0.25" in md and "Replies without a verdict" in md
    ours = build_report({"benchmark": "x", "items": 1, "runs": 1}, rows[:1], "qa", None)
    assert ours["grading"] == {"grader": "ours"} and "grader source" not in render_markdown(ours)


def test_hle_benchmark_loader(tmp_path):
    path = tmp_path / "hle.jsonl"
    rows = [{"id": "a", "question": "Q1", "answer": "A1", "image": "", "answer_type": "exactMatch"},
            {"id": "b", "question": "Q2", "answer": "A2", "image": "data:image/png;base64,xx"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert [i.id for i in load("hle", path)] == ["a", "b"]
    assert [i.id for i in load("hle-text", path)] == ["a"]


# ---------------------------------------------------------------------------- the command
ANSWER = "<think>\nDone.\n</think>\n<answer>\nBram Stoker\n</answer>"


def _drvenus(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("DRVENUS_JUDGE_", "DRVENUS_REFERENCE_"))}
    return subprocess.run(
        [sys.executable, "-m", "drvenus", *args], capture_output=True, text=True, timeout=180,
        env={**base, "PYTHONPATH": str(ROOT / "src"), "DRVENUS_MAX_ATTEMPTS": "1", **env})


def _corpus(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.jsonl"
    path.write_text(json.dumps({"id": "1", "title": "Dracula", "url": "https://example.org/d",
                                "text": "Dracula is a novel by Bram Stoker."}) + "\n")
    return path


def test_cli_gaia_official_and_refusals(tmp_path: Path):
    data = tmp_path / "metadata.jsonl"
    data.write_text("".join(json.dumps({"task_id": t, "Question": "Who wrote Dracula?",
                                        "Final answer": a, "Level": "1", "file_name": ""}) + "\n"
                            for t, a in (("g1", "bram stoker"), ("g2", "Jane Austen"))))
    with StubServer([], default=ANSWER) as server:
        common = ("--runs", "1", "--base-url", server.base_url, "--model-name", "stub",
                  "--corpus", str(_corpus(tmp_path)))
        r = _drvenus("eval", "--benchmark", "gaia", "--data", str(data), "--out",
                     str(tmp_path / "g"), "--grader", "official", "--judge-base-url",
                     server.base_url, "--judge-model", "stub", *common, env={})
        assert r.returncode == 0, r.stderr
        report = json.loads((tmp_path / "g" / "report.json").read_text())
        assert report["metrics"]["avg_at_k"] == 0.5
        assert len(server.chat_requests) == 2  # the two agent turns; no judge fallback
        assert report["scoring"].startswith("official grader: GAIA official scorer")

        before = len(server.chat_requests)
        qa = tmp_path / "qa.jsonl"
        qa.write_text(json.dumps({"id": "q", "question": "Who?", "answer": "Bram Stoker"}) + "\n")
        missing = _drvenus("eval", "--benchmark", "jsonl", "--data", str(qa), "--out",
                           str(tmp_path / "j"), "--grader", "official", *common, env={})
        assert missing.returncode == 2 and "no official grader" in missing.stderr
        xb = tmp_path / "xb.csv"
        xb.write_text("id,prompt,answer,reference_steps,canary\n1,AAAA,AAAA,,c\n")
        refused = _drvenus("eval", "--benchmark", "xbench-deepsearch", "--data", str(xb),
                           "--out", str(tmp_path / "x"), "--grader", "official",
                           "--judge-base-url", server.base_url, "--judge-model", "stub",
                           *common, env={"DRVENUS_REFERENCE_DIR": str(tmp_path / "no-refs")})
        assert refused.returncode == 2 and refused.stderr.count("\n") == 1
        assert "xbench-evals/eval_grader.py" in refused.stderr and "sha256" in refused.stderr
        dsqa = tmp_path / "dsqa.csv"
        dsqa.write_text("example_id,problem,problem_category,answer,answer_type\n"
                        "1,Who wrote Dracula?,Books,Bram Stoker,Single Answer\n")
        nojudge = _drvenus("eval", "--benchmark", "deepsearchqa", "--data", str(dsqa),
                           "--out", str(tmp_path / "d"), "--grader", "official", *common,
                           env={})
        assert nojudge.returncode == 2 and "needs a judge" in nojudge.stderr
        assert len(server.chat_requests) == before  # refused before any agent run
