"""Deterministic scorers (GAIA's edge cases, EM/F1, set answers) and the benchmark judges'
verdict parsing, against a local OpenAI-compatible stub returning the varieties of verdict text."""

from __future__ import annotations

import asyncio

import pytest

from drvenus.eval import judges as J
from drvenus.eval.benchmarks import EvalItem
from drvenus.eval.scoring import em, f1, gaia_match, gaia_score, loose_equal, set_score
from drvenus.grading.judge import JudgeClient, JudgeConfig
from stub_server import StubServer


# ---------------------------------------------------------------------------- GAIA scorer
@pytest.mark.parametrize(
    ("prediction", "truth", "ok"),
    [
        ("17", "17", True),
        ("17.0", "17", True),
        ("$1,234", "1234", True),
        ("45%", "45", True),
        ("about 17", "17", False),
        ("", "17", False),
        ("17", "17.5", False),
        ("Paris", "paris", True),
        ("  Saint-Étienne ", "saint étienne", True),
        ("St. Louis", "st louis", True),
        ("Louisville", "St Louis", False),
        ("a, b, c", "a,b,c", True),
        ("a; b; c", "a, b, c", True),
        ("a, b", "a, b, c", False),
        ("1, 2.0, x", "1, 2, x", True),
        ("1, 3, x", "1, 2, x", False),
        ("b.c, d", "b c, d", False),  # list elements keep their punctuation
        ("Egalitarian", "egalitarian", True),
        # the official normalisation removes white space (full-width too) and ASCII
        # punctuation only: CJK and full-width marks and letters stay as they are
        ("hello!", "Hello", True),
        ("北京\u3000上海", "北京上海", True),
        ("北京，上海", "北京上海", False),
        ("東京。", "東京", False),
        ("ＡＢＣ", "abc", False),
    ],
)
def test_gaia_match(prediction, truth, ok):
    assert gaia_match(prediction, truth) is ok


def test_gaia_score_any_alternative_and_empty():
    assert gaia_score("12", ["eleven", "12"])
    assert not gaia_score("", ["12"])


def test_em_f1_loose_and_sets():
    assert em("The Eiffel Tower", ["eiffel tower"]) and not em("", ["x"])
    assert f1("Chief of Protocol of the US", ["Chief of Protocol"]) == pytest.approx(2 * 0.6 / 1.6)
    assert loose_equal("北京 市。", ["北京市"]) and loose_equal("ＡＢＣ", ["abc"])
    full = set_score("Paris, Lyon, and Nice", "Nice; Paris; Lyon")
    assert full.fully_correct and full.f1 == 1.0
    extra = set_score("Paris, Lyon, Nice, Lille", "Paris, Lyon, Nice")
    assert not extra.fully_correct and extra.extra == 1 and extra.f1 == pytest.approx(6 / 7)
    assert set_score("Trinidad and Tobago, Chad", "Chad, Trinidad and Tobago").fully_correct
    miss = set_score("Paris", "Paris, Lyon")
    assert (miss.found, miss.recall, miss.precision) == (1, 0.5, 1.0)


# ---------------------------------------------------------------------------- verdict parsing
YES_FORMS = [
    "extracted_final_answer: 42\nreasoning: same number.\ncorrect: yes\nconfidence: 90%",
    "**extracted_final_answer:** 42\n**reasoning:** ok\n**correct:** yes\n**confidence:** 90%",
    "Extracted_final_answer: 42\nCorrect: Yes\nConfidence: 90",
    "- correct: **yes**",
    "correct:yes",
    "## Correct: YES.",
    "`correct`: yes",
    '{"extracted_final_answer": "42", "correct": "yes", "confidence": "90%"}'.replace(", ", "\n"),
    "<think>Is it correct: no? Let me check. correct: no</think>\ncorrect: yes",
    "reasoning: the response matches.\ncorrect: no\ncorrect: yes",  # the last verdict counts
    "correct：yes",
    "Final verdict -> correct: yes",  # inside a line, not quoting the answer
]
NO_FORMS = [
    "extracted_final_answer: correct: yes\nreasoning: differs\ncorrect: no\nconfidence: 10%",
    "**correct:** no",
    "correct: No, the response names a different person.",
    "extracted_final_answer: None\ncorrect: no",
    "correct: incorrect",
]
UNPARSEABLE = [
    "",
    "I think it is right.",
    "extracted_final_answer: correct: yes",  # only the quoted answer says it
    "correct_answer: yes",
    "The answer is incorrect: yes indeed",
]


