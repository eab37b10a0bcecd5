"""SFT tokenisation: masks on exactly the assistant tokens, with the embedded model's tokenizer.

Two templates: the embedded SmolLM2's ChatML one (as shipped in its GGUF), and a Qwen3-style
thinking template written here (reasoning split at ``</think>``, kept only after the last real
user query, ``<think>\\n`` prefilled by the generation prompt), on the same vocabulary.
"""

from __future__ import annotations

import json

import pytest

transformers = pytest.importorskip("transformers", reason="needs the train extra")

from drvenus.train.sft import (  # noqa: E402
    MaskError,
    TokenizedRow,
    TokenizeStats,
    tokenize_conversation,
    tokenize_rows,
)
from drvenus.train.sft.pack import block_causal_mask, pack_rows, padding_efficiency  # noqa: E402
from helpers.templates import QWEN3_STYLE_TEMPLATE  # noqa: E402


@pytest.fixture(scope="session")
def chatml_tokenizer(embedded_tokenizer_dir):
    """The embedded model's own tokenizer and chat template, as shipped in its GGUF."""
    return transformers.AutoTokenizer.from_pretrained(embedded_tokenizer_dir)


@pytest.fixture(scope="session")
def qwen3_style_tokenizer(chatml_tokenizer, tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen3-style-tokenizer")
    chatml_tokenizer.save_pretrained(folder)
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    tok.chat_template = QWEN3_STYLE_TEMPLATE
    return tok


@pytest.fixture(scope="session")
def trajectories(shared_data) -> list[list[dict]]:
    folder = shared_data / "trajectories" / "dr-venus-sft"
    return [json.loads(p.read_text(encoding="utf-8"))["messages"] for p in sorted(folder.glob("*.json"))]


def _trained_segments(row, tok) -> list[str]:
    segments, current = [], []
    for token, trained in zip(row.input_ids, row.loss_mask, strict=True):
        if trained:
            current.append(token)
        elif current:
            segments.append(current)
            current = []
    if current:
        segments.append(current)
    return [tok.decode(s) for s in segments]


def _full_ids(messages, tok) -> list[int]:
    text = tok.apply_chat_template(messages, tokenize=False)
    return tok(text, add_special_tokens=False)["input_ids"]


def test_chatml_masks_exactly_each_assistant_message_and_its_end_token(trajectories, chatml_tokenizer):
    tok = chatml_tokenizer
    for messages in trajectories:
        row = tokenize_conversation(messages, tok)
        assert row.input_ids == _full_ids(messages, tok)
        assert len(row.loss_mask) == len(row.input_ids)
        expected = [m["content"] + "<|im_end|>" for m in messages if m["role"] == "assistant"]
        assert _trained_segments(row, tok) == expected
        labels = row.labels
        assert all((lab == -100) == (not m) for lab, m in zip(labels, row.loss_mask, strict=True))


def test_qwen3_style_template_trains_reasoning_and_answer_not_the_prefilled_opener(
    trajectories, qwen3_style_tokenizer
):
    tok = qwen3_style_tokenizer
    messages = trajectories[0]
    row = tokenize_conversation(messages, tok)
    assert row.input_ids == _full_ids(messages, tok)
    expected = []
    for m in messages:
        if m["role"] != "assistant":
            continue
        reasoning, content = m["content"].split("</think>", 1)
        reasoning = reasoning.split("<think>")[-1].strip("\n")
        expected.append(f"{reasoning}\n</think>\n\n{content.lstrip(chr(10))}<|im_end|>")
    assert _trained_segments(row, tok) == expected


def test_rows_a_template_cannot_mask_are_skipped_and_counted(qwen3_style_tokenizer):
    tok = qwen3_style_tokenizer
    # A middle assistant turn without reasoning renders differently in history (no think block)
    # than as the last message (an empty one): no honest mask exists.
    no_reasoning = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "calling a tool"},
        {"role": "user", "content": "<tool_response>\nr\n</tool_response>"},
        {"role": "assistant", "content": "<think>\nok\n</think>\n<answer>\na\n</answer>"},
    ]
    with pytest.raises(MaskError) as info:
        tokenize_conversation(no_reasoning, tok)
    assert info.value.reason == "template_not_prefix"
    no_assistant = [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]
    good = no_reasoning[:2] + [no_reasoning[4]]
    stats = TokenizeStats()
    rows = list(tokenize_rows([no_reasoning, no_assistant, good], tok, stats=stats))
    assert len(rows) == 1 and stats.rows == 3 and stats.kept == 1
    assert stats.skipped == {"template_not_prefix": 1, "no_assistant_turn": 1}


