"""Assemble a ready agent (model + tools + budgets) from :class:`drvenus.config.Settings`.

The CLI, batch runs, evaluation and the servers all build their agent here, so a flag means the
same thing everywhere. Two presets: the embedded tiny model (SmolLM2-135M, grammar on, a few
steps, a small context) and real models such as DR-Venus-4B (DR-Venus inference defaults).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from drvenus.agent import AgentConfig, ResearchAgent
from drvenus.config import Settings
from drvenus.llm.base import ChatModel, SamplingParams
from drvenus.protocol import load_system_prompt

log = logging.getLogger(__name__)

# The embedded model is tiny: a short, grammar-constrained run that finishes in about a minute
# on two CPU cores; its first tool call must be a search (it would otherwise invent URLs).
EMBEDDED_AGENT = AgentConfig(
    max_steps=3,
    max_context_tokens=6500,
    time_limit=110.0,
    max_attempts=3,
    backoff_base=0.0,
    sampling=SamplingParams(
        temperature=0.7, top_p=0.95, top_k=20, presence_penalty=1.1, max_tokens=256, seed=0
    ),
    constrained=True,
    min_searches=1,
)
EMBEDDED_N_CTX = 8192
EMBEDDED_SEARCH_TOP_K = 4

# DR-Venus inference defaults for real models.
FULL_AGENT = AgentConfig()


@dataclass
class Stack:
    agent: ResearchAgent
    model: ChatModel
    embedded: bool

    async def aclose(self) -> None:
        await self.model.aclose()


def _agent_config(
    settings: Settings, embedded: bool, system_prompt_file: str | None
) -> AgentConfig:
    cfg = EMBEDDED_AGENT if embedded else FULL_AGENT
    changes: dict[str, object] = {}
    if settings.max_attempts is not None:
        changes["max_attempts"] = settings.max_attempts
    if settings.max_steps is not None:
        changes["max_steps"] = settings.max_steps
    if settings.max_context is not None:
        changes["max_context_tokens"] = settings.max_context
    if settings.time_limit is not None:
        changes["time_limit"] = settings.time_limit
    if settings.constrained is not None:
        changes["constrained"] = settings.constrained
    if system_prompt_file:
        changes["system_prompt"] = load_system_prompt(system_prompt_file)
    return replace(cfg, **changes)


def build_model(settings: Settings) -> tuple[ChatModel, bool]:
    """The chat model the settings name, and whether it is the embedded default."""
    from drvenus.llm.factory import make_model

    embedded = settings.base_url is None and settings.model_path is None
    if settings.base_url is not None and not settings.model_name:
        raise ValueError("--base-url needs --model-name (the model name the server serves)")
    model = make_model(
        model_path=settings.model_path,
        base_url=settings.base_url,
        model_name=settings.model_name,
        api_key=settings.api_key_value(),
        constrained=settings.constrained,
        n_ctx=settings.n_ctx or (EMBEDDED_N_CTX if embedded else None),
        timeout=settings.request_timeout,
    )
    return model, embedded


def build_toolbox(settings: Settings, *, embedded: bool, progress: bool = False):  # noqa: ANN201
    from drvenus.tools.toolbox import offline_toolbox

    extractor = None
    if settings.extractor_base_url and settings.extractor_model:
        from drvenus.llm.openai_compat import OpenAICompatModel
        from drvenus.tools.extract import LLMExtractor

        key = settings.extractor_api_key.get_secret_value() if settings.extractor_api_key else None
        extractor = LLMExtractor(
            OpenAICompatModel(
                base_url=settings.extractor_base_url, model=settings.extractor_model, api_key=key
            )
        )
    top_k = settings.search_top_k or (EMBEDDED_SEARCH_TOP_K if embedded else 10)
    return offline_toolbox(
        settings.corpus, top_k=top_k, extractor=extractor, cache_dir=settings.cache_dir,
        progress=progress,
    )


def build_stack(
    settings: Settings, *, system_prompt_file: str | None = None, progress: bool = False
) -> Stack:
    """Model, tools and agent for ``settings``; raises LLMError / CorpusError / ValueError."""
    toolbox_embedded = settings.base_url is None and settings.model_path is None
    tools = build_toolbox(settings, embedded=toolbox_embedded, progress=progress)
    model, embedded = build_model(settings)
    config = _agent_config(settings, embedded, system_prompt_file)
    log.info("agent ready: model=%s embedded=%s steps=%d", model.name, embedded, config.max_steps)
    return Stack(ResearchAgent(model, tools, config), model, embedded)
