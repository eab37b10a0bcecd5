"""A finished agent trajectory as RL token data: ids, masks and one boundary per assistant turn.

The conversation (system, question, then assistant turns and tool-response user turns, as
``drvenus.agent`` records it in ``ResultRecord.messages``) is rendered with the chat template and
tokenised once by :func:`drvenus.train.sft.tokenize.encode_conversation`; the loss mask is the
SFT mask (exactly the tokens the model generated). Turn k's boundary is the
:class:`Boundary` the IG scorer expects: ``token_len`` = the number of
tokens before the first token of turn k's generated text, so ``input_ids[:token_len]`` is what
the policy was given (its generation header and any prefilled text included).

These record types need no torch (the verl plugin's converters and the recorder use them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from drvenus.protocol import parse_turn
from drvenus.train.sft.tokenize import MaskError, encode_conversation


@dataclass(frozen=True)
class Boundary:
    """Turn k's boundary: ``token_len`` trajectory tokens precede assistant turn k (the
    generation header included); ``tool_name`` is the tool turn k called (None: none)."""

    token_len: int
    tool_name: str | None = None


@dataclass
class RolloutRecord:
    """Token view of one trajectory. Per assistant turn k: ``boundaries[k]`` (start of its
    generated tokens, tool name), ``generated_ends[k]`` (one past its last generated token),
    ``message_indices[k]`` and ``turns[k]`` (its text, for the format checks)."""

    input_ids: list[int]
    prompt_len: int
    response_mask: list[int]
    loss_mask: list[int]
    boundaries: list[Boundary]
    generated_ends: list[int]
    message_indices: list[int]
    turns: list[str]

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def tool_names(self) -> list[str | None]:
        return [b.tool_name for b in self.boundaries]

    @property
    def response_ids(self) -> list[int]:
        """Every token after the prompt (generated text and tool responses)."""
        return self.input_ids[self.prompt_len:]


def turn_tool_name(content: str) -> str | None:
    """The tool an assistant turn calls; None for an answer or a malformed turn."""
    parsed = parse_turn(content)
    return parsed.tool_call.name if parsed.kind == "tool_call" and parsed.tool_call else None


def rollout_record(
    messages: Sequence[Mapping[str, Any]], tokenizer: Any, *, prompt_messages: int = 2
) -> RolloutRecord:
    """Build the :class:`RolloutRecord` of a finished trajectory. ``prompt_messages``: how many
    leading messages form the prompt (system + question); the next one must be the first
    assistant turn. Raises :class:`~drvenus.train.sft.tokenize.MaskError` when the template
    cannot give an honest mask."""
    if len(messages) <= prompt_messages or messages[prompt_messages].get("role") != "assistant":
        raise MaskError("no_assistant_turn", f"message {prompt_messages} is not an assistant turn")
    if any(m.get("role") == "assistant" for m in messages[:prompt_messages]):
        raise MaskError("assistant_in_prompt", f"an assistant turn in the first {prompt_messages}")
    enc = encode_conversation(messages, tokenizer)
    ids, offsets, mask = enc.input_ids, enc.offsets, enc.loss_mask
    index = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    boundaries, ends = [], []
    j = 0
    for i, (start, end) in zip(index, enc.spans, strict=True):
        while j < len(ids) and offsets[j][0] < start:
            j += 1
        first = j
        while j < len(ids) and offsets[j][0] < end:
            j += 1
        generated = [k for k in range(first, j) if mask[k]]
        if not generated:
            raise MaskError("no_trained_tokens", f"assistant message {i} has no generated token")
        boundaries.append(Boundary(first, turn_tool_name(str(messages[i].get("content", "")))))
        ends.append(generated[-1] + 1)
    prompt_len = boundaries[0].token_len
    return RolloutRecord(
        input_ids=ids,
        prompt_len=prompt_len,
        response_mask=[0] * prompt_len + [1] * (len(ids) - prompt_len),
        loss_mask=mask,
        boundaries=boundaries,
        generated_ends=ends,
        message_indices=index,
        turns=[str(messages[i].get("content", "")) for i in index],
    )


__all__ = ["Boundary", "RolloutRecord", "rollout_record", "turn_tool_name"]
