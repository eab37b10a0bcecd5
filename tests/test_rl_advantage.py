"""igpo_advantages on hand-checked cases (expected values worked out here, not by the function)."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from drvenus.train.rl.advantage import igpo_advantages, position_masks  # noqa: E402

EPS = 1e-6


def _std(values: list[float]) -> float:
    """Reference std: population std of var + 1e-8; 1 for one value."""
    if len(values) <= 1:
        return 1.0
    m = sum(values) / len(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / len(values) + 1e-8)


def _z(v: float, values: list[float]) -> float:
    return (v - sum(values) / len(values)) / (_std(values) + EPS)


def _two_rows() -> tuple[torch.Tensor, torch.Tensor]:
    """Row 0: IG 0.5 at 1, outcome 1 at 3. Row 1: IG -0.5 at 1, outcome 0 at 3."""
    rewards = torch.tensor([[0.0, 0.5, 0.0, 1.0], [0.0, -0.5, 0.0, 0.0]])
    return rewards, torch.ones(2, 4)


def _close(actual: torch.Tensor, expected: list[list[float]]) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected), atol=1e-5, rtol=0)


def test_positions_outcome_is_last_masked_token_and_ig_the_other_nonzeros():
    rewards = torch.tensor([[0.3, 0.0, 1e-10, 0.0, 0.0, 7.0]])
    mask = torch.tensor([[1, 1, 1, 0, 1, 0]])
    outcome, ig = position_masks(rewards, mask)
    assert outcome.tolist() == [[False, False, False, False, True, False]]
    assert ig.tolist() == [[True, False, True, False, False, False]]


def test_separate_with_gamma():
    rewards, mask = _two_rows()
    o = _z(1.0, [1.0, 0.0])  # ~ +1
    i = _z(0.5, [0.5, -0.5])  # ~ +1
    adv, m = igpo_advantages(rewards, mask, [7, 7], norm_mode="separate", gamma=0.5)
    a1 = i + 0.5 * o
    _close(adv, [[a1, a1, o, o], [-a1, -a1, -o, -o]])
    assert m["igpo/ig_total_positions"] == 2 and m["igpo/f1_total_positions"] == 2
    assert m["igpo/outcome_reward_mean"] == pytest.approx(0.5)


def test_joint_pools_outcome_and_ig():
    rewards, mask = _two_rows()
    pool = [0.5, 1.0, -0.5, 0.0]
    r0 = [_z(0.5, pool), _z(1.0, pool)]
    r1 = [_z(-0.5, pool), _z(0.0, pool)]
    adv, _ = igpo_advantages(rewards, mask, ["q", "q"], norm_mode="joint", gamma=1.0)
    _close(adv, [[r0[0] + r0[1]] * 2 + [r0[1]] * 2, [r1[0] + r1[1]] * 2 + [r1[1]] * 2])


def test_scaled_separate_floors_outcome_magnitude_at_0_3():
    # equal outcomes normalise to 0 -> mean |outcome| floored at 0.3; IG normalises to +-1
    rewards = torch.tensor([[0.2, 1.0], [-0.2, 1.0]])
    i = _z(0.2, [0.2, -0.2])
    factor = 0.3 / (i + EPS)
    adv, m = igpo_advantages(rewards, torch.ones(2, 2), [0, 0], gamma=0.0)
    _close(adv, [[i * factor, 0.0], [-i * factor, 0.0]])
    assert m["igpo/ig_scale"] == pytest.approx(factor, rel=1e-5)
    assert m["igpo/outcome_norm_abs_mean"] == pytest.approx(0.3)
    assert m["igpo/all_same_outcome_ratio"] == 1.0


def test_scaled_separate_caps_factor_at_10():
    # no std division: outcomes centre to +-0.5, IG to +-0.01 -> factor 50, capped at 10
    rewards = torch.tensor([[0.01, 1.0], [-0.01, 0.0]])
    adv, m = igpo_advantages(rewards, torch.ones(2, 2), [0, 0], gamma=1.0, norm_by_std=False)
    _close(adv, [[0.1 + 0.5, 0.5], [-0.1 - 0.5, -0.5]])
    assert m["igpo/ig_scale"] == pytest.approx(10.0)


def test_raw_ig_divides_by_std_only_adds_outcome_and_forces_gamma_zero():
    rewards, mask = _two_rows()
    o = _z(1.0, [1.0, 0.0])
    i = 0.5 / (_std([0.5, -0.5]) + EPS)  # no mean subtraction
    adv, _ = igpo_advantages(rewards, mask, [1, 1], norm_mode="raw_ig", gamma=0.95)
    _close(adv, [[i + o, i + o, o, o], [-i - o, -i - o, -o, -o]])


def test_raw_ig_divides_ig_by_std_even_without_norm_by_std():
    rewards = torch.tensor([[0.4, 1.0], [0.0, 0.0], [0.8, 0.0]])  # row 1 has no IG
    ig_std = _std([0.4, 0.8])
    adv, _ = igpo_advantages(
        rewards, torch.ones(3, 2), [0, 0, 0], norm_mode="raw_ig", norm_by_std=False, ig_weight=2.0
    )
    mean_o = 1.0 / 3
    o = [1.0 - mean_o, 0.0 - mean_o, 0.0 - mean_o]  # outcome centred only
    _close(adv, [[2 * 0.4 / (ig_std + EPS) + o[0], o[0]], [o[1], o[1]],
                 [2 * 0.8 / (ig_std + EPS) + o[2], o[2]]])


def test_ig_weight_scales_ig_after_normalisation():
    rewards, mask = _two_rows()
    o = _z(1.0, [1.0, 0.0])
    i = _z(0.5, [0.5, -0.5])
    adv, _ = igpo_advantages(rewards, mask, [0, 0], norm_mode="separate", gamma=0.5, ig_weight=2.0)
    assert adv[0, 0].item() == pytest.approx(2 * i + 0.5 * o, abs=1e-5)
    assert adv[1, 1].item() == pytest.approx(-2 * i - 0.5 * o, abs=1e-5)


def test_group_of_one_uses_std_one():
    # one row in its own group: outcome normalises to 0; its two IG values to +-0.2/(sqrt(.04)+eps)
    rewards = torch.tensor([[0.2, 0.0, 0.6, 0.0, 1.0]])
    adv, m = igpo_advantages(rewards, torch.ones(1, 5), ["solo"], norm_mode="separate", gamma=1.0)
    z = 0.2 / (_std([0.2, 0.6]) + EPS)
    _close(adv, [[-z + z, z, z, 0.0, 0.0]])
    assert m["igpo/all_same_outcome_ratio"] == 0.0  # a lone outcome is not counted
    one_ig = torch.tensor([[0.3, 0.0, 1.0]])
    adv, _ = igpo_advantages(one_ig, torch.ones(1, 3), [0], norm_mode="raw_ig")
    _close(adv, [[0.3 / (1 + EPS), 0.0, 0.0]])  # std 1 for a single IG value


def test_groups_normalise_separately():
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.0, 3.0], [0.0, 1.0]])
    adv, m = igpo_advantages(rewards, torch.ones(4, 2), ["a", "a", "b", "b"], norm_mode="joint")
    za, zb = _z(1.0, [1.0, 0.0]), _z(3.0, [3.0, 1.0])
    _close(adv, [[za, za], [-za, -za], [zb, zb], [-zb, -zb]])
    assert m["igpo/num_groups"] == 2


def test_mask_holes_sentinel_and_adaptive_gamma():
    # row: IG sentinel at 1 (a true zero IG), tool tokens at 2-3 masked out, outcome at 5
    rewards = torch.tensor([[0.0, 1e-10, 0.0, 0.0, 0.0, 1.0], [0.0, 0.5, 0.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0, 0, 1, 1], [1, 1, 0, 0, 1, 1]])
    adv, m = igpo_advantages(
        rewards, mask, [0, 0], norm_mode="separate", adaptive_gamma_min_weight=0.25
    )
    g = 0.25 ** (1 / 2)  # two turn positions per row
    o, i = _z(1.0, [1.0, 0.0]), _z(1e-10, [1e-10, 0.5])
    _close(adv, [[i + g * o, i + g * o, 0, 0, o, o], [-i - g * o, -i - g * o, 0, 0, -o, -o]])
    assert m["igpo/effective_gamma_mean"] == pytest.approx(g)
    assert m["igpo/num_turns_mean"] == 2


def test_empty_rows_get_zero_and_no_ig_is_plain_grpo():
    rewards = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0], [0, 0, 0]])
    adv, m = igpo_advantages(rewards, mask, [0, 0, 0], norm_mode="scaled_separate")
    z = _z(1.0, [1.0, 0.0])
    _close(adv, [[z, z, 0], [-z, -z, 0], [0, 0, 0]])
    assert m["igpo/ig_active_ratio"] == 0.0
    assert m["igpo/ig_scale"] == pytest.approx(z / (1 + EPS), rel=1e-5)  # IG side defaults to 1


def test_ig_outside_the_mask_is_an_error():
    rewards = torch.tensor([[0.0, 0.7, 1.0]])
    mask = torch.tensor([[1, 0, 1]])
    with pytest.raises(RuntimeError, match="response_mask is 0"):
        igpo_advantages(rewards, mask, [0])


def test_bad_arguments():
    rewards, mask = _two_rows()
    with pytest.raises(ValueError, match="norm_mode"):
        igpo_advantages(rewards, mask, [0, 0], norm_mode="nope")
    with pytest.raises(ValueError, match="group ids"):
        igpo_advantages(rewards, mask, [0])
