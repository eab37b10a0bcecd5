"""Assemble a ready agent (model + tools + budgets) from :class:`drvenus.config.Settings`.

The CLI, batch runs, evaluation and the servers all build their agent here, so a flag means the
same thing everywhere. Two presets: the embedded tiny model (SmolLM2-135M, grammar on, a few
steps, a small context: :mod:`drvenus.small.preset`, which also says when it applies) and real
models such as DR-Venus-4B (DR-Venus inference defaults). The
assembled :class:`Stack` owns everything it opened and closes it.

``settings.protocol`` names the profile (:func:`drvenus.reference.profiles.profile`) whose words
the agent and its tools use: ``drvenus`` (ours), or ``dr-venus``: DR-Venus's system prompt,
notices, visit failure texts, agent sampling and page extractor (prompt, sampling, no
fallback), read from its pinned files (:mod:`drvenus.reference.dr_venus`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from drvenus.agent import AgentConfig, ResearchAgent
from drvenus.config import Settings
from drvenus.llm.base import ChatModel, SamplingParams
from drvenus.protocol import ProtocolTexts, load_system_prompt
from drvenus.reference.profiles import profile
from drvenus.small import preset
from drvenus.small.heavy import evidence_scorer
from drvenus.small.preset import is_embedded

log = logging.getLogger(__name__)

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


def adapter_file(settings: Settings) -> Path | None:
    """The LoRA adapter GGUF to apply to the model the settings select: ``adapter``, else the
    embedded model's shipped one (:data:`~drvenus.llm.embedded.EMBEDDED_ADAPTER`) when the model
    is the embedded one; None with ``no_adapter``."""
    if settings.no_adapter:
        if settings.adapter is not None:
            raise ValueError("give --adapter or --no-adapter, not both")
        return None
    if settings.adapter is not None:
        return settings.adapter.expanduser()
    if is_embedded(settings):
        from drvenus.llm.embedded import embedded_adapter_path

        return embedded_adapter_path()
    return None


# ---------------------------------------------------------------- the protocol profile
def protocol_texts(settings: Settings) -> ProtocolTexts:
    """The words of the agent loop and the visit tool for ``settings.protocol``."""
    return profile(settings.protocol).texts(settings)


def sampling_from(values: Mapping[str, Any], base: SamplingParams) -> SamplingParams:
    """``base`` with the sampling keywords of an official chat call on top."""
    changes = {k: tuple(v) if k == "stop" else v for k, v in values.items()}
    return replace(base, **changes)


# what an official client sends when it sets only some keywords: nothing else
UNSET_SAMPLING = SamplingParams(
    temperature=1.0, top_p=None, top_k=None, presence_penalty=None, max_tokens=None, stop=()
)

_ANNOUNCED: set[str] = set()


def protocol_note(settings: Settings, system_prompt_file: str | None = None) -> str | None:
    """One short line on the prompt a run uses, for a model other than the embedded one (whose
    training prompt is ours) when the user has not named a prompt file; None otherwise."""
    if system_prompt_file:
        return None
    note = profile(settings.protocol).note(settings)
    if note is not None:
        return note
    if is_embedded(settings):
        return None
    return ("prompt: drvenus's own wording; DR-Venus's exact one: --protocol dr-venus "
            "(drvenus reference pull)")


def announce_protocol(
    settings: Settings, system_prompt_file: str | None = None,
    notify: Callable[[str], None] | None = None,
) -> None:
    """Say :func:`protocol_note` once per process: DR-Venus's texts (a choice the user made)
    through ``notify``; our own wording, the default, only in the log (``-v``)."""
    note = protocol_note(settings, system_prompt_file)
    if note is not None:
        chosen = profile(settings.protocol).chosen and notify is not None
        _once(note, notify if chosen and notify is not None else log.info)


def _once(message: str, say: Callable[[str], object]) -> None:
    if message not in _ANNOUNCED:
        _ANNOUNCED.add(message)
        say(message)


def agent_config(settings: Settings, system_prompt_file: str | None = None) -> AgentConfig:
    """The preset for the model the settings select, with the settings' budgets on top (and,
    with ``protocol`` dr-venus, DR-Venus's texts, and its sampling for a real model)."""
    cfg = preset.EMBEDDED_AGENT if is_embedded(settings) else FULL_AGENT
    chosen = profile(settings.protocol)
    changes: dict[str, object] = {
        "texts": chosen.texts(settings), "reader": chosen.reader(),
        "retry_every_model_error": chosen.retry_every_model_error,
        "blank_ends_run": chosen.blank_ends_run, "compaction_recap": chosen.compaction_recap}
    if not is_embedded(settings):  # the embedded preset's greedy short turns stay
        changes["sampling"] = sampling_from(chosen.agent_sampling(settings), cfg.sampling)
        if chosen.time_limit is not None:
            changes["time_limit"] = chosen.time_limit
    if settings.max_attempts is not None:
        changes["max_attempts"] = settings.max_attempts
    if settings.max_steps is not None:
        changes["max_steps"] = settings.max_steps
    if settings.max_context is not None:
        changes["max_context_tokens"] = settings.max_context
    if settings.time_limit is not None:
        changes["time_limit"] = settings.time_limit
    if settings.context_strategy is not None or settings.keep_last is not None:
        changes["context"] = replace(
            cfg.context,
            **{k: v for k, v in (("strategy", settings.context_strategy),
                                  ("keep_last", settings.keep_last)) if v is not None},
        )
    if settings.heavy is not None or settings.heavy_mode is not None:
        changes["heavy"] = replace(
            cfg.heavy,
            **{k: v for k, v in (("runs", settings.heavy), ("mode", settings.heavy_mode))
               if v is not None},
        )
    if is_embedded(settings):  # Heavy mode's vote breaks a tie with the small agent's reader
        heavy = changes.get("heavy", cfg.heavy)
        changes["heavy"] = replace(heavy, scorer=evidence_scorer(preset.embedded_levers(settings)))
    if settings.constrained is not None:  # else the preset's: on for the embedded model only
        changes["constrained"] = settings.constrained
    if system_prompt_file:
        changes["system_prompt"] = load_system_prompt(system_prompt_file)
    return replace(cfg, **changes)


