"""What the trainers know about chat templates: how an assistant turn ends and how the next
one starts. One place for SFT (the loss mask) and RL (the token recorder, the IG pseudo answer,
the reward anchors, the rollout engines' stop tokens), so RL works on every template SFT does.

Nothing is hard-wired to one template: the markers are read off the tokenizer's own chat
template by rendering a tiny conversation (string work, no model):

* ``turn_close``: what the template writes after an assistant message's content (ChatML:
  ``"<|im_end|>\\n"``; Llama 3: ``"<|eot_id|>"``; Gemma: ``"<end_of_turn>\\n"``);
* ``end_of_turn``: the token in it that ends the turn (ChatML ``<|im_end|>``), the one the
  model samples to stop;
* ``assistant_header``: what the generation prompt adds before the model writes (ChatML:
  ``"<|im_start|>assistant\\n"``; a Qwen3 thinking template also prefills its think opener, which
  is not part of the header); ``header_start`` / ``header_role`` split it into its first token
  and the rest (``<|im_start|>`` / ``assistant``).

A tokenizer without a chat template (a bare test stand-in) gets ChatML's markers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from drvenus.protocol import THINK_OPEN

# Tokens that end an assistant turn in common templates (besides the tokenizer's eos token):
# ChatML (Qwen, SmolLM), Llama 3, Phi-3, Gemma, Mistral / Llama 2.
END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "</s>")
_PLACEHOLDER = "\x00drvenus-placeholder\x00"


class TemplateError(ValueError):
    """The chat template cannot be split into turns the RL recorder can append."""


@dataclass(frozen=True)
class TurnMarkers:
    """The pieces of a chat template around an assistant turn (see the module doc)."""

    turn_close: str
    end_of_turn: str
    assistant_header: str
    header_start: str
    header_role: str


CHATML = TurnMarkers(turn_close="<|im_end|>\n", end_of_turn="<|im_end|>",
                     assistant_header="<|im_start|>assistant\n", header_start="<|im_start|>",
                     header_role="assistant")


def render(tokenizer: Any, messages: Sequence[Mapping[str, Any]], *, gen: bool) -> str:
    """The chat template's text of ``messages`` (with the generation prompt when ``gen``)."""
    text = tokenizer.apply_chat_template([dict(m) for m in messages], add_generation_prompt=gen,
                                         tokenize=False)
    if not isinstance(text, str):
        raise TemplateError("apply_chat_template did not return text")
    return text


def _vocab_id(tokenizer: Any, token: str) -> int | None:
    tid = tokenizer.convert_tokens_to_ids(token)
    unknown = getattr(tokenizer, "unk_token_id", None)
    return tid if isinstance(tid, int) and tid >= 0 and tid != unknown else None


def end_of_turn_ids(tokenizer: Any) -> frozenset[int]:
    """Token ids that close an assistant turn: the eos token and the usual turn-end tokens the
    vocabulary has (the SFT mask ends a turn at the last of them; rollouts stop at them)."""
    ids = set()
    eos = getattr(tokenizer, "eos_token_id", None)
    if isinstance(eos, int) and eos >= 0:
        ids.add(eos)
    for token in END_OF_TURN_TOKENS:
        tid = _vocab_id(tokenizer, token)
        if tid is not None:
            ids.add(tid)
    return frozenset(ids)


def _first_token(tokenizer: Any, text: str) -> str:
    """The text of the first token of ``text`` (``text`` itself when it cannot be tokenised)."""
    try:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    except Exception:  # a stand-in without __call__
        return text
    return tokenizer.decode(ids[:1], skip_special_tokens=False) if ids else text


def _read_markers(tokenizer: Any) -> TurnMarkers:
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str) or not template:
        raise TemplateError("the tokenizer has no chat template")
    base = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]
    full = render(tokenizer, base + [{"role": "assistant", "content": _PLACEHOLDER}], gen=False)
    cut = full.find(_PLACEHOLDER)
    if cut < 0:
        raise TemplateError("the chat template drops assistant content")
    close = full[cut + len(_PLACEHOLDER):]
    stripped = close.lstrip()
    eos = getattr(tokenizer, "eos_token", None)
    known = [t for t in (*END_OF_TURN_TOKENS, eos) if isinstance(t, str) and t]
    end = next((t for t in known if stripped.startswith(t)), None)
    if end is None:
        end = stripped.split()[0] if stripped.split() else (eos or CHATML.end_of_turn)
    prompt, generation = render(tokenizer, base, gen=False), render(tokenizer, base, gen=True)
    header = generation[len(prompt):] if generation.startswith(prompt) else ""
    header = header.split(THINK_OPEN)[0]  # a prefilled think opener is not the header
    if not header.strip():
        return TurnMarkers(close, end, header, "", "")
    start = _first_token(tokenizer, header.lstrip())
    role = header.lstrip()[len(start):].strip()
    return TurnMarkers(close, end, header, start, role)


def template_markers(tokenizer: Any) -> TurnMarkers:
    """The :class:`TurnMarkers` of the tokenizer's chat template (three small renderings);
    :class:`TemplateError` when it has none or drops assistant content."""
    return _read_markers(tokenizer)


def turn_markers(tokenizer: Any) -> TurnMarkers:
    """:func:`template_markers`, or ChatML's when the tokenizer has no usable template."""
    try:
        return template_markers(tokenizer)
    except TemplateError:
        return CHATML


def find_turn_ends(token_ids: Sequence[int], tokenizer: Any) -> list[int]:
    """Positions of end-of-turn tokens followed within 4 tokens by the assistant header
    (DR-Venus's reward anchors: the end of the tool response before each next assistant turn;
    ChatML: ``<|im_end|>`` then ``<|im_start|>assistant``). Empty when the template's header
    has no start token of its own."""
    markers = turn_markers(tokenizer)
    end_id = _vocab_id(tokenizer, markers.end_of_turn)
    start_id = _vocab_id(tokenizer, markers.header_start) if markers.header_start else None
    if end_id is None or start_id is None:
        return []
    n, ends = len(token_ids), []
    for pos, tid in enumerate(token_ids):
        if tid != end_id:
            continue
        for nxt in range(pos + 1, min(pos + 5, n)):
            if token_ids[nxt] == start_id:
                role = tokenizer.decode(list(token_ids[nxt + 1 : nxt + 4]),
                                        skip_special_tokens=False)
                if role.lstrip().startswith(markers.header_role):
                    ends.append(pos)
                break
    return ends


__all__ = ["CHATML", "END_OF_TURN_TOKENS", "TemplateError", "TurnMarkers", "end_of_turn_ids",
           "find_turn_ends", "render", "template_markers", "turn_markers"]
