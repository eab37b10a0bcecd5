"""verl reward manager ``drvenus_igpo``: the token-level IGPO reward tensor of a batch.

Per sample: the outcome (the reference's F1, or an LLM judge, ``reward_type``; with ``protocol``
dr-venus DR-Venus's RL judge on the decoded trajectory, :mod:`drvenus.train.rl.judge`), the IG
of each kept turn scored with the actor itself, format penalties, then IG / penalties at the
turn-end anchors and the outcome at the last valid response token
(:func:`~drvenus.train.rl.verl_plugin.convert.reward_rows`).

IG scoring hook: :class:`~drvenus.train.rl.verl_plugin.main.IGPOTrainer` hands the manager the
actor worker group after ``init_workers``; every kept boundary becomes one row (the trajectory
prefix, then the pseudo answer as the "response") and the actor's ``compute_log_prob`` (FSDP,
sequence parallel, dynamic batch, the rollout temperature) returns the tail log-probs. verl runs
the reward before the old log-probs, on the same weights, so the scores are the policy's. This
re-runs each prefix (the naive form); the one-machine trainer uses the KV-cache form.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import torch
from verl.protocol import DataProto, pad_dataproto_to_divisor, unpad_dataproto
from verl.workers.reward_manager import register

from drvenus.protocol import ANSWER_SPLIT
from drvenus.train.rl.batch import score_outcomes, turn_end_positions
from drvenus.train.rl.ig import IGConfig, pseudo_answer
from drvenus.train.rl.rewards import JudgeStats
from drvenus.train.rl.verl_plugin.convert import (
    EXTRA_TURNS,
    IGRow,
    boundaries_from_extra,
    ig_rows,
    ig_scores,
    question_of,
    reward_config,
    reward_rows,
    sample_gains,
)

log = logging.getLogger(__name__)
REWARD_MANAGER = "drvenus_igpo"


def _ground_truth(row: Any) -> str:
    rm = row.get("reward_model") if isinstance(row, dict) else None
    return str((rm or {}).get("ground_truth", ""))


def _question(extra: dict[str, Any]) -> str:
    """The question for the judge (empty when the batch has no raw prompt: F1 needs none)."""
    try:
        return question_of(extra.get("raw_prompt"))
    except ValueError:
        return ""


def _items(value: Any) -> list[Any]:
    return [] if value is None else list(value)


def ig_batch(rows: list[IGRow], pad_id: int) -> DataProto:
    """The IG rows as a DataProto for ``compute_log_prob``: prefixes left-padded, tails
    ("responses") right-padded."""
    plen = max(len(r.prefix) for r in rows)
    tlen = max(len(r.tail) for r in rows)
    n = len(rows)
    prompts = torch.full((n, plen), pad_id, dtype=torch.long)
    tails = torch.full((n, tlen), pad_id, dtype=torch.long)
    mask = torch.zeros((n, plen + tlen), dtype=torch.long)
    for i, r in enumerate(rows):
        prompts[i, plen - len(r.prefix):] = torch.tensor(r.prefix)
        tails[i, : len(r.tail)] = torch.tensor(r.tail)
        mask[i, plen - len(r.prefix): plen + len(r.tail)] = 1
    position = torch.clamp(torch.cumsum(mask, dim=1) - 1, min=0)
    return DataProto.from_dict(tensors={
        "input_ids": torch.cat([prompts, tails], dim=1), "attention_mask": mask,
        "position_ids": position, "responses": tails,
    })


@register(REWARD_MANAGER)
class IGPORewardManager:
    """See the module doc. ``reward_kwargs``: the RLConfig fields in
    :data:`~.convert.REWARD_KWARGS` (``reward_type``, ``judge_url``, ``judge_model``,
    ``use_info_gain``, IG and format-penalty settings); RLConfig's defaults for those not given
    (:func:`~.convert.reward_config`)."""

    def __init__(self, tokenizer: Any, num_examine: int = 0, compute_score: Any = None,
                 reward_fn_key: str = "data_source", **kwargs: Any) -> None:
        self.tokenizer = tokenizer
        self.kw = kwargs
        self.actor_wg: Any = None
        self.world_size = 1
        if kwargs.get("reference_dir"):  # where this process reads DR-Venus's pinned files
            import os

            os.environ.setdefault("DRVENUS_REFERENCE_DIR", str(kwargs["reference_dir"]))
        self.config = reward_config(kwargs)  # RLConfig's defaults where verl passes nothing
        self.ig = IGConfig.from_rl(self.config)
        self.judge = None
        if self.config.reward_type == "llm":
            from drvenus.train.rl.trainer import build_judge

            self.judge = build_judge(self.config)

    def attach_actor(self, actor_wg: Any) -> None:
        """The IG scoring hook (see the module doc)."""
        self.actor_wg = actor_wg
        self.world_size = int(getattr(actor_wg, "world_size", 1) or 1)

    # -- pieces --------------------------------------------------------------------------

    def _samples(self, data: DataProto) -> list[dict[str, Any]]:
        plen = data.batch["prompts"].shape[1]
        out = []
        for i in range(len(data)):
            mask = data.batch["attention_mask"][i]
            p = int(mask[:plen].sum())
            r = int(mask[plen:].sum())
            ids = data.batch["prompts"][i, plen - p:].tolist() + \
                data.batch["responses"][i, :r].tolist()
            extra = {k: data.non_tensor_batch[k][i] for k in data.non_tensor_batch}
            out.append({"ids": ids, "prompt_len": p, "response_len": r, "extra": extra,
                        "gt": _ground_truth(extra), "turns": _items(extra.get(EXTRA_TURNS)),
                        "boundaries": boundaries_from_extra(extra, p)})
        return out

    def _info_gains(self, samples: list[dict[str, Any]]) -> list[list[float | None]]:
        empty = [[None] * max(len(s["turns"]) - 1, 0) for s in samples]
        if self.actor_wg is None or not self.config.use_info_gain:
            return empty
        rows: list[IGRow] = []
        for i, s in enumerate(samples):
            if len(s["turns"]) < 2 or not s["gt"]:
                continue
            pseudo, span = pseudo_answer(self.tokenizer, s["gt"].split(ANSWER_SPLIT)[0])
            rows += ig_rows(i, s["ids"], s["boundaries"], pseudo, span, self.ig)
        if not rows:
            return empty
        batch, pad = pad_dataproto_to_divisor(ig_batch(rows, self.tokenizer.pad_token_id or 0),
                                              self.world_size)
        out = unpad_dataproto(self.actor_wg.compute_log_prob(batch), pad)
        logprobs = out.batch["old_log_probs"].float().tolist()
        scores = ig_scores(rows, logprobs)
        return [sample_gains(scores.get(i, {}), len(s["turns"]), self.ig.info_gain_type)
                if i in scores else empty[i] for i, s in enumerate(samples)]

    def _outcomes(self, samples: list[dict[str, Any]]) -> tuple[list[float], JudgeStats]:
        from drvenus.train.rl.judge import DrVenusJudge, decoded

        if isinstance(self.judge, DrVenusJudge):
            texts = [(*decoded(self.tokenizer, s["ids"], s["prompt_len"]), s["gt"],
                      _question(s["extra"])) for s in samples]
            return asyncio.run(self.judge.score(texts))
        items = [(_question(s["extra"]), s["turns"][-1] if s["turns"] else "", s["gt"])
                 for s in samples]
        return asyncio.run(score_outcomes(items, "llm" if self.judge else "f1", self.judge,
                                          self.config.judge_concurrency))

    # -- verl's interface ----------------------------------------------------------------

    def __call__(self, data: DataProto, return_dict: bool = False) -> Any:
        samples = self._samples(data)
        gains = self._info_gains(samples)
        outcomes, stats = self._outcomes(samples)
        ends = [turn_end_positions(s["ids"], s["prompt_len"], self.tokenizer,
                                   [b.token_len for b in s["boundaries"]]) for s in samples]
        scale = self.config.format_penalty_scale if self.config.use_format_penalty else None
        rows = reward_rows([s["response_len"] for s in samples], ends, gains,
                           [s["turns"] for s in samples], outcomes, scale)
        tensor = torch.zeros_like(data.batch["responses"], dtype=torch.float32)
        for i, row in enumerate(rows):
            tensor[i, : len(row)] = torch.tensor(row, dtype=torch.float32)
        if not return_dict:
            return tensor
        scored = [sum(1 for g in gs if g is not None) for gs in gains]
        return {"reward_tensor": tensor, "reward_extra_info": {
            "outcome": outcomes, "ig_scored_turns": scored,
            "judge_failures": [stats.failures] * len(samples)}}


__all__ = ["IGPORewardManager", "REWARD_MANAGER", "ig_batch"]
