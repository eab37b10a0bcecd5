from __future__ import annotations

import json

import pytest

from drvenus.protocol import parse_turn
from drvenus.train.rl.ig import IGConfig, kept_boundaries
from drvenus.train.rl.rewards import (
    apply_format_penalty,
    reward_row,
    token_rewards,
)
from drvenus.train.rl.rollout import Boundary, RolloutRecord, rollout_record
from drvenus.train.sft.tokenize import MaskError, tokenize_conversation
from drvenus.train.templates import find_turn_ends

transformers = pytest.importorskip("transformers", reason="needs the train extra")


@pytest.fixture(scope="module")
def tokenizer(embedded_tokenizer_dir):
    return transformers.AutoTokenizer.from_pretrained(embedded_tokenizer_dir)


@pytest.fixture(scope="module")
def messages(shared_data) -> list[dict]:
    path = shared_data / "trajectories" / "dr-venus-sft" / "0000.json"
    return json.loads(path.read_text())["messages"]


@pytest.fixture(scope="module")
def record(messages, tokenizer) -> RolloutRecord:
    return rollout_record(messages, tokenizer)


def test_one_boundary_per_assistant_turn(record, messages):
    assistant = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    assert record.message_indices == assistant
    assert len(record.boundaries) == len(record.generated_ends) == len(assistant)
    assert [b.token_len for b in record.boundaries] == sorted(b.token_len for b in record.boundaries)
    assert record.turns == [messages[i]["content"] for i in assistant]


def test_boundaries_start_the_generated_text(record, messages, tokenizer):
    mask = record.loss_mask
    for b, end, i in zip(record.boundaries, record.generated_ends, record.message_indices,
                         strict=True):
        start = b.token_len
        assert mask[start] == 1 and mask[start - 1] == 0  # the header is prompt, not target
        stop = start
        while stop < len(mask) and mask[stop]:
            stop += 1
        assert stop == end
        text = tokenizer.decode(record.input_ids[start:stop], skip_special_tokens=False)
        assert text == messages[i]["content"] + "<|im_end|>"
        header = tokenizer.decode(record.input_ids[:start], skip_special_tokens=False)
        assert header.endswith("<|im_start|>assistant\n")


def test_tool_names_match_the_calls(record, messages):
    expected = []
    for i in record.message_indices:
        parsed = parse_turn(messages[i]["content"])
        expected.append(parsed.tool_call.name if parsed.kind == "tool_call" else None)
    assert record.tool_names == expected
    assert set(expected[:-1]) <= {"search", "visit"} and {"search", "visit"} & set(expected)
    assert expected[-1] is None  # the final answer


def test_masks(record, messages, tokenizer):
    row = tokenize_conversation(messages, tokenizer)
    assert record.input_ids == row.input_ids
    assert record.loss_mask == row.loss_mask
    assert record.prompt_len == record.boundaries[0].token_len
    assert record.response_mask == [0] * record.prompt_len + [1] * (
        len(record) - record.prompt_len
    )
    assert not any(record.loss_mask[: record.prompt_len])
    assert record.response_ids == record.input_ids[record.prompt_len:]
    prompt = tokenizer.apply_chat_template(messages[:2], tokenize=False, add_generation_prompt=True)
    assert tokenizer.decode(record.input_ids[: record.prompt_len]) == prompt


def test_feeds_ig_and_rewards(record, tokenizer):
    kept = kept_boundaries(record.boundaries, IGConfig.from_rl())
    visits = [k + 1 for k, name in enumerate(record.tool_names[:-1]) if name == "visit"]
    assert kept == [0, *visits]
    response = record.response_ids
    ends = find_turn_ends(response, tokenizer)
    assert len(ends) == len(record.boundaries) - 1  # one tool-response end before each next turn
    for end, b in zip(ends, record.boundaries[1:], strict=True):
        assert record.prompt_len + end < b.token_len
    gains, penalty = apply_format_penalty([0.5] * len(ends), record.turns)
    row = reward_row(len(response), ends, gains, outcome=1.0, answer_penalty=penalty)
    rewards = token_rewards([row], len(response))
    assert rewards.shape == (1, len(response)) and float(rewards[0, -1]) in (1.0, -1.0)


def test_rejects_a_prompt_without_assistant_turn(messages, tokenizer):
    with pytest.raises(MaskError):
        rollout_record(messages[:2], tokenizer)
    with pytest.raises(MaskError):
        rollout_record(messages, tokenizer, prompt_messages=3)


def test_boundary_type(record):
    assert all(isinstance(b, Boundary) for b in record.boundaries)
