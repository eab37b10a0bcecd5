"""From rollouts to a training batch: outcomes, IG, format penalties, token rewards, advantages.

One :class:`Sample` per trajectory with a token record. Rewards are response-relative (index 0
is the first token after the prompt): turn k's IG (or its format penalty) at the end of the tool
response before turn k+1 (:func:`~drvenus.train.templates.find_turn_ends`, DR-Venus's
anchor), the outcome (or the final turn's penalty) at the last token.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from drvenus.protocol import ANSWER_SPLIT
from drvenus.train.rl.advantage import igpo_advantages
from drvenus.train.rl.collect import Rollout
from drvenus.train.rl.ig import IGConfig, score_trajectory
from drvenus.train.rl.rewards import (
    JudgeStats,
    apply_format_penalty,
    f1_outcome,
    format_flags,
    judge_outcomes,
    reward_row,
)
from drvenus.train.templates import find_turn_ends

log = logging.getLogger(__name__)

Judge = Callable[[str, str, str], Awaitable[float | bool]]


@dataclass
class Sample:
    """One trajectory ready for the policy update."""

    rollout: Rollout
    input_ids: list[int]
    prompt_len: int
    loss_mask: list[int]  # response-relative: 1 on sampled tokens
    rewards: list[float]  # response-relative token rewards
    info_gains: list[float | None] = field(default_factory=list)  # raw, before penalties
    formats: list[bool] = field(default_factory=list)
    outcome: float = 0.0
    advantages: torch.Tensor | None = None

    @property
    def response_len(self) -> int:
        return len(self.input_ids) - self.prompt_len

    def trace(self) -> dict[str, Any]:
        """What a trace file keeps of this trajectory."""
        r = self.rollout
        return {
            "group": r.group, "index": r.index, "question": r.question,
            "ground_truth": r.ground_truth, "termination": r.result.termination,
            "prediction": r.result.prediction, "turns": len(self.formats),
            "tokens": len(self.input_ids), "prompt_tokens": self.prompt_len,
            "info_gains": self.info_gains, "well_formed": self.formats,
            "outcome": self.outcome, "messages": r.result.messages,
            **({"cutoff": r.result.extra["cutoff"]} if "cutoff" in r.result.extra else {}),
        }


def turn_end_positions(sample_ids: Sequence[int], prompt_len: int, tokenizer: Any,
                       boundaries: Sequence[int]) -> list[int]:
    """Response-relative reward positions of the non-final turns: DR-Venus's end-of-turn anchors
    when the template has them, else the last token before each next turn's generation."""
    response = list(sample_ids[prompt_len:])
    ends = find_turn_ends(response, tokenizer)  # none found: the header has no start token
    wanted = len(boundaries) - 1
    if len(ends) != wanted:
        ends = [b - 1 - prompt_len for b in boundaries[1:]]
    return ends


async def outcomes(rollouts: Sequence[Rollout], reward_type: str, judge: Any | None,
                   concurrency: int | None = None, tokenizer: Any = None
                   ) -> tuple[list[float], JudgeStats]:
    """Outcome reward per rollout (see :func:`score_outcomes`); DR-Venus's judge
    (:class:`~drvenus.train.rl.judge.DrVenusJudge`) reads the decoded trajectory instead."""
    from drvenus.train.rl.judge import DrVenusJudge, decoded

    if reward_type == "llm" and isinstance(judge, DrVenusJudge):
        if tokenizer is None:
            raise ValueError("DR-Venus's judge reads the decoded trajectory: give the tokenizer")
        items = [(*decoded(tokenizer, r.tokens.input_ids, r.tokens.prompt_len), r.ground_truth,
                  r.question) for r in rollouts if r.tokens is not None]
        if len(items) != len(rollouts):
            raise ValueError("every rollout scored needs its token record")
        return await judge.score(items)
    items = [(r.question, r.tokens.turns[-1] if r.tokens and r.tokens.turns else "",
              r.ground_truth) for r in rollouts]
    return await score_outcomes(items, reward_type, judge, concurrency)


