"""IG scoring: KV-cache scores equal the naive oracle; filters, frequency, NaN handling."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from drvenus.protocol import IG_PSEUDO_ANSWER  # noqa: E402
from drvenus.train.rl.ig import (  # noqa: E402
    IGConfig,
    boundary_scores,
    boundary_scores_naive,
    ig_ground_truth,
    info_gains,
    kept_boundaries,
    pseudo_answer,
    score_trajectory,
)
from drvenus.train.rl.rollout import Boundary  # noqa: E402


@pytest.fixture(scope="session")
def tokenizer(embedded_tokenizer_dir):
    """The embedded SmolLM2 tokenizer."""
    return transformers.AutoTokenizer.from_pretrained(embedded_tokenizer_dir)


@pytest.fixture(scope="session")
def tiny_llama(tokenizer):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():  # spread the logits so log-probs differ between boundaries
        model.lm_head.weight.mul_(40.0)
    return model


def _trajectory(tokenizer, turns: list[tuple[str, str | None, str]]):
    """ChatML token ids and one Boundary per assistant turn (offset after its header)."""
    enc = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    ids = enc("<|im_start|>system\nYou research.<|im_end|>\n<|im_start|>user\nWho wrote Dune?<|im_end|>\n")
    bounds = []
    for content, tool, response in turns:
        ids += enc("<|im_start|>assistant\n")
        bounds.append(Boundary(len(ids), tool))
        ids += enc(content + "<|im_end|>\n")
        if response:
            ids += enc(f"<|im_start|>user\n<tool_response>\n{response}\n</tool_response><|im_end|>\n")
    return ids, bounds


TURNS = [
    ("<think>\nsearch\n</think>\n<tool_call>\n{\"name\": \"search\"}\n</tool_call>", "search", "Dune is a novel by Frank Herbert."),
    ("<think>\nopen\n</think>\n<tool_call>\n{\"name\": \"visit\"}\n</tool_call>", "visit", "Frank Herbert wrote Dune in 1965."),
    ("<think>\nagain\n</think>\n<tool_call>\n{\"name\": \"Visit\"}\n</tool_call>", "Visit", "More about Herbert and Dune."),
    ("<think>\nbad turn", None, "Your reply could not be used."),
    ("<think>\nmore\n</think>\n<tool_call>\n{\"name\": \"visit\"}\n</tool_call>", "visit", "Herbert, Frank (1920-1986)."),
    ("<think>\ndone\n</think>\n<answer>\nFrank Herbert\n</answer>", None, ""),
]


def test_pseudo_answer_bytes_and_gt_span(tokenizer):
    ids, (lo, hi) = pseudo_answer(tokenizer, "Frank Herbert<|answer_split|>F. Herbert")
    text = tokenizer.decode(ids)
    assert text == IG_PSEUDO_ANSWER.format(gt="Frank Herbert") + "<|im_end|>"
    assert tokenizer.decode(ids[lo:hi]).strip() == "Frank Herbert"
    assert ids[-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")


def test_ground_truth_text():
    assert ig_ground_truth("  Paris <|answer_split|>paris, France") == "Paris"
    assert ig_ground_truth('[{"label": "True"}, {"label": "false"}]') == "false"
    assert ig_ground_truth('[{"label": "true"}]') == "true"
    assert ig_ground_truth("[not json") == "[not json"


def test_kv_cache_scores_equal_naive(tokenizer, tiny_llama):
    ids, bounds = _trajectory(tokenizer, TURNS)
    pseudo, span = pseudo_answer(tokenizer, "Frank Herbert")
    positions = [1, 2] + [b.token_len for b in bounds] + [len(ids)]  # edges: 1 token, all
    fast = boundary_scores(tiny_llama, ids, positions, pseudo, span, temperature=0.7, chunk_size=16)
    slow = boundary_scores_naive(tiny_llama, ids, positions, pseudo, span, temperature=0.7)
    assert set(fast) == set(positions)
    diffs = [abs(fast[p] - slow[p]) for p in positions]
    assert max(diffs) <= 1e-4
    assert len({round(v, 3) for v in slow.values()}) > 2  # the scores really differ per boundary
    full = score_trajectory(tiny_llama, tokenizer, ids, bounds, "Frank Herbert",
                            IGConfig.from_rl(ig_tool_filter=""))
    naive = score_trajectory(tiny_llama, tokenizer, ids, bounds, "Frank Herbert",
                             IGConfig.from_rl(ig_tool_filter=""), naive=True)
    assert len(full.info_gains) == len(TURNS) - 1
    for a, b in zip(full.info_gains, naive.info_gains, strict=True):
        assert a == pytest.approx(b, abs=1e-4)


def test_temperature_scales_logits(tokenizer, tiny_llama):
    ids, bounds = _trajectory(tokenizer, TURNS[:2])
    pseudo, span = pseudo_answer(tokenizer, "Frank Herbert")
    pos = [bounds[1].token_len]
    hot = boundary_scores(tiny_llama, ids, pos, pseudo, span, temperature=2.0)[pos[0]]
    cold = boundary_scores(tiny_llama, ids, pos, pseudo, span, temperature=1.0)[pos[0]]
    assert hot != pytest.approx(cold)


def test_default_visit_filter_scores_only_turns_after_visit(tokenizer, tiny_llama):
    ids, bounds = _trajectory(tokenizer, TURNS)
    cfg = IGConfig.from_rl()  # log_prob_diff, visit filter, freq 1
    assert kept_boundaries(bounds, cfg) == [0, 2, 3, 5]  # turns 1, 2 ("Visit") and 4 called visit
    res = score_trajectory(tiny_llama, tokenizer, ids, bounds, "Frank Herbert", cfg)
    g = res.info_gains
    assert g[0] is None and g[3] is None
    s = res.scores
    assert g[1] == pytest.approx(s[2] - s[0], abs=1e-6)  # baseline is the previous kept score
    assert g[2] == pytest.approx(s[3] - s[2], abs=1e-6)
    assert g[4] == pytest.approx(s[5] - s[3], abs=1e-6)
    prob = score_trajectory(tiny_llama, tokenizer, ids, bounds, "Frank Herbert",
                            IGConfig.from_rl(info_gain_type="prob_diff"))
    assert prob.info_gains[1] == pytest.approx(math.exp(s[2]) - math.exp(s[0]), abs=1e-6)


def test_compute_freq_and_multi_tool_filter():
    bounds = [Boundary(10, "search"), Boundary(20, "visit"), Boundary(30, "search"),
              Boundary(40, "visit"), Boundary(50, None)]
    assert kept_boundaries(bounds, IGConfig.from_rl(ig_tool_filter="", ig_compute_freq=2)) == [0, 2, 4]
    assert kept_boundaries(bounds, IGConfig.from_rl(ig_tool_filter="visit", ig_compute_freq=2)) == [0, 2, 4]
    assert kept_boundaries(bounds, IGConfig.from_rl(ig_tool_filter=" search, ", ig_compute_freq=1)) == [0, 1, 3]
    assert kept_boundaries(bounds, IGConfig.from_rl(ig_tool_filter=["visit"], ig_compute_freq=3)) == [0]
    assert kept_boundaries([], IGConfig.from_rl()) == []


def test_info_gains_nan_and_inf_handling():
    nan, inf = float("nan"), float("inf")
    assert info_gains({0: -2.0, 1: -1.5, 2: nan, 3: -1.0}, 3, "log_prob_diff") == [0.5, 0.0, 0.5]
    assert info_gains({0: -2.0, 2: None}, 2, "log_prob_diff") == [None, 0.0]
    assert info_gains({0: nan, 1: -1.0}, 1, "log_prob_diff") == [None]  # no baseline, no IG
    assert info_gains({0: -1.0, 1: -inf}, 1, "log_prob_diff") == [0.0]
    assert info_gains({0: -1.0, 1: -1.0}, 1, "log_prob_diff") == [0.0]  # a true zero stays 0.0
    got = info_gains({0: math.log(0.25), 1: math.log(0.5)}, 1, "prob_diff")
    assert got == [pytest.approx(0.25)]
    with pytest.raises(ValueError):
        info_gains({}, 0, "entropy")


def test_empty_ground_truth_scores_nothing(tokenizer, tiny_llama):
    ids, bounds = _trajectory(tokenizer, TURNS[:3])
    res = score_trajectory(tiny_llama, tokenizer, ids, bounds, "", IGConfig.from_rl(ig_tool_filter=""))
    assert res.info_gains == [None, None]
