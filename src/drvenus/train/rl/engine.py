"""Token-in, token-out policy engines for RL rollouts.

A rollout must record the exact token ids the policy saw and sampled, so the engine is given
token ids (never a re-rendered conversation) and returns the sampled ids. Two engines:

* :class:`HFEngine`: the transformers decode loop of :class:`drvenus.llm.hf.TransformersModel`
  over the policy in memory (the one-machine trainer: rollouts sample from the weights being
  trained, so they are exactly on-policy). CPU or one GPU.
* :class:`ServerEngine`: a vLLM or SGLang server. vLLM: ``POST /v1/completions`` with the
  prompt as a list of token ids and ``return_token_ids`` (vLLM >= 0.10.2; older servers answer
  with ``logprobs`` + ``return_tokens_as_token_ids``, which is read as a fallback). SGLang:
  ``POST /generate`` with ``input_ids``; the reply's ``output_ids``. After a weight update the
  trainer can make an SGLang server reload a saved checkpoint
  (:meth:`ServerEngine.reload_weights`, ``/update_weights_from_disk``).

Stop strings: a server stops *after* the tokens that complete a stop string and leaves the
string out of the text. :func:`trim_to_text` cuts such tokens off, so the recorded ids decode to
exactly the turn's text and the turn simply ends without its end-of-turn token.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from drvenus.llm.base import LLMError, SamplingParams
from drvenus.llm.openai_compat import HttpTransport
from drvenus.net import DEFAULT_REQUEST_TIMEOUT, redact_url, server_root
from drvenus.train.templates import end_of_turn_ids

log = logging.getLogger(__name__)


@dataclass
class TokenGeneration:
    """One sampled turn: ``token_ids`` as sampled (an end-of-turn token included when the
    model produced one), ``text`` without stop strings and end-of-turn tokens."""

    token_ids: list[int]
    text: str
    finish_reason: str | None = None
    prompt_tokens: int = 0
    cached_tokens: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class TokenEngine(Protocol):
    """What a rollout needs from the policy's server."""

    name: str
    tokenizer: Any

    async def generate_tokens(
        self, prompt_ids: list[int], params: SamplingParams, *, timeout: float | None = None
    ) -> TokenGeneration:
        """Sample one turn after ``prompt_ids``; :class:`LLMError` on failure."""
        ...

    async def context_window(self) -> int | None: ...

    async def aclose(self) -> None: ...


def trim_to_text(token_ids: Sequence[int], text: str, tokenizer: Any, eos_ids: frozenset[int]
                 ) -> list[int]:
    """``token_ids`` cut so that they decode to ``text`` (plus a final end-of-turn token when
    the model sampled one): tokens past the text (a stop string's) are dropped. When no prefix
    decodes to exactly ``text`` (a stop string began inside a token) the longest prefix whose
    text is a prefix of ``text`` is kept."""
    ids = list(token_ids)
    if ids and ids[-1] in eos_ids:
        return ids  # stopped by the model: nothing after the text
    decode = lambda xs: tokenizer.decode(xs, skip_special_tokens=False)  # noqa: E731
    k = len(ids)
    while k > 0:
        got = decode(ids[:k])
        if len(got) <= len(text) and text.startswith(got):
            break
        k -= 1
    return ids[:k]


def sampled_turn(raw: Sequence[int], tokenizer: Any, eos_ids: frozenset[int],
                 stops: Sequence[str]) -> tuple[list[int], str]:
    """(ids, text) of a sampled turn: the text without end-of-turn tokens, cut at the first stop
    string, and the ids trimmed to it (:func:`trim_to_text`)."""
    text = tokenizer.decode([t for t in raw if t not in eos_ids], skip_special_tokens=False)
    cuts = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    if cuts:
        text = text[: min(cuts)]
    return trim_to_text(raw, text, tokenizer, eos_ids), text


