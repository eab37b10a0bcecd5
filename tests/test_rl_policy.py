"""Policy update: PPO clipped loss, token-mean masking, k3 KL, and next-token log-probs."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from drvenus.train.rl.policy import kl_estimate, policy_loss, token_logprobs  # noqa: E402


def _t(*rows: list[float]) -> torch.Tensor:
    return torch.tensor(list(rows), dtype=torch.float64)


def test_on_policy_loss_is_minus_masked_mean_advantage():
    logp = _t([-1.0, -2.0, -0.5, -3.0], [-0.1, -0.2, -0.3, -0.4])
    adv = _t([1.0, -2.0, 3.0, 100.0], [0.5, 0.5, -1.0, 7.0])
    mask = _t([1, 1, 1, 0], [1, 1, 1, 0])
    loss, metrics = policy_loss(logp, logp.clone(), logp.clone(), adv, mask)
    expected = -(1.0 - 2.0 + 3.0 + 0.5 + 0.5 - 1.0) / 6  # token-mean over the 6 mask tokens
    assert loss.item() == pytest.approx(expected, abs=1e-7)  # the 1e-8 in the token-mean denominator
    assert metrics["actor/kl_loss"] == pytest.approx(0.0, abs=1e-12)
    assert metrics["actor/pg_clipfrac"] == 0.0
    assert metrics["actor/ppo_kl"] == pytest.approx(0.0)
    assert metrics["actor/loss_tokens"] == 6.0


def test_token_mean_weighs_tokens_not_sequences():
    logp = torch.zeros(2, 4, dtype=torch.float64)
    adv = _t([1.0, 0, 0, 0], [3.0, 3.0, 3.0, 0])
    mask = _t([1, 0, 0, 0], [1, 1, 1, 0])
    loss, _ = policy_loss(logp, logp, None, adv, mask)
    assert loss.item() == pytest.approx(-(1 + 9) / 4)  # not -(1 + 3) / 2 (seq-mean)


def test_positive_advantage_clipped_above_only():
    old = torch.zeros(1, 2, dtype=torch.float64)
    logp = _t([0.5, -0.5])  # ratios e^0.5 = 1.6487 (clipped to 1.2), e^-0.5 = 0.6065 (kept)
    adv = _t([2.0, 1.0])
    mask = torch.ones(1, 2, dtype=torch.float64)
    loss, metrics = policy_loss(logp, old, None, adv, mask, kl_coef=0.0)
    expected = (-2.0 * 1.2 + -1.0 * math.exp(-0.5)) / 2
    assert loss.item() == pytest.approx(expected, abs=1e-7)  # the 1e-8 in the token-mean denominator
    assert metrics["actor/pg_clipfrac"] == pytest.approx(0.5)
    assert metrics["actor/ppo_kl"] == pytest.approx(0.0)  # mean of -(0.5) and 0.5


def test_negative_advantage_clipped_below_and_dual_clip():
    old = torch.zeros(1, 3, dtype=torch.float64)
    logp = _t([-0.5, 0.1, 1.5])  # ratios 0.6065 (clipped to 0.8), 1.105 (kept), 4.48 (dual)
    adv = _t([-1.0, -1.0, -1.0])
    mask = torch.ones(1, 3, dtype=torch.float64)
    loss, metrics = policy_loss(logp, old, None, adv, mask)
    expected = (0.8 + math.exp(0.1) + 3.0) / 3  # the last capped at -A * clip_ratio_c = 3
    assert loss.item() == pytest.approx(expected, abs=1e-7)  # the 1e-8 in the token-mean denominator
    assert metrics["actor/pg_clipfrac"] == pytest.approx(1 / 3)
    assert metrics["actor/pg_clipfrac_lower"] == pytest.approx(1 / 3)


def test_asymmetric_clip_bounds():
    old = torch.zeros(1, 1, dtype=torch.float64)
    logp = _t([0.5])
    loss, _ = policy_loss(logp, old, None, _t([1.0]), _t([1.0]), clip_low=0.2, clip_high=0.28)
    assert loss.item() == pytest.approx(-1.28)


def test_low_var_kl_values_and_clamp():
    logp = _t([0.0, 0.0, 0.0, -30.0])
    ref = _t([0.0, 1.0, -1.0, 0.0])
    kl = kl_estimate(logp, ref, "low_var_kl")
    assert kl[0].tolist() == pytest.approx([0.0, math.e - 2.0, math.exp(-1.0), 10.0])
    assert kl_estimate(logp, ref, "k1")[0, 1].item() == pytest.approx(-1.0)
    with pytest.raises(ValueError):
        kl_estimate(logp, ref, "full")


def test_kl_loss_added_with_coefficient_and_mask():
    logp = torch.zeros(1, 3, dtype=torch.float64)
    ref = _t([1.0, 0.0, 5.0])
    adv = torch.zeros(1, 3, dtype=torch.float64)
    mask = _t([1, 1, 0])
    loss, metrics = policy_loss(logp, logp, ref, adv, mask, kl_coef=0.5)
    kl_mean = (math.e - 2.0 + 0.0) / 2
    assert metrics["actor/kl_loss"] == pytest.approx(kl_mean)
    assert loss.item() == pytest.approx(0.5 * kl_mean)


def test_mask_excludes_tokens():
    logp = _t([-1.0, -1.0, 5.0])
    old = _t([-1.0, -1.2, -9.0])
    ref = _t([-1.1, -0.9, 40.0])
    adv = _t([1.0, -1.0, 1e6])
    mask = _t([1, 1, 0])
    full, _ = policy_loss(logp, old, ref, adv, mask)
    part, _ = policy_loss(logp[:, :2], old[:, :2], ref[:, :2], adv[:, :2], mask[:, :2])
    assert full.item() == pytest.approx(part.item(), abs=1e-12)


def test_bad_shapes_and_empty_mask():
    with pytest.raises(ValueError):
        policy_loss(torch.zeros(2, 3), torch.zeros(2, 3), None, torch.zeros(2, 2), torch.ones(2, 3))
    loss, _ = policy_loss(torch.zeros(1, 2), torch.zeros(1, 2), None, torch.ones(1, 2),
                          torch.zeros(1, 2))
    assert loss.item() == 0.0


def test_entropy_metric_and_bonus():
    logp = torch.zeros(1, 2, dtype=torch.float64)
    ent = _t([1.0, 3.0])
    loss, metrics = policy_loss(logp, logp, None, torch.zeros(1, 2, dtype=torch.float64),
                                torch.ones(1, 2), entropy=ent, entropy_coef=0.1)
    assert metrics["actor/entropy"] == pytest.approx(2.0)
    assert loss.item() == pytest.approx(-0.2)


@pytest.fixture(scope="module")
def tokenizer(embedded_tokenizer_dir):
    """The embedded SmolLM2 tokenizer."""
    return transformers.AutoTokenizer.from_pretrained(embedded_tokenizer_dir)


def _tiny_llama(tokenizer):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
    )
    return transformers.LlamaForCausalLM(config)


def _ids(tokenizer) -> torch.Tensor:
    text = "<|im_start|>user\nWho wrote Dune?<|im_end|>\n<|im_start|>assistant\nFrank Herbert"
    return torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])


def test_token_logprobs_match_manual_log_softmax(tokenizer):
    model = _tiny_llama(tokenizer).eval()
    ids = _ids(tokenizer)
    ids2 = torch.cat([ids, ids.flip(-1)])
    with torch.no_grad():
        got, ent = token_logprobs(model, ids2, torch.ones_like(ids2), temperature=0.7,
                                 with_entropy=True)
        logits = model(input_ids=ids2).logits.float()
    manual = torch.log_softmax(logits / 0.7, dim=-1)
    for b in range(2):
        for t in range(ids2.shape[1] - 1):
            assert got[b, t].item() == pytest.approx(manual[b, t, ids2[b, t + 1]].item(), abs=1e-5)
    assert got.shape == (2, ids2.shape[1] - 1)
    manual_ent = -(manual.exp() * manual).sum(-1)[:, :-1]
    assert torch.allclose(ent, manual_ent, atol=1e-4)
    with torch.no_grad():
        single = token_logprobs(model, ids[0])
    assert torch.allclose(single[0], torch.log_softmax(model(input_ids=ids).logits, -1)[0, :-1]
                          .gather(-1, ids[0, 1:, None]).squeeze(-1).detach(), atol=1e-5)


def test_gradient_step_raises_positive_advantage_tokens(tokenizer):
    model = _tiny_llama(tokenizer).train()
    ids = _ids(tokenizer)
    n = ids.shape[1] - 1
    mask = torch.zeros(1, n)
    mask[0, n - 4:] = 1.0  # the answer tokens only
    adv = torch.ones(1, n)
    with torch.no_grad():
        old = token_logprobs(model, ids)
    ref = old.clone()
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    logp = token_logprobs(model, ids)
    loss, metrics = policy_loss(logp, old, ref, adv, mask)
    assert metrics["actor/pg_clipfrac"] == 0.0
    assert loss.item() == pytest.approx(-1.0, abs=1e-5)
    optim.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optim.step()
    with torch.no_grad():
        new = token_logprobs(model, ids)
        new_loss, _ = policy_loss(new, old, ref, adv, mask)
    assert new_loss.item() < loss.item()
    assert (new[mask.bool()] - old[mask.bool()]).mean().item() > 0
