"""The per-turn cap on verl's rollout servers (verl 0.6.1).

verl 0.6.1's vLLM server sets every request's ``max_tokens`` to what is left of the window
(``max_model_len - len(prompt)``) and refuses one of its own; its SGLang server caps at the
rollout ``response_length``, which for an agent loop is the whole trajectory. So a turn could
fill the window, where DR-Venus caps each turn at 8,192 new tokens (``MAX_RESPONSE_LEN``; its
patched server takes the caller's ``max_tokens``).

:func:`install` (run by :mod:`.main` in the trainer process) wraps verl's replica loaders: when
verl asks for the ``vllm`` or ``sglang`` replica, its server module is imported as verl imports
it, then its server class is swapped for ours (:mod:`.vllm_server`, :mod:`.sglang_server`): the
same server, whose ``generate`` takes the agent loop's cap (:data:`~.convert.TURN_CAP` in the
sampling parameters) and applies it as the smaller of the two. Only the engine in use is
imported.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from drvenus.train.rl.verl_plugin.convert import TURN_CAP

log = logging.getLogger(__name__)

_MODULES = {"vllm": "drvenus.train.rl.verl_plugin.vllm_server",
            "sglang": "drvenus.train.rl.verl_plugin.sglang_server"}


def _capped(name: str, original: Callable[[], Any]) -> Callable[[], Any]:
    def loader() -> Any:
        replica = original()  # verl's loader imports its server module (its setup included)
        importlib.import_module(_MODULES[name]).install()
        log.info("%s rollout servers cap each turn at the agent loop's max tokens", name)
        return replica

    loader.drvenus_turn_cap = True  # type: ignore[attr-defined]
    return loader


def install() -> None:
    """Cap every turn on verl's vLLM and SGLang servers (idempotent)."""
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    registry = RolloutReplicaRegistry._registry
    for name in _MODULES:
        original = registry.get(name)
        if original is None or getattr(original, "drvenus_turn_cap", False):
            continue
        RolloutReplicaRegistry.register(name, _capped(name, original))


def capped(limit: int | None, cap: Any) -> int | None:
    """The smaller of a server's own token limit and the agent loop's cap (None: no cap)."""
    if cap is None or limit is None:
        return limit
    return max(1, min(int(limit), int(cap)))


def capped_generate(base: type, cap: ContextVar[int | None]) -> Callable[..., Any]:
    """A server's ``generate`` that runs ``base.generate`` with the request's cap set in
    ``cap`` (the cap is popped from the sampling parameters: the engine never sees it)."""
    async def generate(self: Any, prompt_ids: Any, sampling_params: dict[str, Any],
                       request_id: str, image_data: Any = None) -> Any:
        value = sampling_params.pop(TURN_CAP, None)
        token = cap.set(None if value is None else int(value))
        try:
            return await base.generate(self, prompt_ids, sampling_params, request_id, image_data)
        finally:
            cap.reset(token)

    return generate


__all__ = ["capped", "capped_generate", "install"]