class HFEngine:
    """Rollouts from a :class:`~drvenus.llm.hf.TransformersModel` (token ids in and out)."""

    def __init__(self, model: Any) -> None:
        self.model = model  # a TransformersModel
        self.tokenizer = model.tokenizer
        self.name = model.name
        self.eos_ids = frozenset(model.eos_ids)

    @classmethod
    def from_policy(cls, policy: Any, tokenizer: Any, *, slots: int = 8,
                    window: int | None = None) -> HFEngine:
        from drvenus.llm.hf import TransformersModel

        return cls(TransformersModel.from_loaded(policy, tokenizer, slots=slots, window=window))

    def _run(self, prompt_ids: list[int], params: SamplingParams,
             cancel: threading.Event) -> TokenGeneration:
        if len(prompt_ids) >= self.model.window:
            raise LLMError(
                f"prompt of {len(prompt_ids)} tokens exceeds the context window "
                f"({self.model.window})", context_overflow=True,
            )
        gen = self.model.generate_ids(prompt_ids, params, cancel)
        ids, text = sampled_turn(list(gen.extra.get("token_ids", [])), self.tokenizer,
                                 self.eos_ids, params.stop)
        return TokenGeneration(
            token_ids=ids, text=text, finish_reason=gen.finish_reason,
            prompt_tokens=len(prompt_ids), cached_tokens=gen.cached_tokens,
        )

    async def generate_tokens(
        self, prompt_ids: list[int], params: SamplingParams, *, timeout: float | None = None
    ) -> TokenGeneration:
        cancel = threading.Event()
        try:
            return await asyncio.wait_for(
                asyncio.to_thread(self._run, list(prompt_ids), params, cancel),
                timeout or self.model.timeout,
            )
        except TimeoutError:
            cancel.set()
            raise LLMError(f"{self.name}: timed out", retryable=True) from None
        except BaseException:
            cancel.set()
            raise

    def clear_cache(self) -> None:
        self.model.clear_cache()

    async def context_window(self) -> int | None:
        return self.model.window

    async def aclose(self) -> None:
        """The policy belongs to the trainer: only the caches are dropped."""
        self.model.clear_cache()


SERVER_FLAVORS = ("vllm", "sglang")


