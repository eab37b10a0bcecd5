"""The pinned official files in tests.

Two kinds of test need them:

- most read DR-Venus's inference profile from the fixture checkout of its pinned files
  (tests/fixtures/reference: our own words, laid out like the real ones): ``fixture_store``,
  ``use_fixture_reference``; they always run;
- the exact tests compare drvenus with the real files (DR-Venus's own functions, its texts):
  ``NEEDS_REFERENCE`` / the ``real_reference`` fixture / :func:`real_store`. They find the real
  files, once per session, in the first of: ``DRVENUS_REFERENCE_DIR`` (environment or .env, as
  drvenus reads it; nowhere else when it is set), ``../shared/reference`` beside the project
  (the workplace's copy, which CI points at), the cache ``drvenus reference pull`` fills.
  Where none holds all of DR-Venus's pinned files they skip, saying how to get them; with
  ``DRVENUS_REQUIRE_REFERENCE=1`` (CI) they fail instead. Both variables are read when this
  module is first imported (conftest.py imports it), before any test changes the environment.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from drvenus.reference.dr_venus import INFERENCE_FILES
from drvenus.reference.sources import SOURCES, Source
from drvenus.reference.store import ReferenceStore

REQUIRE_VARIABLE = "DRVENUS_REQUIRE_REFERENCE"
SHARED_REFERENCE = Path(__file__).resolve().parents[3] / "shared" / "reference"
EXACT_SOURCES = ("DR-Venus",)  # the sources the exact tests compare with
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


# ---------------------------------------------------------------- the real files
@dataclass(frozen=True)
class RealReference:
    """Where the real pinned files were found: ``store`` (None: nowhere, ``problem`` says
    what was looked at) and ``where`` (how it was found, for messages)."""

    store: ReferenceStore | None
    where: str = ""
    problem: str = ""


def _complete(store: ReferenceStore, where: str) -> str:
    """"" when ``store`` holds every pinned file of :data:`EXACT_SOURCES` as pinned, else
    what is wrong there, in a few words."""
    states = store.states(list(EXACT_SOURCES))
    missing = sum(s.state == "missing" for s in states)
    other = [f"{s.source}/{s.path}" for s in states if s.state == "mismatch"]
    if not missing and not other:
        return ""
    said = f"{missing} of {len(states)} pinned files missing" if missing else ""
    if other:
        said += (", " if said else "") + f"another version of {', '.join(other[:3])}"
    return f"{where}: {said}"


def locate_real_reference() -> RealReference:
    """The real pinned files, looked for as the module doc says."""
    from drvenus.config import Settings

    try:
        settings = Settings()
    except ValueError as exc:  # a bad DRVENUS_* setting
        return RealReference(None, problem=f"the DRVENUS_* settings cannot be read ({exc})")
    cache = settings.cache_root() / "reference"
    if settings.reference_dir is not None:
        folder = settings.reference_dir.expanduser().resolve()
        candidates = [(f"DRVENUS_REFERENCE_DIR={folder}", folder)]
    else:
        candidates = [(str(SHARED_REFERENCE), SHARED_REFERENCE)]
        if not SHARED_REFERENCE.is_dir():
            candidates = []
        candidates.append((f"the cache {cache}", None))
    problems = []
    for where, folder in candidates:
        store = ReferenceStore(cache_dir=cache, local_dir=folder, download=False)
        problem = _complete(store, where)
        if not problem:
            return RealReference(store, where)
        problems.append(problem)
    return RealReference(None, problem="; ".join(problems))


FOUND = locate_real_reference()
REQUIRED = os.environ.get(REQUIRE_VARIABLE, "") == "1"
HOW = ("run `drvenus reference pull` (DR-Venus's pinned files at their pinned commit, SHA-256 "
       "checked; `--dir DIR` and DRVENUS_REFERENCE_DIR=DIR for a folder of your own)")


def real_store() -> ReferenceStore:
    """The store of the real pinned files (read-only: never downloads, never writes); where
    they cannot be had, the calling test skips, or fails under DRVENUS_REQUIRE_REFERENCE=1."""
    if FOUND.store is None:
        message = (f"needs the real pinned files of {', '.join(EXACT_SOURCES)}: {HOW}; "
                   f"looked at {FOUND.problem}")
        if REQUIRED:
            pytest.fail(f"{REQUIRE_VARIABLE}=1: {message}", pytrace=False)
        pytest.skip(message)
    return FOUND.store


def checkout_folder(store: ReferenceStore, scratch: Path) -> Path:
    """A folder laid out as local checkouts (``<dir>/DR-Venus/...``) holding the files of
    ``store``: its ``local_dir``, or links in ``scratch`` to the cache's folders."""
    if store.local_dir is not None:
        return store.local_dir
    scratch.mkdir(parents=True, exist_ok=True)
    for name in store.sources:
        if store.root(name).is_dir():
            (scratch / name).symlink_to(store.root(name), target_is_directory=True)
    return scratch


# the marker of a test that compares with the real files: the conftest fixture skips (or fails)
# where they cannot be had and points DRVENUS_REFERENCE_DIR at them for the test's runs
NEEDS_REFERENCE = pytest.mark.usefixtures("real_reference")
