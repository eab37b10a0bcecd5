"""verl 0.6.1's vLLM server with the agent loop's per-turn cap (see :mod:`.servers`).

Imported in the trainer process by :func:`.servers.install` and, through the server class it
defines, in every vLLM server process (Ray imports the class's module there), where it makes
the module's ``SamplingParams`` take the cap of the request being served.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

import ray
from verl.workers.rollout.vllm_rollout import vllm_async_server as _server

from drvenus.train.rl.verl_plugin.servers import capped, capped_generate

_CAP: ContextVar[int | None] = ContextVar("drvenus_vllm_turn_cap", default=None)
_SAMPLING_PARAMS = getattr(_server.SamplingParams, "drvenus_original", _server.SamplingParams)


def _sampling_params(*args: Any, **kwargs: Any) -> Any:
    """vLLM's ``SamplingParams``, its ``max_tokens`` capped for the request being served."""
    if "max_tokens" in kwargs:
        kwargs["max_tokens"] = capped(kwargs["max_tokens"], _CAP.get())
    return _SAMPLING_PARAMS(*args, **kwargs)


_sampling_params.drvenus_original = _SAMPLING_PARAMS  # type: ignore[attr-defined]
_server.SamplingParams = _sampling_params  # no cap set: vLLM's own, unchanged

_BASE: Any = getattr(_server.vLLMHttpServer, "__ray_actor_class__", _server.vLLMHttpServerBase)


class CappedVLLMServer(_BASE):  # type: ignore[misc,valid-type]
    """verl's vLLM server; a request's :data:`TURN_CAP` caps its ``max_tokens``."""

    generate = capped_generate(_BASE, _CAP)


CappedVLLMHttpServer = ray.remote(num_cpus=1)(CappedVLLMServer)


def install() -> None:
    """verl's vLLM replicas create our server (``vLLMReplica`` reads the module's class)."""
    _server.vLLMHttpServer = CappedVLLMHttpServer


__all__ = ["CappedVLLMHttpServer", "CappedVLLMServer", "install"]