def run_settings(config: AgentConfig, settings: Settings) -> dict[str, Any]:
    """The agent settings a result depends on beyond the model and the data (``eval.json``
    records them): budgets, the context strategy, Heavy mode, the KV cache type."""
    return {
        "max_steps": config.max_steps,
        "max_context_tokens": config.max_context_tokens,
        "context_strategy": config.context.strategy,
        "keep_last": config.context.keep_last,
        "heavy": config.heavy.runs,
        "heavy_mode": config.heavy.mode,
        "kv_cache": settings.kv_cache or "f16",
    }


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
        adapter=adapter_file(settings),
        kv_cache=settings.kv_cache,
        grammar_builder=preset.grammar_builder(settings),
    )


def build_extractor(settings: Settings):
    """The page extractor: the configured LLM (falling back to the offline extractive method
    when it fails), else the offline method alone."""
    from drvenus.tools.extract import ExtractiveExtractor, LLMExtractor

    if not (settings.extractor_base_url and settings.extractor_model):
        warning = profile(settings.protocol).no_extractor_warning()
        if warning is not None:
            _once(warning, log.warning)
        return ExtractiveExtractor()
    from drvenus.llm.openai_compat import OpenAICompatModel

    model = OpenAICompatModel(
        settings.extractor_base_url,
        settings.extractor_model,
        settings.extractor_api_key_value(),  # its own key, never the agent model's
        timeout=settings.request_timeout,
    )  # one attempt per call: LLMExtractor owns the retries
    own = profile(settings.protocol).extractor(settings)
    if own is not None:  # the profile's prompt and sampling; a failure is its frame
        prompt, sampling = own
        return LLMExtractor(model, prompt=prompt, params=sampling_from(sampling, UNSET_SAMPLING),
                            fallback=None, repair=False)
    return LLMExtractor(model, fallback=ExtractiveExtractor())


