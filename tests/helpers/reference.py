"""DR-Venus's inference profile on the fixture checkout of its pinned files
(tests/fixtures/reference: our own words, laid out like the real ones), for tests that need
``--protocol dr-venus`` without the real files."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from drvenus.reference.dr_venus import INFERENCE_FILES
from drvenus.reference.sources import SOURCES, Source

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "reference"


def use_fixture_reference(monkeypatch, tmp_path: Path) -> None:
    """The environment of a run reading the fixtures: DRVENUS_REFERENCE_DIR at them, the
    DR-Venus source pinned to their hashes, no stray DRVENUS_* settings or .env."""
    monkeypatch.chdir(tmp_path)
    for name in list(os.environ):
        if name.startswith("DRVENUS_"):
            monkeypatch.delenv(name)
    files = {p: hashlib.sha256((FIXTURES / "DR-Venus" / p).read_bytes()).hexdigest()
             for p in INFERENCE_FILES}
    monkeypatch.setenv("DRVENUS_REFERENCE_DIR", str(FIXTURES))
    monkeypatch.setenv("DRVENUS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setitem(SOURCES, "DR-Venus", Source(
        name="DR-Venus", repo="example/dr-venus-fixture", commit="b" * 40, files=files))
