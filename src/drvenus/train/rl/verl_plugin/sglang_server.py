"""verl 0.6.1's SGLang server with the agent loop's per-turn cap (see :mod:`.servers`).

Imported in the trainer process by :func:`.servers.install` and, through the server class it
defines, in every SGLang server process, where it makes the module's ``GenerateReqInput`` take
the cap of the request being served (verl's server sets ``max_new_tokens`` to the smaller of
the rollout response length and the rest of the window).
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

import ray
from verl.workers.rollout.sglang_rollout import async_sglang_server as _server

from drvenus.train.rl.verl_plugin.servers import capped, capped_generate

_CAP: ContextVar[int | None] = ContextVar("drvenus_sglang_turn_cap", default=None)
_REQUEST = getattr(_server.GenerateReqInput, "drvenus_original", _server.GenerateReqInput)


def _request(*args: Any, **kwargs: Any) -> Any:
    """SGLang's ``GenerateReqInput``, its ``max_new_tokens`` capped for the request served."""
    params = kwargs.get("sampling_params")
    if isinstance(params, dict) and "max_new_tokens" in params:
        params["max_new_tokens"] = capped(params["max_new_tokens"], _CAP.get())
    return _REQUEST(*args, **kwargs)


_request.drvenus_original = _REQUEST  # type: ignore[attr-defined]
_server.GenerateReqInput = _request  # no cap set: SGLang's own, unchanged

_BASE: Any = getattr(_server.SGLangHttpServer, "__ray_actor_class__", _server.SGLangHttpServer)


class CappedSGLangServer(_BASE):  # type: ignore[misc,valid-type]
    """verl's SGLang server; a request's :data:`TURN_CAP` caps its ``max_new_tokens``."""

    generate = capped_generate(_BASE, _CAP)


CappedSGLangHttpServer = ray.remote(num_cpus=1)(CappedSGLangServer)


def install() -> None:
    """verl's SGLang replicas create our server (``launch_servers`` reads the module's class)."""
    _server.SGLangHttpServer = CappedSGLangHttpServer


__all__ = ["CappedSGLangHttpServer", "CappedSGLangServer", "install"]