async def score_outcomes(items: Sequence[tuple[str, str, str]], reward_type: str,
                         judge: Judge | None, concurrency: int | None = None
                         ) -> tuple[list[float], JudgeStats]:
    """Outcome per ``(question, final turn, ground truth)``: the reference's training F1 of the
    final turn (-2 for a malformed one), or the judge's verdict (exact match first)."""
    if reward_type == "f1":
        return [f1_outcome(final, gt) for _, final, gt in items], JudgeStats()
    if judge is None:
        raise ValueError("reward_type llm needs a judge")
    return await judge_outcomes(judge, items, concurrency=concurrency)


def trainer_gains(policy: Any, tokenizer: Any, rollout: Rollout, ig: IGConfig
                  ) -> list[float | None]:
    """IG of each non-final turn, scored by the policy (KV cache, no grad)."""
    rec = rollout.tokens
    assert rec is not None
    with torch.no_grad():
        gt = rollout.ground_truth.split(ANSWER_SPLIT)[0]
        return list(score_trajectory(policy, tokenizer, rec.input_ids, rec.boundaries, gt,
                                     ig).info_gains)


async def engine_gains(engine: Any, tokenizer: Any, rollouts: Sequence[Rollout], ig: IGConfig
                       ) -> list[list[float | None]]:
    """IG of every rollout from the serving engine's prompt log-probs (concurrently)."""
    from drvenus.train.rl.ig import score_trajectory_remote

    async def one(r: Rollout) -> list[float | None]:
        rec = r.tokens
        assert rec is not None
        if len(rec.turns) < 2:
            return [None] * max(len(rec.turns) - 1, 0)
        result = await score_trajectory_remote(
            engine.prompt_logprobs, tokenizer, rec.input_ids, rec.boundaries,
            r.ground_truth.split(ANSWER_SPLIT)[0], ig)
        return list(result.info_gains)

    return list(await asyncio.gather(*(one(r) for r in rollouts)))


def build_sample(rollout: Rollout, outcome: float, tokenizer: Any, policy: Any | None,
                 ig: IGConfig | None, *, format_penalty: float | None,
                 gains: list[float | None] | None = None) -> Sample:
    """Score one trajectory: IG at its boundaries (given as ``gains``, else scored with
    ``policy`` in no-grad mode; neither, or ``ig`` None: no IG), format penalties
    (``format_penalty``: the scale, None = off), token rewards."""
    rec = rollout.tokens
    assert rec is not None
    if gains is None:
        gains = [None] * max(len(rec.turns) - 1, 0)
        if policy is not None and ig is not None and len(rec.turns) > 1:
            gains = trainer_gains(policy, tokenizer, rollout, ig)
    rewarded: list[float | None] = list(gains)
    answer_penalty = None
    if format_penalty is not None:
        rewarded, answer_penalty = apply_format_penalty(gains, rec.turns, format_penalty)
    ends = turn_end_positions(rec.input_ids, rec.prompt_len, tokenizer,
                              [b.token_len for b in rec.boundaries])
    row = reward_row(len(rec.input_ids) - rec.prompt_len, ends, rewarded, outcome,
                     answer_penalty)
    return Sample(
        rollout=rollout, input_ids=rec.input_ids, prompt_len=rec.prompt_len,
        loss_mask=rec.loss_mask[rec.prompt_len:], rewards=row, info_gains=gains,
        formats=format_flags(rec.turns), outcome=outcome,
    )


def assign_advantages(samples: Sequence[Sample], **igpo: Any) -> dict[str, float]:
    """Run :func:`igpo_advantages` over the batch and store each sample's advantage row;
    returns the ``igpo/*`` diagnostics."""
    if not samples:
        return {}
    width = max(s.response_len for s in samples)
    rewards = torch.zeros(len(samples), width, dtype=torch.float32)
    mask = torch.zeros(len(samples), width, dtype=torch.float32)
    for i, s in enumerate(samples):
        rewards[i, : s.response_len] = torch.tensor(s.rewards, dtype=torch.float32)
        mask[i, : s.response_len] = 1.0
    groups = [s.rollout.group for s in samples]
    adv, metrics = igpo_advantages(rewards, mask, groups, **igpo)
    for i, s in enumerate(samples):
        s.advantages = adv[i, : s.response_len].clone()
    return metrics


__all__ = ["Sample", "assign_advantages", "build_sample", "engine_gains", "outcomes",
           "score_outcomes", "trainer_gains", "turn_end_positions"]
