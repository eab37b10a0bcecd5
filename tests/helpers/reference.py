"""DR-Venus's inference profile on the fixture checkout of its pinned files
(tests/fixtures/reference: our own words, laid out like the real ones), for tests that need
``--protocol dr-venus`` without the real files."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from drvenus.reference.dr_venus import INFERENCE_FILES
from drvenus.reference.sources import SOURCES, Source
from drvenus.reference.store import ReferenceStore

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "reference"


def fixture_source() -> Source:
    """The DR-Venus source pinned to the fixtures' hashes."""
    files = {p: hashlib.sha256((FIXTURES / "DR-Venus" / p).read_bytes()).hexdigest()
             for p in INFERENCE_FILES}
    return Source(name="DR-Venus", repo="example/dr-venus-fixture", commit="b" * 40,
                  files=files)


def fixture_store(tmp_path: Path) -> ReferenceStore:
    """A store reading the fixtures (no download)."""
    return ReferenceStore(cache_dir=tmp_path / "cache", local_dir=FIXTURES,
                          sources={"DR-Venus": fixture_source()}, download=False)


def use_fixture_reference(monkeypatch, tmp_path: Path) -> None:
    """The environment of a run reading the fixtures: DRVENUS_REFERENCE_DIR at them, the
    DR-Venus source pinned to their hashes, no stray DRVENUS_* settings or .env."""
    monkeypatch.chdir(tmp_path)
    for name in list(os.environ):
        if name.startswith("DRVENUS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("DRVENUS_REFERENCE_DIR", str(FIXTURES))
    monkeypatch.setenv("DRVENUS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setitem(SOURCES, "DR-Venus", fixture_source())
