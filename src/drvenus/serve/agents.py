"""The agents a server runs: presets of models and tools chosen by the operator, built on use.

The page (and ``/v1``, MCP) may only pick among these presets, set a step limit within a cap
and ask for Heavy mode (``heavy``: N parallel runs, then one answer) within a cap: nobody can
point the server at another model endpoint or URL from a request. From settings
(:func:`pool_from_settings`): the configured model (plus the embedded offline one when another
is configured) and the configured tools (plus the built-in offline corpus when online providers
are configured). Models and toolboxes are built once, on first use, and shared by all runs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from drvenus.agent import AgentConfig, ResearchAgent
from drvenus.llm.base import LLMError
from drvenus.protocol import DRVENUS_TEXTS, ProtocolTexts
from drvenus.serve.server import HEAVY_CAP

if TYPE_CHECKING:
    from drvenus.config import Settings

log = logging.getLogger(__name__)

UNNAMED_MODEL = "the configured model server"  # a model named by its server's address alone
STEP_CAP = 200  # the most steps a request may ask for: DR-Venus's 200 tool calls (the time
# limit still bounds a run); never below a preset's own step limit


@dataclass(frozen=True)
class Preset:
    """One choice: a label for people, and how to build the object (a blocking call)."""

    label: str
    build: Callable[[], Any]
    config: AgentConfig | None = None  # models only: the agent preset that suits the model
    about: str = ""  # one sentence for people: what this choice is and can do


@dataclass(frozen=True)
class Choice:
    """What one run asked for (None: the default)."""

    model: str | None = None
    tools: str | None = None
    max_steps: int | None = None
    heavy: int | None = None  # Heavy mode's runs (1: one run); None: the preset's


def whole_number(value: object, name: str) -> int | None:
    """``value`` (a request field) as an int, None when absent; ValueError naming ``name`` for
    anything else (a bool, a float such as NaN, text)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer")
    return value


class AgentPool:
    """Agents for (model preset, tools preset, step limit); the first preset is the default."""

    def __init__(
        self, models: dict[str, Preset], tools: dict[str, Preset], *, step_cap: int = STEP_CAP,
        heavy_cap: int = HEAVY_CAP,
    ) -> None:
        if not models or not tools:
            raise ValueError("a pool needs at least one model and one tools preset")
        if heavy_cap < 1:
            raise ValueError("heavy_cap must be 1 or more")
        own = [p.config.max_steps for p in models.values() if p.config is not None]
        self.models, self.tools, self.step_cap = models, tools, max([step_cap, *own])
        runs = [p.config.heavy.runs for p in models.values() if p.config is not None]
        self.heavy_cap = max([heavy_cap, *runs])
        self._built: dict[tuple[str, str], Any] = {}
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._agents: dict[tuple[str, str, int, int], ResearchAgent] = {}

    @classmethod
    def fixed(cls, agent: ResearchAgent, label: str = "default", *, heavy_cap: int = HEAVY_CAP
              ) -> AgentPool:
        """A pool of one ready agent (its model and tools); for tests and embedding."""
        return cls(
            {"default": Preset(label, lambda: agent.model, agent.config)},
            {"default": Preset("default", lambda: agent.tools)},
            heavy_cap=heavy_cap,
        )

    @property
    def texts(self) -> tuple[ProtocolTexts, ...]:
        """Whose fixed words this pool's runs use (each model preset's profile), then
        drvenus's (a saved file replayed here): what its views read notices and failure
        frames in."""
        own = [(p.config or AgentConfig()).texts for p in self.models.values()]
        return tuple(dict.fromkeys([*own, DRVENUS_TEXTS]))

    def options(self) -> dict[str, Any]:
        """What a client may choose (for the settings panel and ``/v1/models``)."""
        default = next(iter(self.models.values())).config or AgentConfig()
        return {
            "models": [{"id": k, "label": self._label(k, p), "about": p.about,
                        "max_steps": (p.config or AgentConfig()).max_steps}
                       for k, p in self.models.items()],
            "tools": [{"id": k, "label": p.label} for k, p in self.tools.items()],
            "max_steps": default.max_steps,
            "step_cap": self.step_cap,
            "heavy": default.heavy.runs,
            "heavy_cap": self.heavy_cap,
        }

    def label_of(self, key: str) -> str:
        """How model preset ``key`` is named to people (see :meth:`_label`)."""
        return self._label(key, self.models[key])

    def _label(self, key: str, preset: Preset) -> str:
        """The preset's label, or the name its server reported once it was asked (a model
        configured by its server's address alone)."""
        name = getattr(self._built.get(("model", key)), "model", None)
        return str(name) if preset.label == UNNAMED_MODEL and name else preset.label

    def check(self, choice: Choice) -> Choice:
        """The choice with defaults filled in; ValueError for an unknown preset or step limit."""
        model = choice.model or next(iter(self.models))
        tools = choice.tools or next(iter(self.tools))
        if model not in self.models:
            raise ValueError(f"unknown model preset {model!r}; choose from {list(self.models)}")
        if tools not in self.tools:
            raise ValueError(f"unknown tools preset {tools!r}; choose from {list(self.tools)}")
        steps = choice.max_steps
        if steps is not None and not 1 <= steps <= self.step_cap:
            raise ValueError(f"max_steps must be between 1 and {self.step_cap}")
        heavy = choice.heavy
        if heavy is not None and not 1 <= heavy <= self.heavy_cap:
            raise ValueError(f"heavy must be between 1 and {self.heavy_cap} (runs per research "
                             "on this server)")
        return Choice(model, tools, steps, heavy)

    def prebuild(self) -> None:
        """Build the default model and tools now (a blocking call, before serving: a bad
        model or corpus fails at start, not at the first question)."""
        for kind, presets in (("tools", self.tools), ("model", self.models)):
            key = next(iter(presets))
            if (kind, key) not in self._built:
                self._built[(kind, key)] = presets[key].build()

    async def problem(self, timeout: float = 3.0) -> str | None:
        """Why the default model cannot answer now (its server down), or None: a model behind
        a server is asked for its ``/models``; an in-process one is always there."""
        built = self._built.get(("model", next(iter(self.models))))
        check = getattr(built, "check", None)
        if check is None:
            return None
        try:
            await check(timeout)
        except LLMError as exc:
            return str(exc)
        learn = getattr(built, "context_window", None)  # asks the server its model's name
        if learn is not None:
            await learn()
        return None

    async def _get(self, kind: str, key: str) -> Any:
        slot = (kind, key)
        if slot not in self._built:
            lock = self._locks.setdefault(slot, asyncio.Lock())
            async with lock:
                if slot not in self._built:
                    presets = self.models if kind == "model" else self.tools
                    log.info("building %s preset %s", kind, key)
                    self._built[slot] = await asyncio.to_thread(presets[key].build)
        return self._built[slot]

    async def toolbox(self, tools: str | None = None) -> Any:
        """The toolbox of a tools preset (built on first use)."""
        return await self._get("tools", self.check(Choice(tools=tools)).tools or "")

    async def agent(self, choice: Choice) -> ResearchAgent:
        """The agent for ``choice`` (checked; models and tools built on first use)."""
        choice = self.check(choice)
        assert choice.model is not None and choice.tools is not None
        config = self.models[choice.model].config or AgentConfig()
        steps = choice.max_steps or config.max_steps
        heavy = replace(config.heavy, runs=choice.heavy or config.heavy.runs)
        key = (choice.model, choice.tools, steps, heavy.runs)
        if key not in self._agents:
            model = await self._get("model", choice.model)
            tools = await self._get("tools", choice.tools)
            self._agents[key] = ResearchAgent(model, tools,
                                              replace(config, max_steps=steps, heavy=heavy))
        return self._agents[key]

    async def aclose(self) -> None:
        """Close every model and toolbox that was built."""
        for (kind, key), obj in list(self._built.items()):
            close = getattr(obj, "aclose", None)
            if close is None:
                continue
            try:
                await close()
            except Exception:  # closing is best effort
                log.exception("closing %s preset %s failed", kind, key)
        self._built.clear()
        self._agents.clear()


