"""Metric formulas on hand-made results."""

from __future__ import annotations

import json
import math

import pytest

from drvenus.eval import metrics as M
from drvenus.eval.metrics import RunResult
from drvenus.protocol import render_search, render_tool_call_turn, wrap_tool_response


def R(item, run, correct, **kw):
    return RunResult(str(item), run, correct, **kw)


def test_pass_at_k_formula():
    assert M.pass_at_k(3, 0, 1) == 0.0
    assert M.pass_at_k(3, 1, 1) == pytest.approx(1 / 3)
    assert M.pass_at_k(3, 1, 2) == pytest.approx(1 - math.comb(2, 2) / math.comb(3, 2))  # 2/3
    assert M.pass_at_k(3, 2, 2) == 1.0  # n - c < k
    assert M.pass_at_k(5, 2, 3) == pytest.approx(1 - 1 / 10)
    with pytest.raises(ValueError):
        M.pass_at_k(2, 1, 3)


def test_wilson_interval_and_the_item_interval():
    # textbook values: 8 of 10 -> (0.490, 0.943); 0 of 20 -> (0, 0.161)
    lo, hi = M.wilson_interval(8, 10)
    assert lo == pytest.approx(0.4902, abs=1e-3) and hi == pytest.approx(0.9433, abs=1e-3)
    lo, hi = M.wilson_interval(0, 20)
    assert lo == 0.0 and hi == pytest.approx(0.1611, abs=1e-3)
    assert M.wilson_interval(0, 0) is None
    # items a..d right in 2/3, 1/3, 0 and 3/3 of their runs: 2 "successes" over 4 items
    assert M.item_interval(_three_runs()) == pytest.approx(M.wilson_interval(2.0, 4))
    assert M.summarize(_three_runs())["ci95_items"] == pytest.approx(M.wilson_interval(2.0, 4))


def _three_runs():
    # item a: right in runs 0,1; b: right in run 2 only; c: never; d: always
    table = {"a": [1, 1, 0], "b": [0, 0, 1], "c": [0, 0, 0], "d": [1, 1, 1]}
    return [R(i, run, bool(v), prediction="x" if v else f"wrong{run}")
            for i, vs in table.items() for run, v in enumerate(vs)]


def test_avg_best_pass_curve_and_majority():
    s = M.summarize(_three_runs())
    assert s["per_run"] == {"0": 0.5, "1": 0.5, "2": 0.5}
    assert s["avg_at_k"] == 0.5 and s["best_pass_at_1"] == 0.5 and s["std_at_k"] == 0.0
    # pass@2 per item: a 1, b 2/3, c 0, d 1 -> mean 2/3 + ... computed exactly
    p2 = (1 + (1 - math.comb(2, 2) / math.comb(3, 2)) + 0 + 1) / 4
    assert s["pass_at_k"]["1"] == pytest.approx(0.5)
    assert s["pass_at_k"]["2"] == pytest.approx(p2)
    assert s["pass_at_k"]["3"] == pytest.approx(3 / 4)
    # majority: a "x" twice (right), b wrong0/wrong1/x all once -> earliest (wrong), c wrong, d right
    assert s["majority_vote"] == 0.5
    assert s["items"] == 4 and s["rows"] == 12 and s["runs"] == 3


def test_majority_vote_uses_normalised_answers():
    rows = [R("q", 0, False, prediction="Paris!"), R("q", 1, True, prediction="The paris"),
            R("q", 2, False, prediction="Lyon")]
    # "Paris!" and "The paris" normalise alike; the group's first row is graded False
    assert M.majority_vote(rows) == 0.0


def test_judge_errors_count_as_wrong_and_are_shown():
    """1 right, 1 wrong, 2 judge errors: 25%, as the official graders report it (not 50%)."""
    rows = [R("a", 0, True), R("b", 0, None), R("c", 0, False), R("d", 0, None)]
    s = M.summarize(rows)
    assert s["avg_at_k"] == 0.25 and s["judge_errors"] == 2
    assert s["pass_at_k"]["1"] == 0.25 and s["majority_vote"] == 0.25