@pytest.mark.parametrize("reply", YES_FORMS)
def test_yes_forms(reply):
    assert J.parse_yes_no(reply) is True


@pytest.mark.parametrize("reply", NO_FORMS)
def test_no_forms(reply):
    assert J.parse_yes_no(reply) is False


@pytest.mark.parametrize("reply", UNPARSEABLE)
def test_unparseable(reply):
    assert J.parse_yes_no(reply) is None


def test_confidence_and_extracted():
    assert J.parse_confidence("confidence: 85%") == 85.0
    assert J.parse_confidence("**Confidence:** 0.7") == pytest.approx(70.0)
    assert J.parse_confidence("confidence: 250%") == 100.0
    assert J.parse_confidence("no confidence given") is None
    assert J.parse_extracted("**extracted_final_answer:** Golden Gate: 1937") == "Golden Gate: 1937"
    assert J.parse_extracted("extracted_final_answer: None") is None
    verdict = J.parse_hle(YES_FORMS[0])
    assert verdict == {"correct": True, "confidence": 90.0, "extracted": "42"}
    assert J.parse_hle(J.render_hle(verdict)) == verdict


@pytest.mark.parametrize(
    ("reply", "ok"),
    [
        ("最终答案: 北京\n解释: 一致\n结论: 正确", True),
        ("最终答案: 上海\n解释: 不一致\n结论：错误", False),
        ("**结论**：**正确**", True),
        ("结论: 不正确", False),
        ("解释: 虽然说“正确”二字出现\n结论: 错误", False),
        ("correct: yes", True),
    ],
)
def test_xbench_verdicts(reply, ok):
    assert J.parse_xbench(reply) == {"correct": ok}


def test_xbench_unparseable():
    assert J.parse_xbench("最终答案: 北京\n解释: 一致") is None


def test_set_marks():
    reply = "item 1: yes\n**item 2:** no\nItem 3: YES\nextra: 1"
    assert J.parse_set_marks(reply, 3) == {"found": [True, False, True], "extra": 1}
    assert J.parse_set_marks("item 1: yes\nextra: 0", 2) is None  # item 2 missing
    assert J.parse_set_marks("item 1: yes\nitem 2: yes", 2) is None  # no extra count
    marks = {"found": [True, False], "extra": 2}
    assert J.parse_set_marks(J.render_set_marks(marks), 2) == marks


# ---------------------------------------------------------------------------- graders over HTTP
def _client(server: StubServer, tmp_path, retries: int = 2) -> JudgeClient:
    cfg = JudgeConfig(base_url=server.base_url, model="judge", retries=retries, timeout_s=10,
                      cache_path=tmp_path / "cache.sqlite")
    return JudgeClient(cfg)


def _grade(grader: str, item: EvalItem, prediction: str, judge: JudgeClient | None) -> J.Grade:
    async def go():
        try:
            return await J.grade(grader, item, prediction, judge)
        finally:
            if judge is not None:
                await judge.aclose()

    return asyncio.run(go())


ITEM = EvalItem("1", "Which year?", "1937", ["1937"])


@pytest.mark.parametrize("reply", YES_FORMS[:4] + NO_FORMS[:3])
def test_browsecomp_judge_over_http(tmp_path, reply):
    with StubServer([reply]) as server:
        grade = _grade("browsecomp", ITEM, "It opened in nineteen thirty-seven.",
                       _client(server, tmp_path))
    assert grade.correct is J.parse_yes_no(reply) and grade.method == "judge"
    assert len(server.chat_requests) == 1
    prompt = server.chat_requests[0].json["messages"][0]["content"]
    assert "[correct_answer]: 1937" in prompt


def test_unparseable_is_retried_then_a_judge_error(tmp_path):
    with StubServer(["no idea", "still nothing", "hmm"]) as server:
        grade = _grade("browsecomp", ITEM, "1938", _client(server, tmp_path, retries=2))
    assert grade.correct is None and "unparseable" in (grade.error or "")
    assert len(server.chat_requests) == 3