def model_label(settings: Settings) -> str:
    """A readable name for the model the settings select (never a URL or a key)."""
    from drvenus.stack import is_embedded

    adapter = f" + {settings.adapter.name}" if settings.adapter and not settings.no_adapter else ""
    if is_embedded(settings):
        return f"embedded SmolLM2-135M{adapter} (offline)"
    if settings.model_path is not None:
        return settings.model_path.name + adapter
    return settings.model_name or UNNAMED_MODEL


EMBEDDED_ABOUT = (
    "The embedded model: SmolLM2-135M with drvenus's trained adapter, offline on this machine. "
    "A 135M demonstration of the recipe, not a research agent: it answers about half of "
    "simple one-fact questions about the built-in Wikipedia summaries, and rarely follows up "
    "with a second search or a page visit. For research, serve a real model (--base-url)."
)


def model_about(settings: Settings) -> str:
    """What the model the settings select can do, in a sentence (the web demo shows it)."""
    from drvenus.stack import is_embedded

    if not is_embedded(settings):
        return ""
    if settings.no_adapter:
        return ("The embedded model SmolLM2-135M without its adapter, offline: it shows the "
                "machinery, and is rarely right.")
    return EMBEDDED_ABOUT


def tools_label(settings: Settings) -> str:
    if settings.tools_url:
        return "tool server"
    search, visit = settings.search_providers(), settings.visit_readers()
    if search == ["local"] and visit == ["local"]:
        return "offline corpus" if settings.corpus is None else "local corpus"
    return f"search: {', '.join(search)} · visit: {', '.join(visit)}"


def pool_from_settings(
    settings: Settings,
    *,
    system_prompt_file: str | None = None,
    parallel: int = 1,
    heavy_cap: int = HEAVY_CAP,
    notify: Callable[[str], None] | None = None,
) -> AgentPool:
    """The configured model and tools, plus the offline ones as a second choice. ``parallel``
    runs at once, each of the settings' Heavy runs (a local GGUF gets that many slots; a
    request asking for more runs shares them); ``heavy_cap``: the most runs a request may ask
    for."""
    from drvenus.stack import agent_config, build_model, build_toolbox, is_embedded

    def model_preset(s: Settings) -> Preset:
        config = agent_config(s, system_prompt_file)
        slots = parallel * config.heavy.runs
        return Preset(
            model_label(s),
            lambda: build_model(s, parallel=slots, notify=notify),
            config,
            model_about(s),
        )

    def tools_preset(s: Settings) -> Preset:
        return Preset(tools_label(s), lambda: build_toolbox(s))

    models = {"default": model_preset(settings)}
    if not is_embedded(settings):
        # the offline choice: the embedded model with its own (shipped) adapter, if any
        offline = settings.model_copy(
            update={"base_url": None, "model_path": None, "adapter": None}
        )
        models["embedded"] = model_preset(offline)
    tools = {"default": tools_preset(settings)}
    if settings.tools_url or settings.search_providers() != ["local"] or settings.corpus:
        offline = settings.model_copy(
            update={"search": "local", "visit": None, "tools_url": None, "corpus": None}
        )
        tools["offline"] = tools_preset(offline)
    return AgentPool(models, tools, heavy_cap=heavy_cap)


__all__ = ["HEAVY_CAP", "AgentPool", "Choice", "Preset", "model_about", "model_label",
           "pool_from_settings", "tools_label", "whole_number"]