def test_calibration_error():
    assert M.calibration_error([90.0] * 99, [True] * 99) is None
    # 100 items at 80% confidence, 60 right: one bin, |0.8 - 0.6| = 0.2
    assert M.calibration_error([80.0] * 100, [True] * 60 + [False] * 40) == pytest.approx(0.2)
    # 250 items: bins [0,100) and [100,250); perfectly calibrated bins give 0
    conf = [0.0] * 100 + [100.0] * 150
    ok = [False] * 100 + [True] * 150
    assert M.calibration_error(conf, ok) == pytest.approx(0.0)
    # second bin off by 0.5 for 150 of 250 items -> sqrt(150/250 * 0.25)
    assert M.calibration_error(conf, [False] * 100 + [True] * 75 + [False] * 75) == pytest.approx(
        math.sqrt(0.6 * 0.25))


def test_set_level_terminations_costs_recall():
    rows = [
        R("s1", 0, True, is_set=True, score=1.0, level="1", termination="answered",
          search_calls=2, visit_calls=1, prompt_tokens=100, completion_tokens=10, elapsed=4.0,
          recall_visited=0.5, recall_retrieved=1.0),
        R("s2", 0, False, is_set=True, score=0.5, level="2", termination="max_steps",
          search_calls=4, visit_calls=3, prompt_tokens=300, completion_tokens=30, elapsed=8.0,
          recall_visited=0.0, recall_retrieved=0.5),
    ]
    s = M.summarize(rows)
    assert s["deepsearchqa"] == {"items": 2, "fully_correct": 0.5, "item_f1": 0.75}
    assert s["per_level"] == {
        "1": {"n": 1, "avg_at_k": 1.0, "ci95_items": pytest.approx(M.wilson_interval(1, 1))},
        "2": {"n": 1, "avg_at_k": 0.0, "ci95_items": pytest.approx(M.wilson_interval(0, 1))}}
    assert s["terminations"] == {"answered": 1, "max_steps": 1}
    assert s["cost_all"]["tool_calls"] == 5.0 and s["cost_correct"]["tool_calls"] == 3.0
    assert s["cost_all"]["tokens"] == 220.0 and s["wall_seconds"]["total"] == 12.0
    assert s["recall"] == {"visited": 0.25, "retrieved": 0.75}
    assert s["calibration_error"] is None


def test_tool_use_and_gold_recall():
    search = render_tool_call_turn(
        "look", json.dumps({"name": "search", "arguments": {"query": ["x"]}}))
    visit = render_tool_call_turn("read", json.dumps(
        {"name": "visit", "arguments": {"url": ["https://en.wikipedia.org/wiki/A_B"], "goal": "g"}}))
    hits = render_search([("x", [{"title": "A", "url": "https://en.wikipedia.org/wiki/C",
                                  "snippet": "s"}])])
    messages = [
        {"role": "system", "content": "sys"}, {"role": "user", "content": "q"},
        {"role": "assistant", "content": search},
        {"role": "user", "content": wrap_tool_response(hits)},
        {"role": "assistant", "content": visit},
        {"role": "user", "content": wrap_tool_response("page")},
        {"role": "assistant", "content": "<think>\ndone\n</think>\n<answer>\nB\n</answer>"},
    ]
    use = M.tool_use(messages)
    assert (use.search_calls, use.visit_calls) == (1, 1)
    assert use.retrieved == ["https://en.wikipedia.org/wiki/C"]
    gold = ["https://en.wikipedia.org/wiki/A_B", "https://en.wikipedia.org/wiki/C"]
    assert M.gold_recall(gold, ["http://en.m.wikipedia.org/wiki/A B"]) == 0.5
    assert M.gold_recall(gold, use.retrieved + use.visited) == 1.0
    assert M.gold_recall([], ["x"]) is None


def test_calibration_error_when_every_confidence_is_100_as_eval_md_states():
    """All ties: wrong answers sort first, so the bins split into wrong and right ones
    (docs/EVAL.md): about the square root of the error rate, whatever the items' order."""
    import random

    from drvenus.eval.metrics import calibration_error

    correct = [False] * 60 + [True] * 140
    random.Random(0).shuffle(correct)
    for skip_last in (False, True):
        value = calibration_error([100] * 200, correct, skip_last=skip_last)
        assert value is not None and abs(value - 0.6 * 0.5 ** 0.5) < 1e-12
