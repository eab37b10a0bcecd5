"""Exact token records of agent rollouts: the agent loop runs unchanged on a
:class:`TokenRecorder`, a :class:`~drvenus.llm.base.ChatModel` that keeps one token sequence per
trajectory and hands the policy engine token ids.

The sequence only ever grows by what the policy sampled and by the tokens of the messages the
agent added after it, so the ids the trainer scores are exactly the ids the policy saw and
produced, with no re-tokenisation of the history (a sampled token sequence does not always equal
the tokenisation of its own text, and templates may render earlier turns differently):

* first call: the chat template renders the system prompt and question (generation header
  included) and that text is tokenised;
* after a sampled turn: the sampled ids, then the template's text that closes an assistant turn
  (:class:`~drvenus.train.templates.TurnMarkers` ``turn_close``; ChatML ``"<|im_end|>\\n"``),
  minus the end-of-turn token when the model sampled it, then
  the new messages rendered on their own (after a placeholder system message that is cut off)
  with the generation header;
* a retry of the same step (robust mode) or a limit notice that replaced the newest tool
  response starts again from the ids before those messages; the replaced turn is forgotten.

Anything else (the agent rewriting an earlier message) raises :class:`LLMError`: the record
could no longer be exact.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from drvenus.llm.base import Generation, GrammarKind, LLMError, SamplingParams
from drvenus.protocol import assistant_text, template_prefills_think
from drvenus.train.rl.engine import TokenEngine
from drvenus.train.rl.rollout import Boundary, RolloutRecord, turn_tool_name
from drvenus.train.templates import TemplateError, render, template_markers

_PLACEHOLDER = "\x00drvenus-placeholder\x00"


class ChatTemplateParts:
    """The pieces of a chat template the recorder appends: what closes an assistant turn and
    how a run of new (user / tool) messages renders, generation header included."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.turn_close = template_markers(tokenizer).turn_close  # TemplateError: none usable
        self.prefilled_think = template_prefills_think(tokenizer.chat_template)
        self._system = [{"role": "system", "content": _PLACEHOLDER}]
        self._system_text = self.render(self._system, gen=False)

    def render(self, messages: Sequence[Mapping[str, Any]], *, gen: bool) -> str:
        return render(self.tokenizer, messages, gen=gen)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False)) if text else []

    def prompt(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """The first prompt: the whole conversation so far, ready for the reply."""
        return self.encode(self.render(messages, gen=True))

    def closing(self, sampled: Sequence[int]) -> list[int]:
        """Ids that close a sampled assistant turn (the end-of-turn token is left out when the
        model sampled it)."""
        text = self.turn_close
        if sampled:
            last = self.tokenizer.decode([sampled[-1]], skip_special_tokens=False)
            if last and text.startswith(last):
                text = text[len(last):]
        return self.encode(text)

    def continuation(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """Ids of ``messages`` (none of them the assistant's) rendered after a closed turn,
        with the generation header."""
        text = self.render(self._system + [dict(m) for m in messages], gen=True)
        if not text.startswith(self._system_text):
            raise TemplateError("the chat template renders messages differently after a system "
                                "message; the recorder cannot append them exactly")
        return self.encode(text[len(self._system_text):])


@dataclass
class TurnTokens:
    """A sampled assistant turn in the sequence: ids ``[start, end)``; ``message_index`` is its
    place in the conversation; ``text`` the turn as the agent received it."""

    start: int
    end: int
    message_index: int
    text: str
    finish_reason: str | None = None


@dataclass
class _Anchor:
    """Ids that precede ``messages[n:]`` of the next prompt, and the messages they cover."""

    ids: list[int]
    n: int
    messages: list[dict[str, str]]


def _same(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]]) -> bool:
    """Same conversation prefix: roles everywhere, contents except the assistant's (the agent
    may store a repaired assistant text; the ids hold what was sampled)."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if x.get("role") != y.get("role"):
            return False
        if x.get("role") != "assistant" and x.get("content") != y.get("content"):
            return False
    return True


class TokenRecorder:
    """A ChatModel for one trajectory that records exact token ids (see the module doc)."""

    def __init__(self, engine: TokenEngine, parts: ChatTemplateParts | None = None) -> None:
        self.engine = engine
        self.parts = parts or ChatTemplateParts(engine.tokenizer)
        self.name = engine.name
        self.ids: list[int] = []  # through the last kept sampled turn
        self.turns: list[TurnTokens] = []
        self._anchor = _Anchor([], 0, [])
        self._last: tuple[list[dict[str, str]], list[int]] | None = None  # messages, prompt
        self._first: list[dict[str, str]] | None = None  # the first prompt's messages

    # -- ChatModel ---------------------------------------------------------------------------

    def count_tokens(self, text: str) -> int:
        return len(self.parts.encode(text))

    async def context_window(self) -> int | None:
        return await self.engine.context_window()

    async def aclose(self) -> None:
        """The engine is shared by every rollout; its owner closes it."""

    async def generate(
        self,
        messages: list[dict[str, str]],
        params: SamplingParams,
        *,
        grammar: GrammarKind | None = None,
        timeout: float | None = None,
    ) -> Generation:
        if grammar:
            raise LLMError("rollouts decode freely: grammar-constrained decoding is off in RL")
        prompt = self._prompt_for(messages)
        gen = await self.engine.generate_tokens(prompt, params, timeout=timeout)
        n = len(messages)
        text = assistant_text(gen.text, None, prefilled_think=self.parts.prefilled_think)
        self.turns = [t for t in self.turns if t.message_index < n]
        self.ids = prompt + list(gen.token_ids)
        self.turns.append(TurnTokens(len(prompt), len(self.ids), n, text, gen.finish_reason))
        self._last = ([dict(m) for m in messages], prompt)
        return Generation(
            text=text,
            prompt_tokens=len(prompt),
            completion_tokens=len(gen.token_ids),
            cached_tokens=gen.cached_tokens,
            finish_reason=gen.finish_reason,
            extra={"token_ids": list(gen.token_ids)},
        )

    def _prompt_for(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        if self._last is not None:  # did the agent keep the last sampled turn?
            seen, prompt = self._last
            n = len(seen)
            if (len(messages) > n and messages[n].get("role") == "assistant"
                    and _same(messages[:n], seen)):
                sampled = self.ids[len(prompt):]
                ids = self.ids + self.parts.closing(sampled)
                self._anchor = _Anchor(ids, n + 1, [dict(m) for m in messages[: n + 1]])
                self._last = None
        anchor = self._anchor
        if anchor.n == 0:
            if self._first is None:
                self._first = [dict(m) for m in messages]
            elif not _same(messages[: len(self._first)], self._first):
                raise LLMError("the agent rewrote an earlier message: the rollout's token "
                               "record cannot stay exact")
            return self.parts.prompt(messages)
        if len(messages) < anchor.n or not _same(messages[: anchor.n], anchor.messages):
            raise LLMError("the agent rewrote an earlier message: the rollout's token record "
                           "cannot stay exact")
        new = messages[anchor.n:]
        if any(m.get("role") == "assistant" for m in new):
            raise LLMError("an assistant message the policy did not sample")
        return anchor.ids + self.parts.continuation(new)

    # -- the record --------------------------------------------------------------------------

    def record(self, messages: Sequence[Mapping[str, Any]] | None = None) -> RolloutRecord | None:
        """The trajectory as RL token data; None when no turn was kept. With the run's final
        ``messages``, a last sampled turn the agent did not keep (empty output, then the run
        ended) is left out."""
        turns = list(self.turns)
        if messages is not None:
            while turns and (turns[-1].message_index >= len(messages)
                             or messages[turns[-1].message_index].get("role") != "assistant"):
                turns.pop()
        if not turns:
            return None
        ids = list(self.ids[: turns[-1].end])
        loss = [0] * len(ids)
        for t in turns:
            loss[t.start:t.end] = [1] * (t.end - t.start)
        prompt_len = turns[0].start
        return RolloutRecord(
            input_ids=ids,
            prompt_len=prompt_len,
            response_mask=[0] * prompt_len + [1] * (len(ids) - prompt_len),
            loss_mask=loss,
            boundaries=[Boundary(t.start, turn_tool_name(t.text)) for t in turns],
            generated_ends=[t.end for t in turns],
            message_indices=[t.message_index for t in turns],
            turns=[t.text for t in turns],
        )


__all__ = ["ChatTemplateParts", "TemplateError", "TokenRecorder", "TurnTokens"]
