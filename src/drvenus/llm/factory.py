"""Pick and build the model backend from a few settings.

- ``base_url``: a model server (vLLM, SGLang, llama-server, Ollama) over HTTP
- ``model_path``: a GGUF file run in this process by llama.cpp, or a Hugging Face checkpoint
  folder (``config.json``, or a LoRA adapter's ``adapter_config.json``) run by transformers
  (:class:`~drvenus.llm.hf.TransformersModel`; needs the ``train`` extra)
- neither: the embedded SmolLM2 GGUF, in process

A GGUF run in process (the embedded one or ``model_path``) can carry a LoRA ``adapter`` (a
llama.cpp adapter GGUF); which one, if any, the settings resolve in :mod:`drvenus.stack`.

The GGUF and HTTP backends are :class:`~drvenus.llm.openai_compat.OpenAICompatModel` s; only the
transport differs. Whether to decode under the protocol grammar is the agent's setting
(``AgentConfig.constrained``, resolved in :mod:`drvenus.stack`), asked per call.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from drvenus.llm.base import ChatModel, GrammarBuilder, LLMError
from drvenus.llm.openai_compat import OpenAICompatModel
from drvenus.net import DEFAULT_REQUEST_TIMEOUT


def is_checkpoint_dir(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a Hugging Face checkpoint folder (or a peft adapter folder)."""
    p = Path(path)
    return p.is_dir() and ((p / "config.json").is_file() or (p / "adapter_config.json").is_file())


def transformers_model(path: str | os.PathLike[str], **kwargs: Any) -> ChatModel:
    """A :class:`~drvenus.llm.hf.TransformersModel`, or a clear error without torch."""
    try:
        from drvenus.llm.hf import TransformersModel
    except ImportError as exc:
        raise LLMError(
            f"{path} is a Hugging Face checkpoint, which needs torch and transformers ({exc}): "
            "pip install 'drvenus[train]' (or export it to GGUF)"
        ) from None
    return TransformersModel(path, **kwargs)


def check_kv_cache(kv_cache: str | None, model_path: str | os.PathLike[str] | None,
                   base_url: str | None) -> None:
    """:class:`LLMError` when a KV cache type is asked of a model that is not a GGUF run in
    process (a cheap check, before anything is built)."""
    if kv_cache is not None and (base_url is not None or (
            model_path is not None and is_checkpoint_dir(model_path))):
        raise LLMError(
            "--kv-cache applies to a GGUF model run in process; a server sets its own "
            "(llama-server: -ctk q8_0 -ctv q8_0; vLLM: --kv-cache-dtype fp8)"
        )


def make_model(
    *,
    model_path: str | os.PathLike[str] | None = None,
    base_url: str | None = None,
    model_name: str | None = None,
    api_key: str | None = None,
    window: int | None = None,
    parallel: int = 1,
    n_threads: int | None = None,
    timeout: float = DEFAULT_REQUEST_TIMEOUT,
    models_dir: Path | None = None,
    notify: Callable[[str], None] | None = None,
    adapter: str | os.PathLike[str] | None = None,
    kv_cache: str | None = None,
    grammar_builder: GrammarBuilder | None = None,
) -> ChatModel:
    """Build the backend the arguments select (see the module docstring).

    ``window``: tokens of context per conversation for a GGUF (None: its trained length, capped
    to memory; the embedded model uses 8192). ``parallel``: conversations a GGUF serves at once
    (one slot each, one copy of the weights). ``model_name``: the served model name (HTTP; None
    takes the server's first) or a display name (GGUF, checkpoint). ``models_dir``: where the
    embedded model is cached (pulled on first use). A checkpoint takes ``window`` (None: its
    config's), ``parallel`` (how many conversations keep their KV caches), ``model_name`` and
    ``timeout``; nothing else. ``adapter``: a LoRA adapter GGUF applied to a GGUF model (the
    embedded one or ``model_path``); :class:`LLMError` with a server or a checkpoint folder.
    ``kv_cache``: the KV cache type of a GGUF model (f16, q8_0, q4_0); the same error elsewhere.
    ``grammar_builder``: builds each constrained turn's grammar (the small agent's, chosen in
    :mod:`drvenus.stack`); None: the plain protocol grammar.
    """
    if model_path is not None and base_url is not None:
        raise ValueError(
            "give either model_path (a GGUF file or checkpoint folder) or base_url (a server), "
            "not both"
        )
    if adapter is not None and (base_url is not None or (
            model_path is not None and is_checkpoint_dir(model_path))):
        where = "a model server" if base_url is not None else "a checkpoint folder"
        raise LLMError(
            f"an adapter GGUF applies to a GGUF model run in process, not to {where} "
            "(load a peft adapter folder with --model instead)"
        )
    check_kv_cache(kv_cache, model_path, base_url)
    if base_url is not None:
        return OpenAICompatModel(base_url, model_name, api_key, timeout=timeout,
                                 grammar_builder=grammar_builder)

    from drvenus.llm import embedded
    from drvenus.llm.llamacpp import llamacpp_model

    if model_path is not None and is_checkpoint_dir(model_path):
        return transformers_model(
            model_path, name=model_name, window=window, slots=parallel, timeout=timeout
        )
    if model_path is not None:
        return llamacpp_model(
            model_path,
            name=model_name,
            window=window,
            parallel=parallel,
            n_threads=n_threads,
            timeout=timeout,
            adapter=adapter,
            kv_cache=kv_cache,
            grammar_builder=grammar_builder,
        )
    if models_dir is None:
        raise ValueError("the embedded model needs a models_dir to cache it in")
    path = embedded.embedded_model_path(models_dir, notify=notify)
    return llamacpp_model(
        path,
        name=model_name or embedded.EMBEDDED_NAME,
        window=window or embedded.EMBEDDED_WINDOW,
        parallel=parallel,
        n_threads=n_threads,
        grammar_builder=grammar_builder,
        timeout=timeout,
        adapter=adapter,
        kv_cache=kv_cache,
    )


__all__ = ["check_kv_cache", "is_checkpoint_dir", "make_model", "transformers_model"]
