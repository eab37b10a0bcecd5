"""``drvenus reference pull``: the pinned files fetched from a real HTTP server on 127.0.0.1 laid
out as raw.githubusercontent.com serves them (``--source``), checked, and written whole or not
at all, into the cache or a folder of checkouts (``--dir``); and the exact tests' switch
(helpers.reference): they skip where the real files cannot be had, and fail instead under
``DRVENUS_REQUIRE_REFERENCE=1``.

The served files are copies of the real pinned files (from where helpers.reference finds them:
``../shared/reference`` in the workplace) made at run time, or the fixture checkout
(tests/fixtures/reference) for the cases that need no real file."""

from __future__ import annotations

import functools
import hashlib
import http.server
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from drvenus.cli import app
from drvenus.reference import SOURCES, ReferenceStore
from drvenus.reference.dr_venus import load_dr_venus_texts
from helpers.cli import ROOT, drvenus
from helpers.reference import FIXTURES, NEEDS_REFERENCE, fixture_source, real_store

DR_VENUS = SOURCES["DR-Venus"]
RUN_DEMO = "Inference/run_demo.py"


class FileServer:
    """A real HTTP server on 127.0.0.1 serving the folder ``root`` (GET only), counting the
    requests it answered."""

    def __init__(self, root: Path) -> None:
        self.hits: list[str] = []
        server = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
                server.hits.append(self.path)
                super().do_GET()

            def log_message(self, *args) -> None:
                pass

        handler = functools.partial(Handler, directory=str(root))
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> FileServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def serve_tree(store: ReferenceStore, name: str, into: Path) -> Path:
    """Copies of source ``name``'s pinned files from ``store``, laid out as on
    raw.githubusercontent.com: ``<into>/<owner>/<repo>/<commit>/<path>``; the folder."""
    src = store.source(name)
    for path in src.files:
        target = into / src.repo / src.commit / path
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(store.location(name, path), target)
    return into


def files_under(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file()) if folder.exists() else []


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---------------------------------------------------------------- the real files


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Path:
    """The tree of the real DR-Venus files for a server (module-wide)."""
    return serve_tree(real_store(), "DR-Venus", tmp_path_factory.mktemp("served"))


def _env(tmp_path: Path, **more: str) -> dict[str, str]:
    # DRVENUS_REFERENCE_DIR empty: unset for drvenus (the real_reference fixture sets it)
    return {"DRVENUS_REFERENCE_DIR": "", "DRVENUS_CACHE_DIR": str(tmp_path / "cache"),
            "COLUMNS": "200", **more}


@NEEDS_REFERENCE
def test_pull_into_the_cache_then_runs_need_no_network(served, tmp_path):
    with FileServer(served) as server:
        pulled = drvenus("reference", "pull", "DR-Venus", "--source", server.url,
                         env=_env(tmp_path), timeout=120)
        assert pulled.returncode == 0, pulled.stderr
        assert len(server.hits) == len(DR_VENUS.files)
        again = drvenus("reference", "pull", "DR-Venus", "--source", server.url,
                        env=_env(tmp_path), timeout=120)
        assert again.returncode == 0, again.stderr
        assert len(server.hits) == len(DR_VENUS.files)  # nothing fetched twice
    folder = tmp_path / "cache" / "reference" / f"DR-Venus@{DR_VENUS.commit}"
    assert str(folder) in pulled.stdout.replace("\n", "")  # where the files went
    assert f"{len(DR_VENUS.files)} official files ready" in pulled.stdout
    assert {p.relative_to(folder).as_posix(): sha(p) for p in files_under(folder)} == (
        dict(DR_VENUS.files))
    # the server is gone: drvenus reads the cache, and what it reads is DR-Venus's
    listed = drvenus("reference", "list", "DR-Venus", env=_env(tmp_path), timeout=60)
    assert listed.returncode == 0 and listed.stdout.count(" ok ") == len(DR_VENUS.files)
    cached = ReferenceStore(cache_dir=tmp_path / "cache" / "reference", download=False)
    assert load_dr_venus_texts(cached) == load_dr_venus_texts(real_store())


