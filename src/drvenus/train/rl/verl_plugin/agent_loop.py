"""verl agent loop ``drvenus_agent``: the drvenus research loop, protocol and tools inside verl.

Each sample runs :class:`drvenus.agent.ResearchAgent` on a
:class:`~drvenus.train.rl.recorder.TokenRecorder` whose engine is verl's
``AsyncLLMServerManager`` (token ids in, token ids out, sticky sessions for prefix caching), so
verl trains on exactly the ids the policy sampled; tool responses get response-mask 0. Tools: a
drvenus tool server (``tools_url`` in the agent-loop config, or ``DRVENUS_TOOLS_URL``), else the
local corpus index (``corpus``; built-in when unset). The rollout settings (protocol, turn
limit and its jitter, mode, per-turn cap, context strategy, system prompt) come from the
agent-loop config entry written by the launcher (:mod:`.launch`).

* Each trajectory draws its own turn limit (``max_turns`` +- ``max_turns_jitter``), the forced
  final turn counted in it, as DR-Venus's agent loop does.
* The per-turn cap (``max_response_len``, 8,192) travels as :data:`~.convert.TURN_CAP` in the
  sampling parameters: verl 0.6.1's servers size every request to the rest of the window, and
  our servers (:mod:`.servers`, installed by :mod:`.main`) cap it.
* ``protocol: dr-venus``: the agent loop with DR-Venus's RL hooks
  (:mod:`drvenus.train.rl.environment`), its system prompt, and its completion cut-off over the
  trajectories this agent-loop worker runs at once (as DR-Venus's cut-off counts per worker);
  otherwise the agent loop with inference's hooks and the protocol's system prompt.
* Trace events: on the training steps that keep them (``trace_save_interval``; the step is the
  row's :data:`~.convert.STEP_KEY`), the trajectory's events go back in the extra field
  :data:`~.convert.EXTRA_EVENTS`; the trainer writes them (:mod:`.main`).
"""

from __future__ import annotations

import logging
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    register,
)

from drvenus.llm.base import LLMError, SamplingParams
from drvenus.train.rl.engine import TokenGeneration, sampled_turn
from drvenus.train.rl.environment import CompletionCutoff
from drvenus.train.rl.verl_plugin.convert import (
    EXTRA_EVENTS,
    STEP_KEY,
    agent_loop_fields,
    agent_rollout,
    question_of,
    server_sampling,
    traces_step,
)
from drvenus.train.templates import end_of_turn_ids

log = logging.getLogger(__name__)
AGENT_NAME = "drvenus_agent"


class VerlServerEngine:
    """A :class:`~drvenus.train.rl.engine.TokenEngine` over verl's server manager."""

    def __init__(self, server_manager: Any, tokenizer: Any, window: int, request_id: str) -> None:
        self.server_manager = server_manager
        self.tokenizer = tokenizer
        self.name = "verl-rollout"
        self.window = window
        self.request_id = request_id
        self.eos_ids = end_of_turn_ids(tokenizer)

    async def generate_tokens(self, prompt_ids: list[int], params: SamplingParams, *,
                              timeout: float | None = None) -> TokenGeneration:
        if len(prompt_ids) >= self.window:
            raise LLMError("the trajectory fills the context window", context_overflow=True)
        out = await self.server_manager.generate(self.request_id, prompt_ids=list(prompt_ids),
                                                 sampling_params=server_sampling(params))
        ids, text = sampled_turn([int(t) for t in out.token_ids], self.tokenizer, self.eos_ids,
                                 params.stop)
        return TokenGeneration(ids, text, "stop", len(prompt_ids))

    async def context_window(self) -> int | None:
        return self.window

    async def aclose(self) -> None:
        return None


@register(AGENT_NAME)
class DrVenusAgentLoop(AgentLoopBase):
    """See the module doc. Agent-loop config keys: ``tools_url``, ``corpus``,
    ``reference_dir`` and those of :data:`~.convert.AGENT_LOOP_KEYS`."""

    tools: Any = None
    settings: dict[str, Any] = {}
    cutoff: CompletionCutoff | None = None  # this worker's waves of trajectories

    @classmethod
    def init_class(cls, config: Any, tokenizer: Any, processor: Any, **kwargs: Any) -> None:
        if cls._class_initialized:
            return
        cls._class_initialized = True
        cls.settings = dict(kwargs)
        import os

        from drvenus.config import load_settings
        from drvenus.stack import build_toolbox

        if kwargs.get("reference_dir"):  # where this worker reads DR-Venus's pinned files
            os.environ.setdefault("DRVENUS_REFERENCE_DIR", str(kwargs["reference_dir"]))

        settings = load_settings(tools_url=kwargs.get("tools_url"), corpus=kwargs.get("corpus"))
        cls.tools = build_toolbox(settings)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        from drvenus.train.rl.collect import run_rollout

        rollout = self.config.actor_rollout_ref.rollout
        cfg = agent_rollout(
            self.settings, max_model_len=int(rollout.max_model_len),
            temperature=float(sampling_params.get("temperature", rollout.temperature)),
            top_p=float(sampling_params.get("top_p", rollout.top_p)),
            top_k=rollout.get("top_k"),
        )
        engine = VerlServerEngine(self.server_manager, self.tokenizer,
                                  int(rollout.max_model_len), uuid4().hex)
        limit = cfg.turn_limit(0)  # unseeded: a fresh draw per trajectory
        question = question_of(kwargs.get("raw_prompt"))
        events: list[dict[str, Any]] = []
        on_event = (lambda e: events.append(e.to_dict())) \
            if traces_step(self.settings, kwargs.get(STEP_KEY)) else None
        cls = type(self)
        if cls.cutoff is None:
            cls.cutoff = cfg.completion_cutoff()
        raw = kwargs.get("raw_prompt")  # the row's own messages, as DR-Venus keeps them
        cls.cutoff.start()
        try:
            recorder, result = await run_rollout(
                cfg, engine, self.tools, question, max_turns=limit, cutoff=cls.cutoff,
                prompt=None if isinstance(raw, str) else raw, on_event=on_event)
        finally:
            cls.cutoff.finish()
        record = recorder.record(result.messages)
        if record is None:
            raise RuntimeError(f"the rollout produced no turn: {result.error}")
        fields = agent_loop_fields(record)
        fields["extra_fields"]["drvenus_termination"] = result.termination
        if "cutoff" in result.extra:
            fields["extra_fields"]["drvenus_cutoff"] = bool(result.extra["cutoff"])
        if on_event is not None:
            fields["extra_fields"][EXTRA_EVENTS] = events
        return AgentLoopOutput(metrics=AgentLoopMetrics(), **fields)


__all__ = ["AGENT_NAME", "DrVenusAgentLoop", "VerlServerEngine"]