def test_over_length_rows_are_truncated_or_dropped_and_counted(trajectories, chatml_tokenizer):
    messages = trajectories[1]
    full = tokenize_conversation(messages, chatml_tokenizer)
    stats = TokenizeStats()
    cut = tokenize_conversation(messages, chatml_tokenizer, max_length=4000, stats=stats)
    assert cut.truncated and len(cut) == 4000 and stats.truncated == 1
    assert cut.input_ids == full.input_ids[:4000] and cut.loss_mask == full.loss_mask[:4000]
    stats = TokenizeStats()
    list(tokenize_rows([messages], chatml_tokenizer, 4000, over_length="drop", stats=stats))
    assert stats.kept == 0 and stats.skipped == {"too_long": 1}
    with pytest.raises(MaskError):  # nothing of an assistant turn fits in 10 tokens
        tokenize_conversation(messages, chatml_tokenizer, max_length=10)


# --- the newline after the end-of-turn token (verl parity) --------------------------------------


def _verl_style_targets(messages, tok) -> list[str]:
    """What verl's multi-turn dataset trains for each assistant message ``i``, restated: the text
    of ``messages[:i + 1]`` after ``messages[:i]`` with the generation prompt."""
    out = []
    for i, m in enumerate(messages):
        if m["role"] == "assistant":
            head = tok.apply_chat_template(messages[:i], tokenize=False, add_generation_prompt=True)
            turn = tok.apply_chat_template(messages[: i + 1], tokenize=False)
            out.append(turn[len(head):])
    return out


@pytest.mark.parametrize("template", ["chatml", "qwen3_style"])
def test_the_newline_after_end_of_turn_is_trained_as_verl_does_or_not(
    trajectories, chatml_tokenizer, qwen3_style_tokenizer, template
):
    tok = chatml_tokenizer if template == "chatml" else qwen3_style_tokenizer
    messages = trajectories[0]
    verl = tokenize_conversation(messages, tok, train_after_end_of_turn=True)
    generated = tokenize_conversation(messages, tok)  # the default: generated tokens only
    assert verl.input_ids == generated.input_ids == _full_ids(messages, tok)
    targets = _verl_style_targets(messages, tok)
    assert all(t.endswith("<|im_end|>\n") for t in targets)
    assert _trained_segments(verl, tok) == targets
    assert _trained_segments(generated, tok) == [t[: -len("\n")] for t in targets]
    newline = tok("\n", add_special_tokens=False)["input_ids"]
    assert len(newline) == 1
    end = tok.convert_tokens_to_ids("<|im_end|>")
    after_end = [k + 1 for k, t in enumerate(verl.input_ids[:-1]) if t == end]
    trained_after = [k for k in after_end if verl.loss_mask[k - 1]]
    assert len(trained_after) == len(targets)  # one trained <|im_end|> per assistant turn
    assert all(verl.input_ids[k] == newline[0] and verl.loss_mask[k] for k in trained_after)
    assert not any(generated.loss_mask[k] for k in trained_after)
    assert sum(verl.loss_mask) == sum(generated.loss_mask) + len(targets)
    stats = TokenizeStats()  # no token crosses a turn boundary in the shared trajectories
    list(tokenize_rows(trajectories, tok, stats=stats, train_after_end_of_turn=True))
    assert stats.straddling_tokens == 0


