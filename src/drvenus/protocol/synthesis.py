"""The words of Heavy mode's synthesis turn (:mod:`drvenus.agent.heavy`): after N independent
research runs on one question, the model reads each run's answer and the evidence it cited and
writes the final answer in the protocol's answer turn (``<think>`` then ``<answer>``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

SYNTHESIS_PROMPT = (
    "You judge the work of several independent researchers who each answered the same "
    "question. Read every report: its answer, its reasoning and the sources it read. Prefer an "
    "answer that the evidence supports and that several researchers reached independently; "
    "reject one the evidence contradicts. Then give the single best final answer. Reply with "
    "your reasoning inside <think></think>, then the final answer inside <answer></answer>."
)


@dataclass(frozen=True)
class Candidate:
    """One run's contribution: its answer (None: it found none), its final reasoning, and the
    sources it read or searched for."""

    answer: str | None
    reasoning: str = ""
    sources: tuple[str, ...] = ()


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def synthesis_messages(
    question: str, candidates: Sequence[Candidate], max_chars: int = 24_000
) -> list[dict[str, str]]:
    """The synthesis conversation; each report is clipped so that all fit ``max_chars``."""
    share = max(400, max_chars // max(1, len(candidates)))
    parts = [f"Question: {question.strip()}", ""]
    for i, c in enumerate(candidates, 1):
        sources = _clip("; ".join(c.sources), share // 3) if c.sources else "none"
        parts += [
            f"## Researcher {i}",
            f"Answer: {_clip(c.answer, share // 4) if c.answer else '(no answer found)'}",
            f"Reasoning: {_clip(c.reasoning, share // 2) if c.reasoning else '(none)'}",
            f"Sources: {sources}",
            "",
        ]
    parts.append("Give the final answer to the question.")
    return [{"role": "system", "content": SYNTHESIS_PROMPT},
            {"role": "user", "content": "\n".join(parts)}]
