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
could no longer be exact; with ``segments`` (a context strategy compacts the conversation,
:mod:`drvenus.agent.context`) such a prompt starts a new segment instead: the chat template
renders the compacted conversation as a first prompt, and the record holds the last segment
(what the policy saw since the last compaction; the turns before it are not trained).

``rerender_queries`` (DR-Venus's RL environment, :mod:`drvenus.train.rl.environment`): a new
plain user message (a notice that is not a ``<tool_response>`` frame) makes the prompt the chat
template's rendering of the whole conversation, as DR-Venus renders every turn's prompt; a
Qwen3 thinking template then drops the reasoning of the earlier turns. Such a trajectory is
recorded on that last prompt: the ids the last turn saw, then its sampled ids; the earlier
turns are trained where the template rendered them in that prompt (their text as rendered
there, as DR-Venus trains its re-rendered conversation), each one's place found by rendering
the conversation with that turn's content swapped for a marker.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from drvenus.llm.base import Generation, GrammarKind, LLMError, SamplingParams
from drvenus.protocol import (
    TOOL_RESPONSE_CLOSE,
    TOOL_RESPONSE_OPEN,
    assistant_text,
    template_prefills_think,
)
from drvenus.protocol.state import TurnState
from drvenus.train.rl.engine import TokenEngine
from drvenus.train.rl.rollout import Boundary, RolloutRecord, turn_tool_name
from drvenus.train.sft.tokenize import MaskError
from drvenus.train.templates import TemplateError, end_of_turn_ids, render, template_markers

log = logging.getLogger(__name__)

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


def _plain_user(message: Mapping[str, Any]) -> bool:
    """A user message that is not a ``<tool_response>`` frame (a new query to a Qwen3 template)."""
    content = str(message.get("content", ""))
    return message.get("role") == "user" and not (
        content.startswith(TOOL_RESPONSE_OPEN) and content.endswith(TOOL_RESPONSE_CLOSE))


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

    def __init__(self, engine: TokenEngine, parts: ChatTemplateParts | None = None, *,
                 rerender_queries: bool = False, segments: bool = False,
                 reopen_think: Callable[[str], str] | None = None) -> None:
        """``reopen_think``: how a sample gets back the think opener the chat template wrote
        into the prompt (None: :func:`assistant_text`'s rule; an environment's own, e.g.
        DR-Venus's RL loop: ``<think>`` and no newline)."""
        self.engine = engine
        self.reopen_think = reopen_think
        self.parts = parts or ChatTemplateParts(engine.tokenizer)
        self.rerender_queries = rerender_queries
        self.segments = segments
        self.restarts = 0  # segments started by a compaction
        self.rerendered = False  # a prompt was the template's rendering of the conversation
        self.name = engine.name
        self.ids: list[int] = []  # through the last kept sampled turn
        self.turns: list[TurnTokens] = []
        self._anchor = _Anchor([], 0, [])
        self._last: tuple[list[dict[str, str]], list[int]] | None = None  # messages, prompt
        self._first: list[dict[str, str]] | None = None  # the first prompt's messages

    # -- ChatModel ---------------------------------------------------------------------------

    def count_tokens(self, text: str) -> int:
        return len(self.parts.encode(text))

    def prompt_length(self, messages: Sequence[Mapping[str, Any]]) -> int:
        """How many tokens the prompt of ``messages`` holds (what :meth:`generate` would send)."""
        return len(self._prompt_for(messages, dry=True))

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
        state: TurnState | None = None,
        timeout: float | None = None,
    ) -> Generation:
        if grammar:
            raise LLMError("rollouts decode freely: grammar-constrained decoding is off in RL")
        prompt = self._prompt_for(messages)
        gen = await self.engine.generate_tokens(prompt, params, timeout=timeout)
        n = len(messages)
        if self.reopen_think is not None and self.parts.prefilled_think:
            text = self.reopen_think(gen.text)
        else:
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

    def _prompt_for(self, messages: Sequence[Mapping[str, Any]], *, dry: bool = False
                    ) -> list[int]:
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
                return self._rewritten(messages, dry)
            return self.parts.prompt(messages)
        if len(messages) < anchor.n or not _same(messages[: anchor.n], anchor.messages):
            return self._rewritten(messages, dry)
        new = messages[anchor.n:]
        if any(m.get("role") == "assistant" for m in new):
            raise LLMError("an assistant message the policy did not sample")
        if self.rerender_queries and any(_plain_user(m) for m in new):
            if not dry:
                self.rerendered = True
            return self.parts.prompt(messages)
        return anchor.ids + self.parts.continuation(new)

    def _rewritten(self, messages: Sequence[Mapping[str, Any]], dry: bool) -> list[int]:
        """The prompt of a conversation whose earlier messages changed: a new segment (see the
        module doc), or LLMError without ``segments``."""
        if not self.segments:
            raise LLMError("the agent rewrote an earlier message: the rollout's token record "
                           "cannot stay exact")
        if not dry:
            self.restarts += 1
            self.ids, self.turns, self._last, self.rerendered = [], [], None, False
            self._anchor = _Anchor([], 0, [])
            self._first = [dict(m) for m in messages]
        return self.parts.prompt(messages)

    # -- the record --------------------------------------------------------------------------

    def record(self, messages: Sequence[Mapping[str, Any]] | None = None) -> RolloutRecord | None:
        """The trajectory as RL token data; None when no turn was kept. With the run's final
        ``messages``, a last sampled turn the agent did not keep (empty output, then the run
        ended) is left out."""
        if self.rerendered and messages is not None and self.turns and messages \
                and self.turns[-1].message_index == len(messages) - 1:
            try:
                return self._rerendered_record(messages)
            except MaskError as exc:
                log.warning("a re-rendered rollout cannot be masked (%s): left out", exc)
                return None
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


    def _rerendered_record(self, messages: Sequence[Mapping[str, Any]]) -> RolloutRecord:
        """The record of a trajectory whose last prompt was the template's rendering (see the
        module doc): that prompt's ids, then the last turn's sampled ids."""
        last = self.turns[-1] if self.turns else None
        n = len(messages) - 1
        if last is None or last.message_index != n or messages[n].get("role") != "assistant":
            raise MaskError("no_assistant_turn", "the re-rendered last turn was not kept")
        head = [dict(m) for m in messages[:n]]
        prompt = self.ids[: last.start]
        text = self.parts.render(head, gen=True)
        enc = self.parts.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        if list(enc["input_ids"]) != prompt:
            raise MaskError("template_not_prefix", "the last prompt does not re-tokenise exactly")
        offsets = [(int(a), int(b)) for a, b in enc["offset_mapping"]]
        eot = end_of_turn_ids(self.parts.tokenizer)
        starts, ends, index = [], [], []
        for i, m in enumerate(head):
            if m.get("role") != "assistant":
                continue
            lo, hi = _rendered_span(self.parts, head, i, text)
            tokens = [j for j, (a, b) in enumerate(offsets) if a < hi and b > lo] or \
                [next((j for j, (a, _) in enumerate(offsets) if a >= lo), len(prompt))]
            end = tokens[-1] + 1
            if end < len(prompt) and prompt[end] in eot:
                end += 1  # the template's end of turn, trained as a sampled one is
            starts.append(tokens[0])
            ends.append(end)
            index.append(i)
        ids = prompt + self.ids[last.start:last.end]
        loss = [0] * len(ids)
        for a, b in zip(starts + [last.start], ends + [last.end], strict=True):
            loss[a:b] = [1] * (b - a)
        texts = [str(head[i].get("content", "")) for i in index] + [last.text]
        first = (starts + [last.start])[0]
        return RolloutRecord(
            input_ids=ids,
            prompt_len=first,
            response_mask=[0] * first + [1] * (len(ids) - first),
            loss_mask=loss,
            boundaries=[Boundary(b, turn_tool_name(t))
                        for b, t in zip(starts + [last.start], texts, strict=True)],
            generated_ends=ends + [last.end],
            message_indices=index + [n],
            turns=texts,
        )


_MARK = "\x00drvenus-turn\x00"


def _rendered_span(parts: ChatTemplateParts, head: Sequence[Mapping[str, Any]], i: int,
                   text: str) -> tuple[int, int]:
    """Where assistant message ``i`` of ``head`` sits in ``text`` (``head`` rendered with the
    generation header): the region that changes when its content is a marker."""
    probe = [dict(m) for m in head]
    probe[i] = {"role": "assistant", "content": _MARK}
    other = parts.render(probe, gen=True)
    at = other.find(_MARK)
    tail = other[at + len(_MARK):] if at >= 0 else ""
    if at < 0 or other[:at] != text[:at] or not text.endswith(tail) \
            or len(text) - len(tail) < at:
        raise MaskError("template_not_prefix", f"assistant message {i} cannot be located in "
                        "the re-rendered prompt")
    return at, len(text) - len(tail)


__all__ = ["ChatTemplateParts", "TemplateError", "TokenRecorder", "TurnTokens"]
