"""IGPO rewards: format penalties, outcome (F1 or a judge) and the token-level reward tensor.

Follows DR-Venus's reward path (``ray_trainer`` step 7, ``reward_score/info_gain.py``,
``reward_manager/naive_batch.py``):

* format: every assistant turn is checked with ``protocol.check_turn_format``; a malformed
  non-final turn gets ``-penalty_scale`` in place of its IG (also where its IG was not scored);
  a malformed final turn's ``-penalty_scale`` replaces the outcome;
* token rewards: turn k's IG (or penalty) sits at its turn end, the outcome at the last valid
  response token; an IG of exactly 0.0 becomes ``ZERO_IG_SENTINEL`` so that the advantage
  estimator still sees a turn there, ``None`` leaves the position 0 (no turn);
* turn ends (reference quirk, kept): the end-of-turn token that is followed, within 4 tokens, by
  the assistant header (ChatML ``<|im_start|>`` + ``assistant``; any template's, see
  :func:`drvenus.train.templates.find_turn_ends`), i.e. the end of the tool response that
  precedes the next assistant turn. Those tokens are outside the policy-loss mask, so the mask
  given to ``igpo_advantages`` must be the response's attention mask (the reference sets it to
  all ones).
"""

from __future__ import annotations

import asyncio
import logging
import string
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import torch

from drvenus.grading.match import exact_match
from drvenus.protocol import ANSWER_SPLIT, check_turn_format, extract_answer, first_answer_block
from drvenus.train.rl.config import RLConfig

log = logging.getLogger(__name__)

ZERO_IG_SENTINEL = 1e-10
FORMAT_FAIL_SCORE = -2.0  # the reference F1 for unbalanced tags or no answer block
_BALANCED_TAGS = ("code", "tool_call", "think", "answer")
_PUNCT = str.maketrans({p: " " for p in string.punctuation})


def format_flags(turns: Sequence[str]) -> list[bool]:
    """Per assistant turn (the last one final): is it well formed?"""
    last = len(turns) - 1
    return [check_turn_format(t, i == last) for i, t in enumerate(turns)]


def apply_format_penalty(
    info_gains: Sequence[float | None], turns: Sequence[str], penalty_scale: float | None = None
) -> tuple[list[float | None], float | None]:
    """(IG per non-final turn with malformed turns set to ``-penalty_scale``, the final turn's
    penalty or None). ``info_gains`` is padded with None to ``len(turns) - 1``;
    ``penalty_scale`` not given: RLConfig's ``format_penalty_scale``."""
    if penalty_scale is None:
        penalty_scale = RLConfig().format_penalty_scale
    n = max(len(turns) - 1, 0)
    gains = list(info_gains)[:n] + [None] * max(n - len(info_gains), 0)
    if not turns:
        return gains, None
    flags = format_flags(turns)
    for k in range(n):
        if not flags[k]:
            gains[k] = -1.0 * penalty_scale
    return gains, None if flags[-1] else -1.0 * penalty_scale


def _tags_balanced(text: str) -> bool:
    for tag in _BALANCED_TAGS:
        opens, closes = f"<{tag}>", f"</{tag}>"
        if text.count(opens) != text.count(closes):
            return False
        at = text.find(opens)
        while at != -1:
            end = text.find(closes, at)
            if end == -1:
                return False
            at = text.find(opens, end + 1)
    return True


def _words(text: str) -> list[str]:
    return text.translate(_PUNCT).split()


def f1_outcome(response: str, ground_truth: str) -> float:
    """The reference's training F1: lower-cased; unbalanced code/tool_call/think/answer tags or
    no answer block give -2.0; else the best token F1 of the first answer block against the
    accepted answers (punctuation -> spaces), 0 for empty ones. ``drvenus.grading.match``
    also drops articles, so it is not used here."""
    text = response.lower()
    if not _tags_balanced(text):
        return FORMAT_FAIL_SCORE
    answer = first_answer_block(text)
    if answer is None:
        return FORMAT_FAIL_SCORE
    pred = Counter(_words(answer))
    best = 0.0
    for gt in ground_truth.lower().split(ANSWER_SPLIT):
        gold = Counter(_words(gt))
        same = sum((pred & gold).values())
        if not pred or not gold or same == 0:
            continue
        p, r = same / sum(pred.values()), same / sum(gold.values())
        best = max(best, 2 * p * r / (p + r))
    return best


Judge = Callable[[str, str, str], Awaitable[float | bool]]


@dataclass
class JudgeStats:
    """Outcome-judging counters for one batch (log them as metrics)."""

    judged: int = 0
    exact: int = 0
    failures: int = 0
    errors: list[str] = field(default_factory=list)


async def judge_outcomes(
    judge: Judge,
    items: Sequence[tuple[str, str, str]],
    *,
    concurrency: int | None = None,
) -> tuple[list[float], JudgeStats]:
    """Outcome per ``(question, final turn, ground truth)``: 1.0 on an exact match with an
    accepted answer, else the judge's verdict (``judge(question, answer, gt)`` -> bool/score);
    no answer or a judge failure scores 0.0 and is counted (``stats.failures``). At most
    ``concurrency`` (default RLConfig's ``judge_concurrency``) judge calls at once."""
    stats = JudgeStats()
    gate = asyncio.Semaphore(max(1, concurrency or RLConfig().judge_concurrency))

    async def one(question: str, final_turn: str, gt: str) -> float:
        answer = extract_answer(final_turn)
        if answer is None:
            return 0.0
        if exact_match(answer, gt):
            stats.exact += 1
            return 1.0
        async with gate:
            try:
                verdict = await judge(question, answer, gt)
            except Exception as exc:  # a judge may fail in any way; count it, never hide it
                stats.failures += 1
                stats.errors.append(f"{type(exc).__name__}: {exc}")
                log.warning("outcome judge failed (scored 0): %s", exc)
                return 0.0
        stats.judged += 1
        return float(verdict)

    scores = await asyncio.gather(*(one(*it) for it in items))
    return list(scores), stats


def reward_row(
    length: int,
    turn_ends: Sequence[int],
    info_gains: Sequence[float | None],
    outcome: float,
    answer_penalty: float | None = None,
) -> list[float]:
    """Token rewards of one response of ``length`` valid tokens: IG k at ``turn_ends[k]`` (None:
    nothing; 0.0: the sentinel), then the outcome (or ``answer_penalty`` when given and < 0) at
    the last token. Extra IG values beyond the turn ends are dropped."""
    row = [0.0] * length
    if length == 0:
        return row
    for pos, gain in zip(turn_ends, info_gains, strict=False):
        if gain is None:
            continue
        row[pos] = ZERO_IG_SENTINEL if gain == 0.0 else float(gain)
    row[-1] = answer_penalty if answer_penalty is not None and answer_penalty < 0 else outcome
    return row


def token_rewards(rows: Sequence[Sequence[float]], seq_len: int) -> torch.Tensor:
    """Stack per-response rewards (response-relative, left-aligned) into (bsz, seq_len) fp32;
    rows longer than ``seq_len`` are cut like the reference's ``[:valid_len]``."""
    out = torch.zeros(len(rows), seq_len, dtype=torch.float32)
    for i, row in enumerate(rows):
        n = min(len(row), seq_len)
        out[i, :n] = torch.tensor(list(row[:n]), dtype=torch.float32)
    return out
