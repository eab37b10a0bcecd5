"""A GGUF model run in-process with llama.cpp (llama-cpp-python).

The prompt is rendered with the chat template stored in the GGUF (``tokenizer.chat_template``),
so a DR-Venus GGUF and the embedded SmolLM2 each get their own. One ``Llama`` object is not
re-entrant: generations run one at a time in a worker thread (``asyncio.to_thread``) behind a
lock, so the event loop stays free while many questions wait their turn. When ``constrained``,
sampling follows the protocol grammar (:mod:`drvenus.llm.grammar`) and only well-formed turns
can come out.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
import weakref
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from drvenus.llm.base import Constraint, Generation, LLMError, SamplingParams, grammar_kind
from drvenus.llm.grammar import grammar_for_kind

log = logging.getLogger(__name__)

GGUF_MAGIC = b"GGUF"
DEFAULT_TEMPLATE_KEY = "chat_template.default"
_THINK_OPEN = "<think>\n"


def _import_llama_cpp() -> Any:
    try:
        import llama_cpp
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise LLMError(
            f"llama-cpp-python is not installed ({exc}); `pip install llama-cpp-python`"
        ) from None
    return llama_cpp


def check_gguf_file(path: str | os.PathLike[str]) -> Path:
    """``path`` as a Path if it names a readable GGUF file; else :class:`LLMError`."""
    p = Path(path).expanduser()
    if not p.exists():
        raise LLMError(f"model file not found: {p}")
    if not p.is_file():
        raise LLMError(f"model path is not a file: {p}")
    try:
        with p.open("rb") as f:
            magic = f.read(4)
    except OSError as exc:
        raise LLMError(f"cannot read model file {p}: {exc.strerror or exc}") from None
    if magic != GGUF_MAGIC:
        raise LLMError(f"not a GGUF model file: {p} (starts with {magic!r}, expected b'GGUF')")
    return p


class LlamaCppModel:
    """A :class:`~drvenus.llm.base.ChatModel` backed by an in-process ``llama_cpp.Llama``."""

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        *,
        n_ctx: int = 8192,
        n_threads: int | None = None,
        n_batch: int = 512,
        seed: int = 0,
        constrained_default: bool = True,
        chat_format: str | None = None,
        prefilled_think: bool | None = None,
        grammar: str | None = None,
        grammar_options: Mapping[str, Any] | None = None,
        param_overrides: Mapping[str, Any] | None = None,
        name: str | None = None,
    ) -> None:
        """Load ``model_path`` (a GGUF file).

        ``chat_format``: None uses the GGUF's own chat template (llama-cpp-python's built-in
        format only when the file has none); any llama-cpp-python format name overrides it.
        ``prefilled_think``: whether the template opens the assistant turn with ``<think>\\n``;
        None detects it by rendering the template. ``grammar``: a GBNF grammar replacing the
        protocol one; ``grammar_options``: keyword arguments for
        :func:`~drvenus.llm.grammar.protocol_grammar` (length bounds, allowed kinds).
        ``param_overrides``: :class:`SamplingParams` fields forced on every call (the embedded
        tiny model uses a lower temperature). ``seed``: the default sampling seed when the
        params carry none. ``n_threads``: None uses every core this process may run on.
        """
        path = check_gguf_file(model_path)
        llama_cpp = _import_llama_cpp()
        self.model_path = path
        self.name = name or path.name
        self.constrained_default = constrained_default
        self.seed = seed
        self.param_overrides = dict(param_overrides or {})
        unknown = set(self.param_overrides) - set(SamplingParams.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown sampling fields in param_overrides: {sorted(unknown)}")
        # All usable cores by default (measured on 2 idle cores: 2 threads ~40% faster than 1);
        # pass fewer when other work shares the machine, as spinning workers then stall.
        threads = n_threads or max(1, len(os.sched_getaffinity(0)))
        self.n_threads = threads
        start = time.perf_counter()
        try:
            self._llm = llama_cpp.Llama(
                model_path=str(path),
                n_ctx=n_ctx,
                n_threads=threads,
                n_threads_batch=threads,
                n_batch=n_batch,
                seed=seed,
                chat_format=chat_format,
                verbose=False,
            )
        except Exception as exc:  # noqa: BLE001 - llama-cpp-python raises ValueError/others
            reason = " ".join(str(exc).split()) or type(exc).__name__
            raise LLMError(f"cannot load GGUF model {path}: {reason}") from None
        self.load_seconds = time.perf_counter() - start
        if chat_format is None and DEFAULT_TEMPLATE_KEY in self._llm._chat_handlers:
            # Use the GGUF's template verbatim, even where llama-cpp-python would substitute a
            # built-in format it guesses to be equivalent.
            self._llm.chat_format = DEFAULT_TEMPLATE_KEY
        self.chat_format: str = self._llm.chat_format
        self.n_ctx: int = self._llm.n_ctx()
        if prefilled_think is None:
            prefilled_think = self._template_prefills_think()
        self.prefilled_think = prefilled_think
        self._custom_grammar = grammar
        self._grammar_options = dict(grammar_options or {})
        self._llama_grammars: dict[str, Any] = {}
        self.grammar = self.grammar_of("any")
        self._llama_grammar_of("any")  # parse once at load, so a bad grammar fails here
        self._thread_lock = threading.Lock()
        self._loop_locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
            weakref.WeakKeyDictionary()
        )
        self._closed = False
        log.info(
            "loaded %s in %.2fs (n_ctx=%d, chat format %s)",
            path.name,
            self.load_seconds,
            self.n_ctx,
            self.chat_format,
        )

    def __repr__(self) -> str:
        return f"LlamaCppModel({str(self.model_path)!r}, n_ctx={self.n_ctx})"

    # -- ChatModel ---------------------------------------------------------------------------

    def count_tokens(self, text: str) -> int:
        """Exact token count with the model's own tokenizer (no BOS)."""
        if not text:
            return 0
        self._ensure_open()
        return len(self._llm.tokenize(text.encode("utf-8"), add_bos=False, special=True))

    async def generate(
        self,
        messages: list[dict[str, str]],
        params: SamplingParams,
        *,
        constrained: Constraint = None,
    ) -> Generation:
        self._ensure_open()
        kind = grammar_kind(constrained, self.constrained_default)
        if self.param_overrides:
            params = replace(params, **self.param_overrides)
        async with self._loop_lock():
            return await asyncio.to_thread(self._generate_sync, messages, params, kind)

    async def aclose(self) -> None:
        if self._closed:
            return
        async with self._loop_lock():
            await asyncio.to_thread(self._close_sync)

    # -- helpers -----------------------------------------------------------------------------

    def render_prompt(self, messages: list[dict[str, str]]) -> str:
        """The prompt text the GGUF chat template makes of ``messages`` (generation prompt
        included), exactly as :meth:`generate` feeds it to the model."""
        template = self.chat_template
        if template is None:
            raise LLMError(f"chat format {self.chat_format!r} is not a GGUF template")
        llama_cpp = _import_llama_cpp()
        model = self._llm._model

        def token_text(token: int) -> str:
            return model.token_get_text(token) if token != -1 else ""

        formatter = llama_cpp.llama_chat_format.Jinja2ChatFormatter(
            template=template,
            eos_token=token_text(self._llm.token_eos()),
            bos_token=token_text(self._llm.token_bos()),
        )
        return formatter(messages=messages).prompt

    @property
    def chat_template(self) -> str | None:
        """The GGUF chat template in use (None when a built-in llama-cpp-python format is)."""
        if not self.chat_format.startswith("chat_template."):
            return None
        suffix = self.chat_format[len("chat_template.") :]
        key = "tokenizer.chat_template" + ("" if suffix == "default" else "." + suffix)
        return self._llm.metadata.get(key)

    def _template_prefills_think(self) -> bool:
        try:
            prompt = self.render_prompt([{"role": "user", "content": "x"}])
        except Exception:  # noqa: BLE001 - a template we cannot render does not prefill
            return False
        return prompt.rstrip(" ").endswith(_THINK_OPEN) or prompt.endswith("<think>")

    def grammar_of(self, kind: str) -> str:
        """The GBNF grammar for one turn kind; a user-supplied grammar is used for every kind."""
        if self._custom_grammar:
            return self._custom_grammar
        return grammar_for_kind(kind, self.prefilled_think, **self._grammar_options)

    def _llama_grammar_of(self, kind: str) -> Any:
        if kind not in self._llama_grammars:
            text = self.grammar_of(kind)
            self._check_grammar(text)
            llama_cpp = _import_llama_cpp()
            self._llama_grammars[kind] = llama_cpp.LlamaGrammar.from_string(text, verbose=False)
        return self._llama_grammars[kind]

    def _check_grammar(self, grammar: str) -> None:
        """Parse ``grammar`` with llama.cpp once, so a bad one fails here and not mid-run."""
        llama_cpp = _import_llama_cpp()
        vocab = llama_cpp.llama_model_get_vocab(self._llm.model)
        sampler = llama_cpp.llama_sampler_init_grammar(vocab, grammar.encode("utf-8"), b"root")
        if not sampler:
            raise LLMError("llama.cpp rejected the grammar (it does not parse)")
        llama_cpp.llama_sampler_free(sampler)

    def _loop_lock(self) -> asyncio.Lock:
        """An asyncio lock per event loop: waiters queue on the loop, not in worker threads."""
        loop = asyncio.get_running_loop()
        lock = self._loop_locks.get(loop)
        if lock is None:
            lock = self._loop_locks[loop] = asyncio.Lock()
        return lock

    def _ensure_open(self) -> None:
        if self._closed:
            raise LLMError(f"model {self.name} is closed")

    def _close_sync(self) -> None:
        with self._thread_lock:
            if not self._closed:
                self._closed = True
                self._llm.close()

    def _generate_sync(
        self, messages: list[dict[str, str]], params: SamplingParams, kind: str | None
    ) -> Generation:
        with self._thread_lock:
            self._ensure_open()
            start = time.perf_counter()
            try:
                out = self._llm.create_chat_completion(
                    messages=messages,
                    temperature=params.temperature,
                    top_p=params.top_p,
                    top_k=params.top_k,
                    min_p=0.0,
                    presence_penalty=params.presence_penalty,
                    repeat_penalty=1.0,
                    max_tokens=params.max_tokens,
                    stop=list(params.stop),
                    seed=self.seed if params.seed is None else params.seed,
                    grammar=self._llama_grammar_of(kind) if kind else None,
                )
            except ValueError as exc:
                msg = " ".join(str(exc).split())
                if "exceed context window" in msg:
                    raise LLMError(
                        f"prompt too long for {self.name}: {msg} (n_ctx={self.n_ctx})"
                    ) from None
                raise LLMError(f"llama.cpp generation failed for {self.name}: {msg}") from None
            except Exception as exc:  # noqa: BLE001 - surface anything as one line
                msg = " ".join(str(exc).split()) or type(exc).__name__
                raise LLMError(f"llama.cpp generation failed for {self.name}: {msg}") from None
            elapsed = time.perf_counter() - start
        choice = out["choices"][0]
        text = choice["message"].get("content") or ""
        if self.prefilled_think and not text.lstrip().startswith("<think>"):
            text = _THINK_OPEN + text  # the template wrote it into the prompt
        usage = out.get("usage") or {}
        return Generation(
            text=text,
            prompt_tokens=usage.get("prompt_tokens"),
            completion_tokens=usage.get("completion_tokens"),
            finish_reason=choice.get("finish_reason"),
            extra={"model": self.name, "constrained": kind, "seconds": elapsed},
        )


__all__ = ["LlamaCppModel", "check_gguf_file"]