def build_toolbox(settings: Settings, *, progress: bool = False, metrics: Any = None) -> Any:
    """``search`` + ``visit`` as the settings say: a tool server (``tools_url``, checked up and
    taking the token: :class:`~drvenus.tools.remote.ToolServerUnusable`), or providers
    in process (local index, Serper, SearXNG; local pages, direct fetch, Jina Reader) with the
    shared cache, the extractor and the URL policy. ``metrics``: a
    :class:`~drvenus.tools.metrics.Metrics` to report to (the tool server's)."""
    if settings.tools_url:
        from drvenus.tools.remote import RemoteToolbox

        note = profile(settings.protocol).remote_tools_note()
        if note is not None:
            _once(note, log.info)

        remote = RemoteToolbox(settings.tools_url, settings.tools_token_value())
        remote.check()  # a dead server or a wrong token fails here, not in every tool call
        return remote
    from drvenus.corpus import open_index
    from drvenus.tools.cache import ToolCache
    from drvenus.tools.search import Search
    from drvenus.tools.toolbox import Toolbox
    from drvenus.tools.visit import Visit
    from drvenus.tools.web_search import DEFAULT_SERPER_URL, make_search_providers

    search_names, visit_names = settings.search_providers(), settings.visit_readers()
    index = None
    if "local" in search_names or "local" in visit_names:
        index = open_index(settings.corpus, cache_dir=settings.cache_root(), progress=progress,
                           dense=preset.hybrid_search(settings))
    online = [n for n in (*search_names, *visit_names) if n != "local"]
    cache = None
    if online and settings.tool_cache:
        path = settings.cache_root() / "tools.sqlite"
        cache = ToolCache(path, default_ttl=settings.tool_cache_ttl)
    providers = make_search_providers(
        search_names,
        serper_api_key=settings.serper_api_key_value(),
        serper_url=settings.serper_url or DEFAULT_SERPER_URL,
        searxng_url=settings.searxng_url,
        index=index,
    )
    top_k = settings.search_top_k or (
        preset.EMBEDDED_SEARCH_TOP_K if is_embedded(settings) else 10)
    visit = Visit(
        _page_readers(settings, visit_names, index),
        build_extractor(settings),
        max_page_tokens=settings.max_page_tokens,
        cache=cache,
        metrics=metrics,
        texts=protocol_texts(settings),
    )
    chosen = profile(settings.protocol)
    search = Search(providers, top_k, cache=cache, metrics=metrics,
                    render=chosen.search_renderer(), missing=chosen.search_without_query())
    return Toolbox([search, visit])


def _page_readers(settings: Settings, names: list[str], index: Any) -> list[Any]:
    from drvenus.tools.pages import CorpusReader, FetchReader, JinaReader

    readers: list[Any] = []
    policy = settings.address_policy()
    for name in names:
        if name == "local":
            readers.append(CorpusReader(index))
        elif name == "fetch":
            readers.append(FetchReader(policy=policy))
        else:
            kwargs = {"base_url": settings.jina_url} if settings.jina_url else {}
            readers.append(JinaReader(settings.jina_api_keys() or None, policy=policy, **kwargs))
    return readers


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
    from drvenus.llm.factory import check_kv_cache
    from drvenus.tools.toolbox import close_quietly

    check_kv_cache(settings.kv_cache, settings.model_path, settings.base_url)  # fail fast

    tools = build_toolbox(settings, progress=progress)
    try:
        # Heavy mode's runs of one question share the model's slots with the other questions
        preset.ready_reader(settings, notify)  # before the model: a failure leaves nothing open
        model = build_model(settings, parallel=parallel * config.heavy.runs, notify=notify)
    except BaseException:
        close_quietly(tools)
        raise
    log.info("agent ready: model=%s steps=%d", model.name, config.max_steps)
    announce_protocol(settings, system_prompt_file, notify)  # once it works: bad input is 1 line
    return Stack(ResearchAgent(model, tools, config), model, tools)


