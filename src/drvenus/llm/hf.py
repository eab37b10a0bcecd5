"""A Hugging Face checkpoint (or a LoRA adapter on one) run in this process with transformers.

This is the backend of fine-tuned checkpoints before they are exported to GGUF, and the one the
RL stage samples and scores with: :attr:`TransformersModel.model` and
:attr:`TransformersModel.tokenizer` are plain transformers objects, and the decode loop is
written out here (one forward per token over a ``DynamicCache``) rather than hidden in
``model.generate``, so that it can keep each conversation's KV cache between agent steps:
step k of a run evaluates only the tokens added since step k-1 (``cached_tokens`` in usage).
``generate`` can continue from a cache too, but the caller would still find the shared
prefix, cut the cache back to it and track which ids it holds (``generate`` never runs the
last sampled token), and add stopping criteria for the cancel flag and the stop strings; the
loop written out is about as short and is the same code the RL stage can step through.

A stop string ends the turn as soon as the decoded text holds one and is left out of the
returned text, as OpenAI-compatible servers (and the in-process llama.cpp) do; the end-of-turn
token is left out too. Grammar-constrained decoding is not supported: asking for a grammar
raises :class:`LLMError` (the agent only asks with ``--constrained``, off for checkpoints by
default).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    DynamicCache,
    LogitsProcessor,
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from drvenus.llm.base import Generation, GrammarKind, LLMError, SamplingParams
from drvenus.net import DEFAULT_REQUEST_TIMEOUT
from drvenus.protocol import assistant_text, template_prefills_think
from drvenus.protocol.state import TurnState

log = logging.getLogger(__name__)

FALLBACK_WINDOW = 32768  # when neither the caller nor the config says
PREFILL_CHUNK = 2048  # prompt tokens per forward (bounds memory; cancel is checked between)


def adapter_base(path: str | os.PathLike[str]) -> str | None:
    """The base model an adapter folder names (``base_model_name_or_path``), else None."""
    config = Path(path) / "adapter_config.json"
    if not config.is_file():
        return None
    try:
        base = json.loads(config.read_text(encoding="utf-8")).get("base_model_name_or_path")
    except (OSError, ValueError) as exc:
        raise LLMError(f"cannot read {config}: {exc}") from None
    if not base:
        raise LLMError(f"{config} names no base model (base_model_name_or_path)")
    return str(base)


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def default_dtype(device: str | torch.device) -> torch.dtype:
    """bf16 on an accelerator, fp32 on the CPU."""
    return torch.float32 if torch.device(device).type == "cpu" else torch.bfloat16


def from_pretrained(cls: Any, path: str | os.PathLike[str], **kw: Any) -> Any:
    """``cls.from_pretrained`` for a model folder, a hub name or a ``.gguf`` file. A model read
    from GGUF is rebuilt as a plain one (transformers marks it quantized and refuses to save it,
    so it could not be fine-tuned and checkpointed), named by the GGUF file (the base a LoRA
    adapter trained on it records)."""
    p = Path(path)
    if p.suffix.lower() != ".gguf":
        return cls.from_pretrained(str(path), **kw)
    loaded = cls.from_pretrained(str(p.parent), gguf_file=p.name, **kw)
    if getattr(loaded, "hf_quantizer", None) is None:
        return loaded  # a tokenizer, or nothing to undo
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config._name_or_path = str(p)
    plain = AutoModelForCausalLM.from_config(config).to(loaded.dtype)
    plain.load_state_dict(loaded.state_dict())
    return plain


def load_pretrained(
    path: str | os.PathLike[str],
    *,
    device: str | None = None,
    dtype: torch.dtype | None = None,
    base_model: str | None = None,
) -> tuple[Any, Any]:
    """``(model, tokenizer)`` from a checkpoint folder, or from an adapter folder: its base
    (``base_model`` or the one ``adapter_config.json`` names) with the adapter applied (peft).
    The tokenizer comes from the folder itself when it has one, else from the base."""
    path = Path(path)
    device = device or default_device()
    dtype = dtype or default_dtype(device)
    base = base_model or adapter_base(path)
    try:
        if base is None:
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        else:
            from peft import PeftModel

            model = from_pretrained(AutoModelForCausalLM, base, dtype=dtype)  # a .gguf too
            model = PeftModel.from_pretrained(model, path)
        has_tokenizer = (path / "tokenizer_config.json").is_file()
        tokenizer = from_pretrained(AutoTokenizer, path if has_tokenizer or not base else base)
    except (OSError, ValueError, ImportError) as exc:
        raise LLMError(f"cannot load checkpoint {path}: {exc}") from None
    model.to(device)
    model.eval()
    return model, tokenizer


class PresencePenaltyLogitsProcessor(LogitsProcessor):
    """OpenAI-style presence penalty: subtract ``penalty`` from the logits of every token that
    already occurs after ``prompt_length`` (the tokens generated in this turn)."""

    def __init__(self, penalty: float, prompt_length: int) -> None:
        self.penalty = float(penalty)
        self.prompt_length = int(prompt_length)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        seen = input_ids[:, self.prompt_length :]
        if not self.penalty or seen.numel() == 0:
            return scores
        return scores - torch.zeros_like(scores).scatter_(1, seen, self.penalty)


def logits_processors(params: SamplingParams, prompt_length: int) -> LogitsProcessorList:
    """The processors for ``params``: presence penalty, then temperature, top-k, top-p (the
    order vLLM samples in). Temperature 0 (greedy) keeps only the penalty."""
    procs = LogitsProcessorList()
    if params.presence_penalty:
        procs.append(PresencePenaltyLogitsProcessor(params.presence_penalty, prompt_length))
    if params.temperature > 0:
        if params.temperature != 1.0:
            procs.append(TemperatureLogitsWarper(params.temperature))
        if params.top_k and params.top_k > 0:
            procs.append(TopKLogitsWarper(int(params.top_k)))
        if params.top_p is not None and 0 < params.top_p < 1:
            procs.append(TopPLogitsWarper(float(params.top_p)))
    return procs


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass
class CacheSlot:
    """A KV cache and the token ids whose keys and values it holds, in order."""

    cache: Any
    ids: list[int] = field(default_factory=list)


def crop(slot: CacheSlot, keep: int) -> CacheSlot | None:
    """``slot`` cut to its first ``keep`` tokens, or None when its layers cannot be cut."""
    drop = len(slot.ids) - keep
    if drop == 0:
        return slot
    if keep <= 0:
        return None
    layers = getattr(slot.cache, "layers", ())
    if not layers or not all(getattr(layer, "is_croppable", False) for layer in layers):
        return None
    slot.cache.crop(-drop)
    del slot.ids[keep:]
    return slot


class CachePool:
    """Up to ``size`` conversations' KV caches, least recently used first.

    A prompt takes the cache it extends (the next agent step) or that already holds all of it
    but its last token (a retried step), cut back to the shared prefix; else a fresh cache
    while the pool has room; else the least recently used one, cut back to what it shares
    with the prompt (often the system prompt)."""

    def __init__(self, size: int, new_cache: Any) -> None:
        self.size = max(1, size)
        self.new_cache = new_cache
        self.slots: list[CacheSlot] = []

    def take(self, prompt: list[int]) -> CacheSlot:
        """The slot to run ``prompt`` on, out of the pool (give it back with :meth:`put`)."""
        limit = len(prompt) - 1  # the last prompt token must run: its logits come next
        best, shared = None, 0
        for slot in self.slots:
            n = min(common_prefix(slot.ids, prompt), limit)
            if n > shared:
                best, shared = slot, n
        if best is None or (shared < len(best.ids) and shared < limit):
            if len(self.slots) < self.size:
                return CacheSlot(self.new_cache())
            best = self.slots[0]
            shared = min(common_prefix(best.ids, prompt), limit)
        self.slots.remove(best)
        return crop(best, shared) or CacheSlot(self.new_cache())

    def put(self, slot: CacheSlot) -> None:
        self.slots.append(slot)
        while len(self.slots) > self.size:
            self.slots.pop(0)

    def clear(self) -> None:
        self.slots.clear()


class Cancelled(Exception):
    """The generation was stopped by its caller (timeout, cancellation, close)."""


class TransformersModel:
    """A :class:`~drvenus.llm.base.ChatModel` over a Hugging Face checkpoint folder.

    One generation runs at a time (a lock), in a worker thread so the event loop stays free;
    ``slots`` conversations keep their KV caches between calls.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        device: str | None = None,
        dtype: torch.dtype | str | None = None,
        name: str | None = None,
        window: int | None = None,
        slots: int = 1,
        timeout: float = DEFAULT_REQUEST_TIMEOUT,
        base_model: str | None = None,
    ) -> None:
        """``device``: "cuda" when available, else "cpu". ``dtype``: bf16 on an accelerator,
        fp32 on the CPU. ``window``: tokens of context (default: the config's
        ``max_position_embeddings``). ``slots``: conversations whose KV caches are kept.
        ``base_model``: the base of an adapter folder, overriding its adapter_config.json."""
        self.path = Path(path)
        device_ = torch.device(device or default_device())
        if isinstance(dtype, str):
            dtype = getattr(torch, dtype)
        start = time.perf_counter()
        model, tokenizer = load_pretrained(
            self.path, device=str(device_), dtype=dtype, base_model=base_model
        )
        self._setup(model, tokenizer, name=name, window=window, slots=slots, timeout=timeout)
        self.load_seconds = time.perf_counter() - start
        log.info(
            "loaded %s on %s (%s) in %.2fs: window %d tokens",
            self.path, self.device, self.model.dtype, self.load_seconds, self.window,
        )

    @classmethod
    def from_loaded(
        cls,
        model: Any,
        tokenizer: Any,
        *,
        name: str = "policy",
        window: int | None = None,
        slots: int = 1,
        timeout: float = DEFAULT_REQUEST_TIMEOUT,
    ) -> TransformersModel:
        """A backend over a model already in memory (the RL policy: rollouts sample from the
        very weights being trained). Call :meth:`clear_cache` after every weight update."""
        self = cls.__new__(cls)
        self.path = Path(str(getattr(model, "name_or_path", "") or name))
        self.load_seconds = 0.0
        self._setup(model, tokenizer, name=name, window=window, slots=slots, timeout=timeout)
        return self

    def _setup(
        self,
        model: Any,
        tokenizer: Any,
        *,
        name: str | None,
        window: int | None,
        slots: int,
        timeout: float,
    ) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.device = next(model.parameters()).device
        self.name = name or self.path.name
        self.timeout = timeout
        self.config = self.model.config.get_text_config()
        self.window = int(
            window or getattr(self.config, "max_position_embeddings", 0) or FALLBACK_WINDOW
        )
        template = getattr(self.tokenizer, "chat_template", None)
        if not isinstance(template, str) or not template:
            raise LLMError(f"checkpoint {self.path} has no chat template")
        self.prefilled_think = template_prefills_think(template)
        self.eos_ids = self._eos_ids()
        core = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model
        accepted = inspect.signature(core.forward).parameters
        self._cache_arg = "cache" if "cache" in accepted else "past_key_values"
        self._keep_arg = "logits_to_keep" in accepted
        self.pool = CachePool(slots, lambda: DynamicCache(config=core.config))
        self._lock = threading.Lock()
        self._cancels: set[threading.Event] = set()
        self._closed = False

    def clear_cache(self) -> None:
        """Drop every kept KV cache (they are stale once the weights change)."""
        with self._lock:
            self.pool.clear()

    def __repr__(self) -> str:
        return f"TransformersModel({str(self.path)!r}, device={str(self.device)!r})"

    def _eos_ids(self) -> frozenset[int]:
        ids: set[int] = set()
        gen = getattr(self.model, "generation_config", None)
        for value in (getattr(gen, "eos_token_id", None), self.tokenizer.eos_token_id):
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, (list, tuple)):
                ids.update(int(v) for v in value)
        return frozenset(ids)

    # -- ChatModel ---------------------------------------------------------------------------

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        """The token ids of ``messages`` rendered by the chat template, ready for the reply."""
        text = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False
        )
        return list(self.tokenizer.encode(text, add_special_tokens=False))

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
            raise LLMError(
                f"{self.name}: the transformers backend cannot decode under a grammar "
                "(run without --constrained, or export the model to GGUF)"
            )
        if self._closed:
            raise LLMError(f"model {self.name} is closed")
        cancel = threading.Event()
        self._cancels.add(cancel)
        seconds = timeout or self.timeout
        try:
            return await asyncio.wait_for(
                asyncio.to_thread(self.generate_messages, messages, params, cancel), seconds
            )
        except TimeoutError:
            cancel.set()
            raise LLMError(f"{self.name}: timed out after {seconds:g}s", retryable=True) from None
        except Cancelled:
            raise LLMError(f"model {self.name} was closed during a generation") from None
        except BaseException:  # cancelled: stop the worker too (it checks every token)
            cancel.set()
            raise
        finally:
            self._cancels.discard(cancel)

    async def context_window(self) -> int | None:
        return self.window

    async def aclose(self) -> None:
        self._closed = True
        for event in list(self._cancels):
            event.set()
        await asyncio.to_thread(self._release)

    def _release(self) -> None:
        with self._lock:  # waits for a running generation to notice its cancel flag
            self.pool.clear()
            self.model = None  # the weights go with the last reference
            if self.device.type == "cuda":
                torch.cuda.empty_cache()

    # -- the decode loop ---------------------------------------------------------------------

    def generate_messages(
        self,
        messages: list[dict[str, str]],
        params: SamplingParams,
        cancel: threading.Event | None = None,
    ) -> Generation:
        """Render ``messages`` and sample the reply (blocking); :class:`LLMError` with
        ``context_overflow`` when the prompt does not fit the window."""
        prompt = self.prompt_ids(messages)
        if len(prompt) >= self.window:
            raise LLMError(
                f"{self.name}: prompt of {len(prompt)} tokens exceeds the context window "
                f"({self.window})",
                context_overflow=True,
            )
        return self.generate_ids(prompt, params, cancel)

    def generate_ids(
        self, prompt: list[int], params: SamplingParams, cancel: threading.Event | None = None
    ) -> Generation:
        """Sample one reply to ``prompt`` (token ids), blocking; :class:`Cancelled` when
        ``cancel`` is set. Reuses and updates the best-matching cached conversation."""
        cancel = cancel or threading.Event()
        with self._lock:
            if self._closed:
                raise Cancelled()
            slot = self.pool.take(prompt)
            try:
                with torch.inference_mode():
                    result = self._decode(prompt, slot, params, cancel)
            except Cancelled:
                self.pool.put(slot)  # stopped between forwards: the cache is consistent
                raise
            except (RuntimeError, ValueError) as exc:  # e.g. out of memory: drop that cache
                raise LLMError(f"{self.name}: generation failed: {exc}") from exc
            self.pool.put(slot)
            return result

    def _decode(
        self, prompt: list[int], slot: CacheSlot, params: SamplingParams, cancel: threading.Event
    ) -> Generation:
        start = time.perf_counter()
        cached = len(slot.ids)
        budget = self.window - len(prompt)
        if params.max_tokens is not None:
            budget = min(budget, max(0, params.max_tokens))
        procs = logits_processors(params, len(prompt))
        generator = None
        if params.seed is not None and params.temperature > 0:
            generator = torch.Generator(device=self.device).manual_seed(int(params.seed))
        seq = torch.tensor([prompt + [0] * budget], dtype=torch.long, device=self.device)
        stops = [s for s in params.stop if s]
        tail = max((len(s) for s in stops), default=0) + 8  # tokens that can hold a stop string
        out: list[int] = []
        finish, pending = "length", prompt[cached:]
        while len(out) < budget:
            logits = self._forward(pending, slot, cancel)
            scores = procs(seq[:, : len(prompt) + len(out)], logits[None, :])
            token = self._pick(scores, params.temperature, generator)
            if token in self.eos_ids:
                finish = "stop"
                out.append(token)
                break
            seq[0, len(prompt) + len(out)] = token
            out.append(token)
            if stops and any(s in self._decode_text(out[-tail:]) for s in stops):
                finish = "stop"
                break
            pending = [token]
        seconds = time.perf_counter() - start
        log.debug(
            "%s: %d prompt tokens (%d cached), %d generated in %.2fs (%s)",
            self.name, len(prompt), cached, len(out), seconds, finish,
        )
        text = self._decode_text([t for t in out if t not in self.eos_ids])
        cuts = [i for i in (text.find(s) for s in stops) if i >= 0]
        if cuts:
            text = text[: min(cuts)]
        return Generation(
            text=assistant_text(text, None, prefilled_think=self.prefilled_think),
            prompt_tokens=len(prompt),
            completion_tokens=len(out),
            cached_tokens=cached,
            finish_reason=finish,
            extra={
                "model": self.name,
                "token_ids": out,
                "seconds": round(seconds, 4),
            },
        )

    def _forward(
        self, tokens: list[int], slot: CacheSlot, cancel: threading.Event
    ) -> torch.Tensor:
        """Run ``tokens`` through the model on top of ``slot``; the last position's logits."""
        logits = None
        for i in range(0, len(tokens), PREFILL_CHUNK):
            if cancel.is_set():
                raise Cancelled()
            chunk = tokens[i : i + PREFILL_CHUNK]
            kwargs: dict[str, Any] = {self._cache_arg: slot.cache, "use_cache": True}
            if self._keep_arg:
                kwargs["logits_to_keep"] = 1
            ids = torch.tensor([chunk], dtype=torch.long, device=self.device)
            logits = self.model(input_ids=ids, **kwargs).logits[0, -1]
            slot.ids.extend(chunk)
        if logits is None:
            raise ValueError("nothing to run: the prompt is already in the cache")
        return logits.float()

    @staticmethod
    def _pick(scores: torch.Tensor, temperature: float, generator: Any) -> int:
        if temperature <= 0:
            return int(scores[0].argmax())
        probs = torch.softmax(scores[0], dim=-1)
        return int(torch.multinomial(probs, 1, generator=generator))

    def _decode_text(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)


__all__ = [
    "CachePool",
    "CacheSlot",
    "Cancelled",
    "PresencePenaltyLogitsProcessor",
    "TransformersModel",
    "adapter_base",
    "common_prefix",
    "default_device",
    "default_dtype",
    "from_pretrained",
    "load_pretrained",
    "logits_processors",
]
