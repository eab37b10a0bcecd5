"""Assemble a ready agent (model + tools + budgets) from :class:`drvenus.config.Settings`.

The CLI, batch runs, evaluation and the servers all build their agent here, so a flag means the
same thing everywhere. Two presets: the embedded tiny model (SmolLM2-135M, grammar on, a few
steps, a small context) and real models such as DR-Venus-4B (DR-Venus inference defaults). The
assembled :class:`Stack` owns everything it opened and closes it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from drvenus.agent import AgentConfig, ResearchAgent
from drvenus.config import Settings
from drvenus.llm.base import ChatModel, SamplingParams
from drvenus.protocol import load_system_prompt

log = logging.getLogger(__name__)

# The embedded model is tiny: a short, grammar-constrained run that finishes well under a minute
# on two CPU cores. Its first tool call must be a search (it would otherwise invent URLs); greedy
# decoding without a presence penalty keeps it copying from what it read (a penalty pushes it
# away from the very words of the answer); two steps then the forced answer, no resampling (the
# grammar already guarantees the format). Chosen with benchmarks/bench_embedded_questions.py.
EMBEDDED_AGENT = AgentConfig(
    max_steps=2,
    max_context_tokens=6500,
    time_limit=110.0,
    max_attempts=1,
    backoff_base=0.0,
    sampling=SamplingParams(
        temperature=0.0, top_p=0.95, top_k=20, presence_penalty=0.0, max_tokens=384, seed=0
    ),
    constrained=True,
    min_searches=1,
)
EMBEDDED_SEARCH_TOP_K = 5

# DR-Venus inference defaults for real models.
FULL_AGENT = AgentConfig()


@dataclass
class Stack:
    """The assembled agent and what it owns (closed by :meth:`aclose`)."""

    agent: ResearchAgent
    model: ChatModel
    tools: Any

    async def aclose(self) -> None:
        try:
            await self.model.aclose()
        finally:
            close = getattr(self.tools, "aclose", None)
            if close is not None:
                await close()


def is_embedded(settings: Settings) -> bool:
    return settings.base_url is None and settings.model_path is None


def agent_config(settings: Settings, system_prompt_file: str | None = None) -> AgentConfig:
    """The preset for the model the settings select, with the settings' budgets on top."""
    cfg = EMBEDDED_AGENT if is_embedded(settings) else FULL_AGENT
    changes: dict[str, object] = {}
    if settings.max_attempts is not None:
        changes["max_attempts"] = settings.max_attempts
    if settings.max_steps is not None:
        changes["max_steps"] = settings.max_steps
    if settings.max_context is not None:
        changes["max_context_tokens"] = settings.max_context
    if settings.time_limit is not None:
        changes["time_limit"] = settings.time_limit
    if settings.constrained is not None:  # else the preset's: on for the embedded model only
        changes["constrained"] = settings.constrained
    if system_prompt_file:
        changes["system_prompt"] = load_system_prompt(system_prompt_file)
    return replace(cfg, **changes)


def build_model(
    settings: Settings, *, parallel: int = 1, notify: Callable[[str], None] | None = None
) -> ChatModel:
    """The chat model the settings name (a server, a GGUF, or the embedded default)."""
    from drvenus.llm.factory import make_model

    return make_model(
        model_path=settings.model_path,
        base_url=settings.base_url,
        model_name=settings.model_name,
        api_key=settings.api_key_value(),
        window=settings.n_ctx,
        parallel=parallel,
        n_threads=settings.n_threads,
        timeout=settings.request_timeout,
        models_dir=settings.models_root(),
        notify=notify,
    )


def build_toolbox(settings: Settings, *, progress: bool = False):
    """``search`` + ``visit`` over the settings' corpus, with the extractor they configure."""
    from drvenus.tools.toolbox import offline_toolbox

    extractor = None
    if settings.extractor_base_url and settings.extractor_model:
        from drvenus.llm.openai_compat import OpenAICompatModel
        from drvenus.tools.extract import LLMExtractor

        extractor = LLMExtractor(
            OpenAICompatModel(
                settings.extractor_base_url,
                settings.extractor_model,
                settings.extractor_api_key_value(),  # its own key, never the agent model's
                timeout=settings.request_timeout,
            )  # one attempt per call: LLMExtractor owns the retries
        )
    top_k = settings.search_top_k or (EMBEDDED_SEARCH_TOP_K if is_embedded(settings) else 10)
    return offline_toolbox(
        settings.corpus, top_k=top_k, extractor=extractor, cache_dir=settings.cache_root(),
        progress=progress,
    )


def build_stack(
    settings: Settings,
    *,
    system_prompt_file: str | None = None,
    progress: bool = False,
    parallel: int = 1,
    notify: Callable[[str], None] | None = None,
) -> Stack:
    """Model, tools and agent for ``settings``; raises LLMError / CorpusError / ValueError.
    ``parallel``: how many questions will run at once (a local GGUF gets that many slots)."""
    config = agent_config(settings, system_prompt_file)
    tools = build_toolbox(settings, progress=progress)
    try:
        model = build_model(settings, parallel=parallel, notify=notify)
    except BaseException:
        _close_quietly(tools)
        raise
    log.info("agent ready: model=%s steps=%d", model.name, config.max_steps)
    return Stack(ResearchAgent(model, tools, config), model, tools)


def _close_quietly(tools: Any) -> None:
    import asyncio

    close = getattr(tools, "aclose", None)
    if close is not None:
        try:
            asyncio.run(close())
        except Exception:  # already failing; closing is best effort
            log.debug("closing the toolbox failed", exc_info=True)