def test_sft_config_trains_the_newline_by_default(trajectories, chatml_tokenizer):
    from drvenus.train.sft import SFTConfig
    from drvenus.train.sft.data import tokenize_dataset

    assert SFTConfig().train_after_end_of_turn is True
    rows = trajectories[:2]
    on = tokenize_dataset(rows, chatml_tokenizer, 100_000, train_after_end_of_turn=True)
    off = tokenize_dataset(rows, chatml_tokenizer, 100_000)
    turns = sum(m["role"] == "assistant" for r in rows for m in r)
    assert on.stats.trained_tokens == off.stats.trained_tokens + turns


# --- packing ------------------------------------------------------------------------------------


def _row(n: int, start: int = 0) -> TokenizedRow:
    return TokenizedRow(list(range(start, start + n)), [i % 2 for i in range(n)])


def test_packing_keeps_every_row_whole_with_restarting_positions():
    rows = [_row(n, 100 * i) for i, n in enumerate([5, 9, 3, 7, 2, 10, 1])]
    packed = list(pack_rows(rows, max_length=10))
    assert all(len(p) <= 10 for p in packed)
    assert sorted(n for p in packed for n in p.seq_lens) == sorted(len(r) for r in rows)
    seen = []
    for p in packed:
        start = 0
        for n in p.seq_lens:
            assert p.position_ids[start : start + n] == list(range(n))
            seen.append((tuple(p.input_ids[start : start + n]), tuple(p.loss_mask[start : start + n])))
            start += n
    assert sorted(seen) == sorted((tuple(r.input_ids), tuple(r.loss_mask)) for r in rows)
    assert padding_efficiency([len(p) for p in packed], 10) > padding_efficiency([len(r) for r in rows], 10)
    with pytest.raises(ValueError, match="does not fit"):
        list(pack_rows([_row(11)], max_length=10))


def test_block_causal_mask_forbids_attention_across_rows():
    mask = block_causal_mask([2, 3], total=6)[0, 0]
    assert mask.shape == (6, 6)
    assert mask[1, 0] and not mask[0, 1]  # causal inside row 1
    assert not mask[2, 1] and mask[4, 2]  # row 2 never sees row 1
    assert not mask[5].any()  # padding attends to nothing


# --- linear-time spans and pieces against the exact path ----------------------------------------

