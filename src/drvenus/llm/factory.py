"""Pick and build the model backend from a few settings.

- ``base_url``: a model server (vLLM, SGLang, llama-server, Ollama) -> :class:`OpenAICompatModel`
- ``model_path``: a GGUF file run in-process -> :class:`LlamaCppModel`
- neither: the embedded SmolLM2 GGUF -> :class:`LlamaCppModel`

Constrained decoding (the protocol grammar) is on by default only for the embedded model: a
DR-Venus checkpoint speaks the protocol by itself, so a server or a user's GGUF runs
unconstrained unless ``constrained=True``.
"""

from __future__ import annotations

import os
from typing import Any

from drvenus.llm.base import ChatModel
from drvenus.llm.embedded import (
    EMBEDDED_GRAMMAR_OPTIONS,
    EMBEDDED_N_CTX,
    EMBEDDED_NAME,
    EMBEDDED_PARAM_OVERRIDES,
    embedded_model_path,
)

DEFAULT_N_CTX = 32768  # for a user GGUF; DR-Venus was trained for far more, RAM is the limit


def make_model(
    *,
    model_path: str | os.PathLike[str] | None = None,
    base_url: str | None = None,
    model_name: str | None = None,
    api_key: str | None = None,
    constrained: bool | None = None,
    n_ctx: int | None = None,
    n_threads: int | None = None,
    seed: int = 0,
    grammar_mode: str | None = None,
    prefilled_think: bool | None = None,
    timeout: float | None = None,
    max_retries: int | None = None,
    extra_body: dict[str, Any] | None = None,
) -> ChatModel:
    """Build the backend the arguments select (see the module docstring).

    ``constrained``: the grammar default (None: on for the embedded model, off otherwise).
    ``grammar_mode`` (HTTP only): how the server takes a grammar; when ``constrained`` is true
    and no mode is given, ``"auto"`` asks the server what it is. ``model_name``: the served
    model name (HTTP; None takes the server's first model) or a display name (GGUF).
    """
    if model_path is not None and base_url is not None:
        raise ValueError("give either model_path (a GGUF file) or base_url (a server), not both")
    if base_url is not None:
        from drvenus.llm.openai_compat import OpenAICompatModel

        use_grammar = bool(constrained)
        mode = grammar_mode or ("auto" if use_grammar else "none")
        http_kw: dict[str, Any] = {}
        if timeout is not None:
            http_kw["timeout"] = timeout
        if max_retries is not None:
            http_kw["max_retries"] = max_retries
        return OpenAICompatModel(
            base_url,
            model_name,
            api_key,
            grammar_mode=mode,
            constrained_default=use_grammar,
            prefilled_think=bool(prefilled_think),
            extra_body=extra_body,
            **http_kw,
        )

    from drvenus.llm.llamacpp import LlamaCppModel

    if model_path is not None:
        return LlamaCppModel(
            model_path,
            n_ctx=n_ctx or DEFAULT_N_CTX,
            n_threads=n_threads,
            seed=seed,
            constrained_default=bool(constrained),
            prefilled_think=prefilled_think,
            name=model_name,
        )
    return LlamaCppModel(
        embedded_model_path(),
        n_ctx=n_ctx or EMBEDDED_N_CTX,
        n_threads=n_threads,
        seed=seed,
        constrained_default=True if constrained is None else constrained,
        prefilled_think=prefilled_think,
        grammar_options=EMBEDDED_GRAMMAR_OPTIONS,
        param_overrides=EMBEDDED_PARAM_OVERRIDES,
        name=model_name or EMBEDDED_NAME,
    )


__all__ = ["DEFAULT_N_CTX", "make_model"]
