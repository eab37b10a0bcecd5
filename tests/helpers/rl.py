"""DR-Venus's RL environment under test: the fixture checkout of its pinned files (our own
words, laid out like the real ones) and the texts the rollouts must send, the environment and
rollout settings, and a scripted token engine."""

from __future__ import annotations

import asyncio
import hashlib
import re
from pathlib import Path

from drvenus.llm.base import SamplingParams
from drvenus.reference.dr_venus_rl import RL_FILES, RLTexts
from drvenus.reference.sources import SOURCES, Source
from drvenus.reference.store import ReferenceStore
from drvenus.train.rl.collect import RolloutConfig
from drvenus.train.rl.engine import TokenGeneration
from drvenus.train.rl.environment import env_config
from drvenus.train.rl.recorder import ChatTemplateParts
from drvenus.train.templates import turn_markers

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "reference"

# the fixtures' texts (our own words), as the rollouts must send them
SYSTEM = "Fixture system prompt: research the question with search and visit.\n\n" \
    "Current date: 2025-01-02\n"
MALFORMED = "<tool_response>\nFixture: that turn could not be read. Call one tool or answer." \
    "\n</tool_response>"
CONTEXT = "Fixture: the context is full. Answer inside <answer></answer> at once."
STEPS = "Fixture: no tool calls are left. Answer inside <answer></answer> at once."
CUTOFF = "Fixture: the batch is almost done. Answer inside <answer></answer> at once."
JUDGE = "Fixture judge.\nQ: {question}\nA: {response}\nGold: {correct_answer}\n" \
    "End with verdict=yes or verdict=no."


def fixture_store(tmp_path: Path, root: Path = FIXTURES, pinned: Path | None = None
                  ) -> ReferenceStore:
    """A store of the fixture checkout ``root``, its files pinned to the hashes of those in
    ``pinned`` (default: ``root``'s own)."""
    files = {p: hashlib.sha256(((pinned or root) / "DR-Venus" / p).read_bytes()).hexdigest()
             for p in RL_FILES}
    source = Source(name="DR-Venus", repo="inclusionAI/DR-Venus",
                    commit=SOURCES["DR-Venus"].commit, files=files)
    return ReferenceStore(cache_dir=tmp_path / "cache", local_dir=root, download=False,
                          sources={"DR-Venus": source})


def env(texts: RLTexts, **kw):
    values = {"system_prompt": None, "current_date": None, "max_model_len": 100_000,
              "max_new_tokens": 64, "sampling": SamplingParams(max_tokens=64), "attempts": 1,
              "tool_timeout": 5.0, "time_limit": 60.0, **kw}
    return env_config(texts, **values)


_FIRST_USER = re.compile(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", re.DOTALL)


class QuestionEngine:
    """Scripted turns chosen by ``script(question, turns so far)``, sampled as their own
    tokenisation plus the end-of-turn token; records every prompt and sampling."""

    name = "fake"

    def __init__(self, tokenizer, script):
        self.tokenizer, self.script = tokenizer, script
        self.eot = tokenizer.convert_tokens_to_ids(turn_markers(tokenizer).end_of_turn)
        self.prefilled = ChatTemplateParts(tokenizer).prefilled_think
        self.calls: list[tuple[str, list[int], SamplingParams]] = []

    async def generate_tokens(self, prompt_ids, params, *, timeout=None):
        text = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        question = _FIRST_USER.search(text).group(1)
        self.calls.append((question, list(prompt_ids), params))
        await asyncio.sleep(0)
        reply = self.script(question, text.count("<|im_start|>assistant") - 1)
        if self.prefilled:
            reply = reply.removeprefix("<think>\n")
        ids = self.tokenizer.encode(reply, add_special_tokens=False)
        return TokenGeneration(ids + [self.eot], reply, "stop", len(prompt_ids))

    async def context_window(self):
        return 16384

    async def aclose(self):
        pass


def dr_venus_config(texts, **kw) -> RolloutConfig:
    values = {"n": 1, "max_turns": 4, "max_turns_jitter": 0, "concurrency": 16, "seed": 1,
              "max_new_tokens": 32, "max_model_len": 16384, "current_date": None, **kw}
    return RolloutConfig.from_rl(None, protocol="dr-venus", texts=texts, **values)