TOOL_GROUPING_TEMPLATE = (  # Qwen3's handling of tool messages: a run of them is one user turn
    "{%- for m in messages -%}"
    "{%- if m.role == 'tool' -%}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}"
    "{{ '<|im_start|>user' }}{%- endif -%}"
    "{{ '\\n<tool_response>\\n' + m.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}"
    "{{ '<|im_end|>\\n' }}{%- endif -%}"
    "{%- else -%}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)
NUMBERED_TEMPLATE = (  # a turn depends on its place in the whole conversation: cannot be split
    "{%- for m in messages -%}"
    "{{ '<|im_start|>' + m.role + ' ' + loop.index|string + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{ '<|im_start|>assistant ' + (messages|length + 1)|string + '\\n' }}{%- endif -%}"
)
FRAGMENTS = ["a", "Paris", " ", "\n", "\n\n", "<think>", "</think>", "<tool_response>",
             "</tool_response>", "<|im_end|>", "<|im_start|>assistant\n", "<answer>x</answer>",
             "é", "東京", "  x"]


@pytest.fixture(scope="module")
def all_templates(chatml_tokenizer, tmp_path_factory):
    """Every chat template the tests use, on SmolLM2's vocabulary."""
    folder = tmp_path_factory.mktemp("templates-tokenizer")
    chatml_tokenizer.save_pretrained(folder)
    out = {"chatml": chatml_tokenizer}
    for name, template in (("qwen3_style", QWEN3_STYLE_TEMPLATE),
                           ("tool_grouping", TOOL_GROUPING_TEMPLATE),
                           ("numbered", NUMBERED_TEMPLATE)):
        tok = transformers.AutoTokenizer.from_pretrained(folder)
        tok.chat_template = template
        out[name] = tok
    from helpers.templates import GEMMA_STYLE_TEMPLATE

    gemma = transformers.AutoTokenizer.from_pretrained(folder)
    gemma.add_special_tokens({"additional_special_tokens": ["<start_of_turn>", "<end_of_turn>"]})
    gemma.chat_template = GEMMA_STYLE_TEMPLATE
    out["gemma"] = gemma
    return out


def _exact(messages, tok, after: bool):
    """The exact path as it was: spans from every prefix, the rendering tokenised in one call."""
    from drvenus.train.sft.tokenize import _mask, prefix_spans
    from drvenus.train.templates import end_of_turn_ids

    full, spans = prefix_spans(messages, tok)
    enc = tok(full, add_special_tokens=False, return_offsets_mapping=True)
    offsets = [tuple(o) for o in enc["offset_mapping"]]
    ends = frozenset() if after else end_of_turn_ids(tok)
    mask, straddling = _mask(enc["input_ids"], offsets, spans, ends)
    return list(enc["input_ids"]), offsets, spans, mask, straddling


def _same_as_exact(messages, tok, after: bool) -> bool:
    """The linear path equals the exact one (or both refuse the row for the same reason);
    returns whether the linear path split the template (False: it re-rendered prefixes)."""
    from drvenus.train.sft.tokenize import encode_conversation

    try:
        expected = _exact(messages, tok, after)
    except MaskError as exc:
        with pytest.raises(MaskError) as info:
            encode_conversation(messages, tok, train_after_end_of_turn=after)
        assert info.value.reason == exc.reason
        return True
    got = encode_conversation(messages, tok, train_after_end_of_turn=after)
    assert (got.input_ids, got.offsets, got.spans, got.loss_mask, got.straddling) == expected
    return got.split


hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies
_contents = st.lists(st.sampled_from(FRAGMENTS), max_size=6).map("".join)
_conversations = st.tuples(
    st.booleans(),
    st.lists(st.tuples(st.sampled_from(["user", "assistant", "assistant", "tool"]), _contents),
             min_size=1, max_size=10),
)


@pytest.mark.parametrize("template", ["chatml", "qwen3_style", "tool_grouping", "gemma",
                                      "numbered"])
@hypothesis.settings(max_examples=150, deadline=None, derandomize=True)
@hypothesis.given(conversation=_conversations, after=st.booleans(), piece=st.sampled_from([8, 64]))
def test_linear_path_equals_the_exact_path_on_random_conversations(
    all_templates, template, conversation, after, piece
):
    """Random roles and contents full of template markers; tokenised in pieces of a few
    characters so cutting is exercised too (real rows are cut every 32K characters)."""
    from unittest import mock

    from drvenus.train.sft import tokenize

    system, turns = conversation
    tok = all_templates[template]
    if template not in ("tool_grouping",):
        turns = [("user" if role == "tool" else role, text) for role, text in turns]
    messages = ([{"role": "system", "content": "S"}] if system else []) + [
        {"role": role, "content": text} for role, text in turns]
    with mock.patch.object(tokenize, "PIECE_CHARS", piece):
        _same_as_exact(messages, tok, after)


@pytest.mark.parametrize("template", ["chatml", "qwen3_style", "gemma"])
def test_linear_path_equals_the_exact_path_on_a_long_row(trajectories, all_templates, template):
    """Three shared trajectories as one ~100K-token row: cut into pieces at the real size."""
    tok = all_templates[template]
    messages = list(trajectories[0])
    for other in trajectories[1:3]:
        messages += other[2:]
    assert _same_as_exact(messages, tok, after=False)


def test_rows_of_a_template_that_cannot_be_split_are_exact_and_counted(trajectories,
                                                                       all_templates):
    tok = all_templates["numbered"]
    stats = TokenizeStats()
    rows = list(tokenize_rows(trajectories[:2], tok, stats=stats))
    assert stats.kept == 2 and stats.prefix_rendered == 2
    for row, messages in zip(rows, trajectories[:2], strict=True):
        assert (row.input_ids, row.loss_mask) == tuple(_exact(messages, tok, False)[i]
                                                       for i in (0, 3))
    stats = TokenizeStats()
    list(tokenize_rows(trajectories[:2], all_templates["qwen3_style"], stats=stats))
    assert stats.kept == 2 and stats.prefix_rendered == 0
