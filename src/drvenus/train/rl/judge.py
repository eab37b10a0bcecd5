"""DR-Venus's RL outcome judge (``--protocol dr-venus``), in drvenus's own code.

DR-Venus scores each trajectory with ``RL/verl/utils/reward_score/llm_judge.py``; this follows
it, with its prompt, verdict pattern and short answers read from the pinned file
(:mod:`drvenus.reference.dr_venus_rl`):

* the question is read off the decoded prompt, as DR-Venus reads it: the text after the first
  ``user\\n`` and before the next ``assistant\\n`` (with a ChatML template the question followed
  by the template's end-of-turn and start tokens, which the judge sees too);
* the answer is the first answer block (stripped) in the decoded response after its
  last ``assistant\\n`` (the final turn), empty when there is none;
* the literal short-cut: an answer equal (both stripped) to the whole ground-truth string scores
  1 and the judge is not asked; one of DR-Venus's short answers (the empty one included) scores
  0 unasked;
* otherwise the judge gets the prompt with ``correct_answer`` the whole ground-truth string, as
  one user message with temperature 0.1, top_p 0.95, n 1, thinking on
  (``chat_template_kwargs.enable_thinking``), no token cap, a 300 s timeout and up to 3
  attempts (an empty reply is asked again; the request goes to the endpoint's ``/v1`` under the
  one base-URL rule and is retried under the one retry policy, so a 4xx is not asked again);
  the first match of the verdict pattern decides; no
  verdict (or no reply) scores 0, and is counted as a judge failure.

No cache: DR-Venus asks its (sampling) judge every time.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from drvenus.llm.base import LLMError
from drvenus.llm.openai_compat import HttpTransport
from drvenus.net import RetryPolicy, with_retries
from drvenus.protocol.dr_venus import first_answer
from drvenus.reference.dr_venus_rl import RLJudgeTexts
from drvenus.train.rl.rewards import JudgeStats

log = logging.getLogger(__name__)

# DR-Venus's judge call (llm_judge.call_judge_api / get_judge_response), implemented here
JUDGE_TEMPERATURE = 0.1
JUDGE_TOP_P = 0.95
JUDGE_TIMEOUT = 300.0
JUDGE_ATTEMPTS = 3
ENABLE_THINKING = True  # DR-Venus: ENABLE_JUDGE_THINKING, default true

_USER, _ASSISTANT = "user\n", "assistant\n"


def judge_question(prompt_text: str, fallback: str) -> str:
    """The question as DR-Venus's judge reads it off the decoded prompt (``fallback`` when the
    prompt has no ``user\\n``)."""
    if _USER not in prompt_text:
        return fallback
    return prompt_text.split(_USER)[1].split(_ASSISTANT)[0]


def judge_answer(response_text: str) -> str:
    """The first answer block of the final turn of the decoded response, stripped ('' if none)."""
    answer = first_answer(response_text.split(_ASSISTANT)[-1])
    return answer.strip() if answer is not None else ""


@dataclass(frozen=True)
class DrVenusJudge:
    """DR-Venus's outcome judge on an OpenAI-compatible endpoint (see the module doc)."""

    texts: RLJudgeTexts
    base_url: str
    model: str
    api_key: str | None = None
    concurrency: int = 8
    timeout: float = JUDGE_TIMEOUT
    enable_thinking: bool = ENABLE_THINKING

    def payload(self, prompt: str) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model, "messages": [{"role": "user", "content": prompt}],
            "temperature": JUDGE_TEMPERATURE, "top_p": JUDGE_TOP_P, "n": 1,
        }
        if self.enable_thinking:
            body["chat_template_kwargs"] = {"enable_thinking": True}
        return body

    def verdict(self, reply: str) -> bool | None:
        m = re.search(self.texts.verdict, reply, self.texts.flags)
        return None if m is None else m.group(1).lower() == "yes"

    def prompt(self, question: str, answer: str, ground_truth: str) -> str:
        return self.texts.prompt.format(question=question, correct_answer=ground_truth,
                                              response=answer)

    def transport(self) -> HttpTransport:
        """The judge's endpoint under the one base-URL rule (``http://host:8000`` and
        ``http://host:8000/v1`` are the same server, as for ``eval``'s judge)."""
        return HttpTransport(self.base_url, self.api_key, timeout=self.timeout)

    async def ask(self, transport: HttpTransport, prompt: str) -> str | None:
        """The judge's reply (stripped), None when none came after every attempt. HTTP failures
        and empty replies are tried again under the one retry policy (an error that says the
        request itself is wrong, a 4xx, is not)."""
        body = self.payload(prompt)

        async def attempt(seconds: float | None) -> str:
            data = await transport.request("POST", "/chat/completions", body, seconds)
            try:
                content = data["choices"][0]["message"]["content"]
            except (KeyError, IndexError, TypeError):
                raise LLMError(f"{transport.where}: a reply without choices") from None
            if not content or not str(content).strip():
                raise LLMError(f"{transport.where}: an empty reply", retryable=True)
            return str(content).strip()

        try:
            return await with_retries(attempt, RetryPolicy(JUDGE_ATTEMPTS), timeout=self.timeout,
                                      what="outcome judge")
        except LLMError as exc:
            log.warning("outcome judge: no reply (%s)", exc)
            return None

    async def score(self, items: Sequence[tuple[str, str, str, str]]
                    ) -> tuple[list[float], JudgeStats]:
        """Outcome per ``(prompt text, response text, ground truth, question)``: the prompt and
        response decoded with special tokens, the question for a prompt that has no user
        header."""
        stats = JudgeStats()
        gate = asyncio.Semaphore(max(1, self.concurrency))
        zero = set(self.texts.zero_answers)

        async def one(transport: HttpTransport, prompt_text: str, response_text: str, gt: str,
                      question: str) -> float:
            answer = judge_answer(response_text)
            if answer == gt.strip():
                stats.exact += 1
                return 1.0
            if answer in zero:
                return 0.0
            prompt = self.prompt(judge_question(prompt_text, question), answer, gt)
            async with gate:
                reply = await self.ask(transport, prompt)
            verdict = None if reply is None else self.verdict(reply)
            if verdict is None:
                stats.failures += 1
                stats.errors.append("no reply" if reply is None else
                                    f"no verdict in {reply[:80]!r}")
                return 0.0
            stats.judged += 1
            return 1.0 if verdict else 0.0

        transport = self.transport()
        try:
            scores = await asyncio.gather(*(one(transport, *it) for it in items))
        finally:
            await transport.aclose()
        return list(scores), stats


def make_dr_venus_judge(texts: RLJudgeTexts, judge_url: str | None, judge_model: str | None,
                        concurrency: int) -> DrVenusJudge | None:
    """DR-Venus's judge on the configured endpoint (options, else ``DRVENUS_JUDGE_*``); None when
    none is configured."""
    from drvenus.grading.judge import JudgeConfig

    cfg = JudgeConfig.from_options(judge_url, judge_model)
    if cfg is None:
        return None
    return DrVenusJudge(texts, cfg.base_url, cfg.model, cfg.api_key, concurrency=concurrency)


def decoded(tokenizer: Any, ids: Sequence[int], prompt_len: int) -> tuple[str, str]:
    """(prompt text, response text) of a trajectory, special tokens kept (DR-Venus decodes so)."""
    return (tokenizer.decode(list(ids[:prompt_len]), skip_special_tokens=False),
            tokenizer.decode(list(ids[prompt_len:]), skip_special_tokens=False))


__all__ = ["DrVenusJudge", "decoded", "judge_answer", "judge_question", "make_dr_venus_judge"]
