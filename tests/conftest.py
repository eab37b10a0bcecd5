from __future__ import annotations

from pathlib import Path

import pytest

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data folder not found at {SHARED_DATA} (only present in the dev tree)")
    return SHARED_DATA


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Never let a test write into the real user cache."""
    monkeypatch.setenv("DRVENUS_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "drvenus-cache"))