class ServerEngine:
    """Rollouts from a vLLM or SGLang server, token ids in and out (see the module doc)."""

    def __init__(
        self,
        base_url: str,
        tokenizer: Any,
        *,
        flavor: str = "vllm",
        model: str | None = None,
        api_key: str | None = None,
        window: int | None = None,
        timeout: float = DEFAULT_REQUEST_TIMEOUT,
    ) -> None:
        if flavor not in SERVER_FLAVORS:
            raise ValueError(f"unknown server flavor {flavor!r}; expected one of {SERVER_FLAVORS}")
        self.base = server_root(base_url)
        self.tokenizer = tokenizer
        self.flavor = flavor
        self.model = model
        self.where = redact_url(self.base)
        self.name = model or self.where
        self.window = window
        self.timeout = timeout
        self.transport = HttpTransport(base_url, api_key, timeout=timeout)
        self.eos_ids = end_of_turn_ids(tokenizer)

    async def _model_name(self) -> str:
        if self.model is None:
            reply = await self._post_json("GET", "/v1/models", None, 30.0)
            try:
                self.model = str(reply["data"][0]["id"])
            except (KeyError, IndexError, TypeError):
                raise LLMError(f"{self.where}/v1/models lists no model") from None
        return self.model

    async def _post_json(self, method: str, path: str, body: dict | None,
                         timeout: float | None) -> Any:
        """One request to the server's ``path`` (under its root) through the one HTTP
        transport: its errors (retryable or not, context overflow) are every model client's."""
        route = path.removeprefix("/v1") if path.startswith("/v1/") else "/.." + path
        return await self.transport.request(method, route, body, timeout or self.timeout)

    async def generate_tokens(
        self, prompt_ids: list[int], params: SamplingParams, *, timeout: float | None = None
    ) -> TokenGeneration:
        if self.flavor == "sglang":
            return await self._sglang(prompt_ids, params, timeout)
        return await self._vllm(prompt_ids, params, timeout)

    async def _vllm(self, prompt_ids: list[int], params: SamplingParams,
                    timeout: float | None) -> TokenGeneration:
        body: dict[str, Any] = {
            "model": await self._model_name(),
            "prompt": list(prompt_ids),
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k,
            "presence_penalty": params.presence_penalty,
            "stop": list(params.stop),
            "logprobs": 0,
            "return_tokens_as_token_ids": True,
            "return_token_ids": True,
            "skip_special_tokens": False,
        }
        if params.max_tokens is not None:
            body["max_tokens"] = params.max_tokens
        if params.seed is not None:
            body["seed"] = params.seed
        reply = await self._post_json("POST", "/v1/completions", body, timeout)
        try:
            choice = reply["choices"][0]
        except (KeyError, IndexError, TypeError):
            raise LLMError(f"{self.where}: a completion without choices") from None
        ids = choice.get("token_ids")
        if ids is None:
            tokens = ((choice.get("logprobs") or {}).get("tokens")) or []
            ids = [int(t.split(":", 1)[1]) for t in tokens if str(t).startswith("token_id:")]
        if not ids and choice.get("text"):
            raise LLMError(f"{self.where}: the server returned no token ids (vLLM >= 0.10.2 "
                           "returns them with return_token_ids)")
        text = str(choice.get("text") or "")
        usage = reply.get("usage") or {}
        return self._finish(ids, text, choice.get("finish_reason"), len(prompt_ids),
                            (usage.get("prompt_tokens_details") or {}).get("cached_tokens"))

    async def _sglang(self, prompt_ids: list[int], params: SamplingParams,
                      timeout: float | None) -> TokenGeneration:
        sampling: dict[str, Any] = {
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k,
            "presence_penalty": params.presence_penalty,
            "stop": list(params.stop),
            "skip_special_tokens": False,
        }
        if params.max_tokens is not None:
            sampling["max_new_tokens"] = params.max_tokens
        body = {"input_ids": list(prompt_ids), "sampling_params": sampling}
        reply = await self._post_json("POST", "/generate", body, timeout)
        if isinstance(reply, list):
            reply = reply[0] if reply else {}
        ids = reply.get("output_ids")
        if ids is None:
            raise LLMError(f"{self.where}/generate: the reply has no output_ids")
        meta = reply.get("meta_info") or {}
        finish = meta.get("finish_reason")
        if isinstance(finish, dict):
            finish = finish.get("type")
        return self._finish(ids, str(reply.get("text") or ""), finish, len(prompt_ids),
                            meta.get("cached_tokens"))

    def _finish(self, ids: Sequence[Any], text: str, finish: Any, prompt_tokens: int,
                cached: Any) -> TokenGeneration:
        raw = [int(t) for t in ids]
        for stop_eos in self.eos_ids:  # a server's text never holds the end-of-turn token
            text = text.replace(self.tokenizer.convert_ids_to_tokens(stop_eos), "")
        return TokenGeneration(
            token_ids=trim_to_text(raw, text, self.tokenizer, self.eos_ids),
            text=text,
            finish_reason=None if finish is None else str(finish),
            prompt_tokens=prompt_tokens,
            cached_tokens=int(cached) if isinstance(cached, int) else None,
        )

    async def prompt_logprobs(self, ids: list[int]) -> list[float | None]:
        """The log-prob of each token of ``ids`` given the ones before it (None for the first),
        as the server computes it (vLLM ``prompt_logprobs``, SGLang ``input_token_logprobs``;
        before temperature)."""
        if self.flavor == "sglang":
            body = {"input_ids": list(ids), "return_logprob": True, "logprob_start_len": 0,
                    "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}}
            reply = await self._post_json("POST", "/generate", body, None)
            if isinstance(reply, list):
                reply = reply[0] if reply else {}
            rows = (reply.get("meta_info") or {}).get("input_token_logprobs") or []
            out = [None if r is None or r[0] is None else float(r[0]) for r in rows]
        else:
            body = {"model": await self._model_name(), "prompt": list(ids), "max_tokens": 1,
                    "temperature": 0.0, "prompt_logprobs": 0}
            reply = await self._post_json("POST", "/v1/completions", body, None)
            rows = (reply.get("choices") or [{}])[0].get("prompt_logprobs") or []
            out = []
            for tid, row in zip(ids, rows, strict=False):
                entry = (row or {}).get(str(tid)) if isinstance(row, dict) else None
                out.append(None if entry is None else float(entry.get("logprob")))
        if len(out) != len(ids):
            raise LLMError(f"{self.where}: {len(out)} prompt log-probs for {len(ids)} tokens")
        return out

    async def reload_weights(self, checkpoint: str) -> None:
        """Make the server load the weights saved at ``checkpoint`` (SGLang only; a vLLM
        server has no such endpoint and is reloaded by restarting it)."""
        if self.flavor != "sglang":
            raise LLMError("only an SGLang server can reload weights from disk "
                           "(/update_weights_from_disk); restart the vLLM server instead")
        reply = await self._post_json(
            "POST", "/update_weights_from_disk", {"model_path": checkpoint}, None
        )
        if isinstance(reply, dict) and reply.get("success") is False:
            raise LLMError(f"{self.where}: weight reload failed: {reply.get('message')}")

    async def context_window(self) -> int | None:
        return self.window

    async def aclose(self) -> None:
        await self.transport.aclose()


__all__ = [
    "HFEngine",
    "SERVER_FLAVORS",
    "ServerEngine",
    "TokenEngine",
    "TokenGeneration",
    "sampled_turn",
    "trim_to_text",
]