@NEEDS_REFERENCE
def test_the_exact_tests_find_a_pulled_cache(served, tmp_path, monkeypatch):
    """Away from the workplace (no ../shared/reference, no DRVENUS_REFERENCE_DIR), what
    ``drvenus reference pull`` put in the cache is what the exact tests read."""
    from helpers import reference

    with FileServer(served) as server:
        pulled = drvenus("reference", "pull", "DR-Venus", "--source", server.url,
                         env=_env(tmp_path), timeout=120)
    assert pulled.returncode == 0, pulled.stderr
    monkeypatch.delenv("DRVENUS_REFERENCE_DIR")
    monkeypatch.setenv("DRVENUS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(reference, "SHARED_REFERENCE", tmp_path / "no-shared")
    monkeypatch.chdir(tmp_path)
    found = reference.locate_real_reference()
    assert found.store is not None, found.problem
    assert (found.store.local_dir, found.store.cache_dir) == (None, tmp_path / "cache" / "reference")
    folder = reference.checkout_folder(found.store, tmp_path / "scratch")
    as_checkouts = ReferenceStore(cache_dir=tmp_path / "unused", local_dir=folder, download=False)
    assert {s.state for s in as_checkouts.states(["DR-Venus"])} == {"ok"}

    monkeypatch.setenv("DRVENUS_CACHE_DIR", str(tmp_path / "empty cache"))
    missing = reference.locate_real_reference()
    assert missing.store is None
    assert missing.problem == (f"the cache {tmp_path / 'empty cache' / 'reference'}: "
                               f"12 of 12 pinned files missing")


@NEEDS_REFERENCE
def test_pull_into_a_folder_of_checkouts(served, tmp_path):
    refs = tmp_path / "my refs"
    with FileServer(served) as server:
        pulled = drvenus("reference", "pull", "DR-Venus", "--dir", str(refs),
                         "--source", server.url + "/", env=_env(tmp_path), timeout=120)
    assert pulled.returncode == 0, pulled.stderr
    assert f"DRVENUS_REFERENCE_DIR={refs}" in pulled.stdout.replace("\n", "")
    assert {p.relative_to(refs / "DR-Venus").as_posix(): sha(p) for p in files_under(refs)} == (
        dict(DR_VENUS.files))
    assert not (tmp_path / "cache").exists()  # nothing in the cache
    listed = drvenus("reference", "list", "DR-Venus", timeout=60,
                     env=_env(tmp_path, DRVENUS_REFERENCE_DIR=str(refs)))
    assert listed.returncode == 0 and listed.stdout.count(" ok ") == len(DR_VENUS.files)


@NEEDS_REFERENCE
def test_a_tampered_file_is_refused_and_nothing_is_written(served, tmp_path):
    tree = tmp_path / "tampered"
    shutil.copytree(served, tree)
    tampered = tree / DR_VENUS.repo / DR_VENUS.commit / RUN_DEMO
    tampered.write_bytes(tampered.read_bytes().replace(b"SYSTEM_PROMPT", b"SYSTEM_PR0MPT", 1))
    refs = tmp_path / "refs"
    with FileServer(tree) as server:
        pulled = drvenus("reference", "pull", "DR-Venus", "--dir", str(refs), "--source",
                         server.url, env=_env(tmp_path), timeout=120)
        assert len([h for h in server.hits if h.endswith(RUN_DEMO)]) == 1  # not tried again
    assert pulled.returncode == 2
    assert pulled.stderr.count("\n") == 1 and pulled.stderr.startswith("error: ")
    line = " ".join(pulled.stderr.split())  # rich may wrap nothing, but be sure
    assert f"DR-Venus/{RUN_DEMO}: sha256 {sha(tampered)} where {DR_VENUS.files[RUN_DEMO]}" in line
    assert "nothing of DR-Venus was written" in line
    assert files_under(refs) == []  # not even the files that matched, nor a temporary one


@NEEDS_REFERENCE
def test_no_network_is_exit_1_after_bounded_tries_and_nothing_is_written(tmp_path):
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    start = time.monotonic()
    pulled = drvenus("reference", "pull", "DR-Venus", "--source", f"http://127.0.0.1:{port}",
                     env=_env(tmp_path), timeout=120)
    took = time.monotonic() - start
    assert pulled.returncode == 1, pulled.stderr
    line = " ".join(pulled.stderr.split())
    assert pulled.stderr.count("\n") == 1
    assert f"DR-Venus/{RUN_DEMO}: cannot download http://127.0.0.1:{port}/" in line
    assert "(ConnectError)" in line and "nothing of DR-Venus was written" in line
    assert took < 30  # three tries, 0.5 s and 1 s apart, then a clear end
    assert files_under(tmp_path / "cache") == []


@NEEDS_REFERENCE
def test_a_file_of_another_version_in_the_folder_is_never_overwritten(served, tmp_path):
    refs = tmp_path / "refs"
    mine = refs / "DR-Venus" / RUN_DEMO
    mine.parent.mkdir(parents=True)
    mine.write_text("# my own edit\n")
    with FileServer(served) as server:
        pulled = drvenus("reference", "pull", "DR-Venus", "--dir", str(refs), "--source",
                         server.url, env=_env(tmp_path), timeout=120)
        assert server.hits == []  # refused before any download
    assert pulled.returncode == 2
    assert mine.read_text() == "# my own edit\n" and files_under(refs) == [mine]
    assert "remove it, or check out inclusionAI/DR-Venus at 6013141" in " ".join(
        pulled.stderr.split())


# ---------------------------------------------------------------- the fixture files (always)


def test_pull_with_fixture_pins_in_process(tmp_path, monkeypatch):
    """The same command in process, on the fixture checkout pinned as a source (runs
    everywhere): one source pulled whole, a second one that cannot be had named, exit 1."""
    for name in list(os.environ):
        if name.startswith("DRVENUS_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DRVENUS_CACHE_DIR", str(tmp_path / "cache"))
    src = fixture_source()
    monkeypatch.setitem(SOURCES, "DR-Venus", src)
    fixtures = ReferenceStore(cache_dir=tmp_path / "unused", local_dir=FIXTURES,
                              sources={"DR-Venus": src}, download=False)
    tree = serve_tree(fixtures, "DR-Venus", tmp_path / "served")
    refs = tmp_path / "refs"
    with FileServer(tree) as server:
        done = CliRunner().invoke(app, ["reference", "pull", "DR-Venus", "simple-evals",
                                        "--dir", str(refs), "--source", server.url])
    assert done.exit_code == 1, done.output
    assert {p.relative_to(refs / "DR-Venus").as_posix(): sha(p) for p in files_under(refs)} == (
        dict(src.files))
    assert f"{src.short}: {len(src.files)} files in {refs / 'DR-Venus'}" in done.stdout.replace(
        "\n", "")
    error = " ".join(done.stderr.split())
    assert error.startswith("error: simple-evals/browsecomp_eval.py: cannot download ")
    assert "(HTTP 404)" in error and "nothing of simple-evals was written" in error

    bad = CliRunner().invoke(app, ["reference", "pull", "--source", "ftp://example.com"])
    assert bad.exit_code == 2 and "--source: 'ftp://example.com' is not an http(s) URL" in (
        bad.stderr)
    unknown = CliRunner().invoke(app, ["reference", "pull", "Nope"])
    assert unknown.exit_code == 2 and "no reference source 'Nope'" in unknown.stderr


# ---------------------------------------------------------------- skip, or fail in CI


def _pytest(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """The real-files check of tests/test_reference.py, run by a pytest of its own with the
    real files nowhere (DRVENUS_REFERENCE_DIR at an empty folder)."""
    (tmp_path / "empty").mkdir(exist_ok=True)
    full = {k: v for k, v in os.environ.items() if not k.startswith("DRVENUS_")}
    full.update(PYTHONPATH=str(ROOT / "src"), DRVENUS_REFERENCE_DIR=str(tmp_path / "empty"),
                **env)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp",
         str(tmp_path / f"basetemp{len(env)}"),
         "tests/test_reference.py::test_the_real_files_match_the_pins"],
        capture_output=True, text=True, env=full, cwd=ROOT, timeout=300)


def test_missing_real_files_skip_with_how_to_get_them_or_fail_when_required(tmp_path):
    skipped = _pytest(tmp_path)
    assert skipped.returncode == 0, skipped.stdout + skipped.stderr
    assert "1 skipped" in skipped.stdout and "drvenus reference pull" in skipped.stdout
    failed = _pytest(tmp_path, DRVENUS_REQUIRE_REFERENCE="1")
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "DRVENUS_REQUIRE_REFERENCE=1: needs the real pinned files of DR-Venus" in (
        failed.stdout)
    assert f"DRVENUS_REFERENCE_DIR={tmp_path / 'empty'}: 12 of 12 pinned files missing" in (
        failed.stdout.replace("\n", ""))
    assert "skipped" not in failed.stdout