def test_unparseable_then_verdict(tmp_path):
    with StubServer(["thinking...", "**correct:** yes\nconfidence: 60%"]) as server:
        grade = _grade("browsecomp", ITEM, "1937 AD", _client(server, tmp_path))
    assert grade.correct is True and grade.confidence == 60.0


def test_http_failure_is_a_judge_error(tmp_path):
    with StubServer() as server:
        server.fail_next(10, status=500)
        grade = _grade("qa", ITEM, "1938", _client(server, tmp_path, retries=1))
    assert grade.correct is None and grade.error


def test_cache_reuses_verdicts_without_reasoning(tmp_path):
    reply = "extracted_final_answer: 1937\nreasoning: SECRET REASONING\ncorrect: yes\nconfidence: 80%"
    with StubServer([reply]) as server:
        first = _grade("browsecomp", ITEM, "1937!", _client(server, tmp_path))
        second = _grade("browsecomp", ITEM, "1937!", _client(server, tmp_path))
    assert first == second and first.correct and len(server.chat_requests) == 1
    assert b"SECRET REASONING" not in (tmp_path / "cache.sqlite").read_bytes()


def test_shortcuts_skip_the_judge(tmp_path):
    with StubServer() as server:
        assert _grade("xbench", EvalItem("1", "问", "北京", ["北京"]), "北京。",
                      _client(server, tmp_path)).method == "exact"
        assert _grade("gaia", EvalItem("2", "q", "1,5", ["1,5"]), "1; 5",
                      _client(server, tmp_path)).method == "gaia"
        assert _grade("qa", ITEM, "1937", _client(server, tmp_path)).method == "em"
        assert _grade("qa", ITEM, "", _client(server, tmp_path)).correct is False
    assert not server.chat_requests


def test_xbench_and_gaia_judges(tmp_path):
    with StubServer(["最终答案: 北京市\n解释: 同一城市\n结论: 正确", "correct: no"]) as server:
        xb = _grade("xbench", EvalItem("1", "问", "北京", ["北京"]), "首都北京市",
                    _client(server, tmp_path))
        ga = _grade("gaia", EvalItem("2", "q", "7", ["7"]), "eight", _client(server, tmp_path))
    assert (xb.correct, xb.method) == (True, "judge") and (ga.correct, ga.method) == (False, "judge")
    assert "标准答案" in server.chat_requests[0].json["messages"][0]["content"]


def test_deepsearchqa_set_judge_and_fallback(tmp_path):
    item = EvalItem("s", "Name them", "Paris, Lyon, Nice", ["Paris, Lyon, Nice"],
                    {"answer_type": "Set"})
    with StubServer(["item 1: yes\nitem 2: yes\nitem 3: yes\nextra: 0",
                     "item 1: yes\nitem 2: no\nitem 3: yes\nextra: 1"]) as server:
        full = _grade("deepsearchqa", item, "paris lyon nice", _client(server, tmp_path))
        part = _grade("deepsearchqa", item, "Paris, Nice, Lille", _client(server, tmp_path))
    assert full.correct is True and full.score == 1.0
    assert part.correct is False and part.score == pytest.approx(2 / 3)
    assert (part.found_items, part.extra_items, part.gold_items) == (2, 1, 3)
    local = _grade("deepsearchqa", item, "Nice; Lyon; Paris", None)
    assert (local.correct, local.method) == (True, "set")
    single = _grade("deepsearchqa", EvalItem("t", "q", "Rome", ["Rome"]), "rome", None)
    assert single.correct is True
    # the dataset spells the types "Set Answer" / "Single Answer": a reordered set is right
    spelled = EvalItem("u", "Name them", "Paris, Lyon, Nice", ["Paris, Lyon, Nice"],
                       {"answer_type": "Set Answer"})
    assert _grade("deepsearchqa", spelled, "Nice; Lyon; Paris", None).correct is True
    one = EvalItem("v", "q", "Rome", ["Rome"], {"answer_type": "Single Answer"})
    assert _grade("deepsearchqa", one, "rome", None).method != "set"


def test_without_judge_deterministic():
    assert _grade("browsecomp", ITEM, "1937", None).correct is True
    assert _grade("browsecomp", ITEM, "1938", None).correct is False
    assert _grade("gaia", EvalItem("g", "q", "3", ["3"]), "3.0", None).correct is True
