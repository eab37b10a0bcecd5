"""IGPO rewards: format penalties on real and hand-made turns, F1 / judge outcomes, token tensor."""

from __future__ import annotations

import asyncio
import json

import pytest

torch = pytest.importorskip("torch")

from drvenus.train.rl.advantage import position_masks  # noqa: E402
from drvenus.train.rl.rewards import (  # noqa: E402
    ZERO_IG_SENTINEL,
    apply_format_penalty,
    f1_outcome,
    format_flags,
    judge_outcomes,
    reward_row,
    token_rewards,
)
from drvenus.train.templates import find_turn_ends  # noqa: E402

GOOD_CALL = '<think>\nlook\n</think>\n<tool_call>\n{"name": "visit", "arguments": {"url": "u"}}\n</tool_call>'
GOOD_ANSWER = "<think>\nso\n</think>\n<answer>\nParis\n</answer>"


def _assistant_turns(path) -> list[str]:
    messages = json.loads(path.read_text())["messages"]
    return [m["content"] for m in messages if m["role"] == "assistant"]


def test_real_trajectories_are_well_formed_and_a_broken_middle_turn_is_penalised(shared_data):
    folder = shared_data / "trajectories" / "dr-venus-sft"
    for name in ("0000.json", "0002.json"):
        turns = _assistant_turns(folder / name)
        assert all(format_flags(turns)), name
        gains, final = apply_format_penalty([0.1] * (len(turns) - 1), turns, penalty_scale=1.0)
        assert gains == [0.1] * (len(turns) - 1) and final is None
        broken = list(turns)
        broken[0] = broken[0].replace("</think>", "", 1)  # think block left open
        gains, final = apply_format_penalty([0.1] * (len(turns) - 1), broken, penalty_scale=0.5)
        assert gains[0] == -0.5 and gains[1:] == [0.1] * (len(turns) - 2) and final is None


def test_real_final_turn_with_text_before_the_answer_overrides_the_outcome(shared_data):
    # 0001's final turn has "</summary>" between </think> and <answer>: malformed final turn
    turns = _assistant_turns(shared_data / "trajectories" / "dr-venus-sft" / "0001.json")
    gains, final = apply_format_penalty([None] * (len(turns) - 1), turns, penalty_scale=2.0)
    assert final == -2.0 and gains == [None] * (len(turns) - 1)
    row = reward_row(5, [1], gains, outcome=1.0, answer_penalty=final)
    assert row == [0.0, 0.0, 0.0, 0.0, -2.0]


def test_format_penalty_replaces_unscored_turns_and_pads():
    turns = [GOOD_CALL, "no think at all", GOOD_CALL, GOOD_ANSWER]
    gains, final = apply_format_penalty([None], turns)
    assert gains == [None, -1.0, None] and final is None
    # a tool call in the final turn, an answer in a middle turn: both malformed
    gains, final = apply_format_penalty([0.3, 0.2], [GOOD_ANSWER, GOOD_CALL])
    assert gains == [-1.0] and final == -1.0
    assert apply_format_penalty([], []) == ([], None)


def test_f1_outcome_follows_the_reference():
    assert f1_outcome(GOOD_ANSWER, "paris<|answer_split|>Paris, France") == 1.0
    assert f1_outcome("<think>x</think><answer>Paris France</answer>", "Paris") == pytest.approx(2 / 3)
    assert f1_outcome("<think>x</think><answer>The U.S.A.</answer>", "usa<|answer_split|>the u s a") == 1.0
    assert f1_outcome("<think>x</think>no answer", "Paris") == -2.0
    assert f1_outcome("<think>x<answer>Paris</answer>", "Paris") == -2.0  # unbalanced think
    assert f1_outcome("<think>x</think><answer>!!!</answer>", "Paris") == 0.0


def test_judge_outcomes_shortcut_and_failures():
    calls = []

    async def judge(question, answer, gt):
        calls.append(answer)
        if answer == "boom":
            raise TimeoutError("judge timed out")
        return answer == "Lutetia"

    final = "<think>\nx\n</think>\n<answer>\n{}\n</answer>"
    items = [("q", final.format("paris"), "Paris"), ("q", final.format("Lutetia"), "Paris"),
             ("q", final.format("boom"), "Paris"), ("q", "<think>x</think>", "Paris"),
             ("q", final.format("Rome"), "Paris")]
    scores, stats = asyncio.run(judge_outcomes(judge, items, concurrency=2))
    assert scores == [1.0, 1.0, 0.0, 0.0, 0.0]
    assert sorted(calls) == ["Lutetia", "Rome", "boom"]  # exact match never reaches the judge
    assert (stats.exact, stats.judged, stats.failures) == (1, 2, 1)
    assert "TimeoutError" in stats.errors[0]


class _Tok:
    """Word-level stand-in for a ChatML tokenizer."""

    vocab = {"<|im_start|>": 1, "<|im_end|>": 2, "assistant": 3, "user": 4, "\n": 5, "w": 6}

    def convert_tokens_to_ids(self, token):
        return self.vocab[token]

    def decode(self, ids, skip_special_tokens=False):
        inv = {v: k for k, v in self.vocab.items()}
        return "".join(inv[i] for i in ids)


def test_token_rewards_land_on_turn_ends_and_feed_the_advantage():
    # response: turn 0 (w w), tool response, turn 1 (w), tool response, final turn (w w)
    resp = [6, 6, 2, 5, 1, 4, 5, 6, 2, 5, 1, 3, 5, 6, 2, 5, 1, 4, 5, 6, 2, 5, 1, 3, 5, 6, 6, 2]
    ends = find_turn_ends(resp, _Tok())
    assert ends == [8, 20]  # the end of each tool response before an assistant header
    row = reward_row(len(resp), ends, [0.0, -0.4], outcome=0.75)
    assert row[8] == ZERO_IG_SENTINEL and row[20] == -0.4 and row[-1] == 0.75
    assert sum(1 for v in row if v) == 3
    penalised = reward_row(len(resp), ends, [None], outcome=1.0, answer_penalty=-1.0)
    assert penalised[8] == 0.0 and penalised[-1] == -1.0
    assert reward_row(len(resp), [], [], outcome=0.5)[-1] == 0.5
    batch = token_rewards([row, [0.0, 1.0]], seq_len=30)
    assert batch.shape == (2, 30) and batch.dtype == torch.float32
    mask = torch.zeros(2, 30)
    mask[0, : len(resp)] = 1
    mask[1, :2] = 1
    outcome, ig = position_masks(batch, mask)
    assert ig[0].nonzero().flatten().tolist() == [8, 20]
    assert outcome.nonzero().tolist() == [[0, len(resp) - 1], [1, 1]]
    assert token_rewards([[1.0] * 40], seq_len=30).shape == (1, 30)
