"""The pinned official sources: local checkouts, the cache, HTTPS downloads (from a loopback
server), hash checks, and the AST extraction. The files here are of our own wording; the real
ones by test_the_real_files_match_the_pins and tests/test_reference_pull.py (where they can be
had: helpers.reference)."""

from __future__ import annotations

import hashlib
import http.server
import re
import threading
from pathlib import Path

import pytest

from drvenus.reference import SOURCES, ReferenceError, ReferenceStore, Source, extract
from helpers.cli import drvenus
from helpers.reference import NEEDS_REFERENCE, real_store

MODULE = '''"""A demo module laid out like an official one."""
GREETING = "Hello, " "reader."
JOINED = ("one " +
          "two")
TODAY = "2020-01-01"
TEMPLATE = f"Date: {TODAY}. Braces {{kept}}."
LIMITS = {"turns": 3, "cut": 0.5}


def respond(client):
    notice = "You have used every turn."
    client.chat(temperature=0.25, top_p=0.9, model=client.name)
    return notice


class Agent:
    def run(self):
        self.prompt = "Inside a method."
'''


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture()
def demo(tmp_path: Path) -> tuple[Path, Source]:
    root = tmp_path / "checkouts"
    (root / "Demo" / "pkg").mkdir(parents=True)
    data = MODULE.encode()
    (root / "Demo" / "pkg" / "texts.py").write_bytes(data)
    src = Source(name="Demo", repo="someone/demo", commit="a" * 40,
                 files={"pkg/texts.py": _sha(data)})
    return root, src


def test_a_local_checkout_is_read_and_checked(demo, tmp_path: Path):
    root, src = demo
    store = ReferenceStore(cache_dir=tmp_path / "cache", local_dir=root, sources={"Demo": src})
    assert store.read_text("Demo", "pkg/texts.py") == MODULE
    assert [s.state for s in store.states()] == ["ok"]

    (root / "Demo" / "pkg" / "texts.py").write_text(MODULE + "# edited\n")
    assert [s.state for s in store.states()] == ["mismatch"]
    with pytest.raises(ReferenceError) as info:
        store.read_text("Demo", "pkg/texts.py")
    line = str(info.value)
    assert "\n" not in line and line.startswith("Demo/pkg/texts.py: sha256 ")
    assert src.files["pkg/texts.py"] in line and "someone/demo at aaaaaaa" in line


def test_a_missing_file_in_the_checkouts_is_refused_without_going_online(demo, tmp_path: Path):
    root, src = demo
    (root / "Demo" / "pkg" / "texts.py").unlink()
    store = ReferenceStore(cache_dir=tmp_path / "cache", local_dir=root, sources={"Demo": src},
                           url_template="http://127.0.0.1:9/{path}")
    with pytest.raises(ReferenceError, match="not found in DRVENUS_REFERENCE_DIR.*sha256 "):
        store.read_bytes("Demo", "pkg/texts.py")
    with pytest.raises(ReferenceError, match="not a pinned file"):
        store.read_bytes("Demo", "pkg/other.py")
    with pytest.raises(ReferenceError, match="no reference source 'Nope'"):
        store.read_bytes("Nope", "x.py")


class _Files(http.server.BaseHTTPRequestHandler):
    files: dict[str, bytes] = {}
    hits: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
        self.hits.append(self.path)
        body = self.files.get(self.path)
        self.send_response(200 if body is not None else 404)
        self.end_headers()
        self.wfile.write(body or b"not here")

    def log_message(self, *args) -> None:
        pass


@pytest.fixture()
def server():
    _Files.files, _Files.hits = {}, []
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Files)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def test_a_download_is_checked_cached_and_then_offline(demo, tmp_path: Path, server):
    _, src = demo
    port = server.server_address[1]
    template = f"http://127.0.0.1:{port}/{{repo}}/{{commit}}/{{path}}"
    _Files.files[f"/someone/demo/{'a' * 40}/pkg/texts.py"] = MODULE.encode()
    store = ReferenceStore(cache_dir=tmp_path / "cache", url_template=template,
                           sources={"Demo": src})
    assert [s.state for s in store.states()] == ["missing"]
    assert [s.state for s in store.pull()] == ["ok"]
    assert (tmp_path / "cache" / f"Demo@{'a' * 40}" / "pkg" / "texts.py").read_text() == MODULE
    server.shutdown()  # offline from now on: the cache answers
    offline = ReferenceStore(cache_dir=tmp_path / "cache", url_template=template,
                             sources={"Demo": src}, download=False)
    assert offline.read_text("Demo", "pkg/texts.py") == MODULE
    assert len(_Files.hits) == 1


def test_a_wrong_or_absent_download_is_refused_and_nothing_is_kept(demo, tmp_path: Path, server):
    _, src = demo
    port = server.server_address[1]
    template = f"http://127.0.0.1:{port}/{{repo}}/{{commit}}/{{path}}"
    _Files.files[f"/someone/demo/{'a' * 40}/pkg/texts.py"] = b"GREETING = 'another version'\n"
    store = ReferenceStore(cache_dir=tmp_path / "cache", url_template=template,
                           sources={"Demo": src})
    with pytest.raises(ReferenceError, match=r"Demo/pkg/texts.py: sha256 .* where "):
        store.read_bytes("Demo", "pkg/texts.py")
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*.py"))

    _Files.files.clear()
    _Files.hits.clear()
    with pytest.raises(ReferenceError, match=r"cannot download .*\(HTTP 404\)"):
        store.read_bytes("Demo", "pkg/texts.py")
    assert len(_Files.hits) == 1  # a 404 is not retried

    offline = ReferenceStore(cache_dir=tmp_path / "cache", sources={"Demo": src}, download=False)
    with pytest.raises(ReferenceError, match="not in the cache; run `drvenus reference pull`"):
        offline.read_bytes("Demo", "pkg/texts.py")


def test_extraction_parses_literals_without_running_anything():
    assert extract.assigned_string(MODULE, "GREETING") == "Hello, reader."
    assert extract.assigned_string(MODULE, "JOINED") == "one two"
    with pytest.raises(extract.ExtractError, match="no string assigned to TEMPLATE"):
        extract.assigned_string(MODULE, "TEMPLATE")
    template = extract.assigned_string(MODULE, "TEMPLATE", fstrings=True)
    assert template == "Date: {TODAY}. Braces {{kept}}."
    assert template.format(TODAY="2020-01-01") == "Date: 2020-01-01. Braces {kept}."
    assert extract.assigned_literal(MODULE, "LIMITS") == {"turns": 3, "cut": 0.5}
    assert extract.assigned_string(MODULE, "prompt", within="Agent.run") == "Inside a method."
    assert extract.the_string(MODULE, lambda s: "every turn" in s, within="respond") == (
        "You have used every turn.")
    assert extract.call_keywords(MODULE, "chat") == [{"temperature": 0.25, "top_p": 0.9}]
    assert "Hello, reader." in extract.strings(MODULE)
    with pytest.raises(extract.ExtractError, match="no class or function 'missing'"):
        extract.strings(MODULE, within="missing")
    with pytest.raises(extract.ExtractError, match="demo.py: not Python source"):
        extract.parse("def (:", "demo.py")


def test_the_pins_are_full_commits_and_hashes():
    for src in SOURCES.values():
        assert re.fullmatch(r"[0-9a-f]{40}", src.commit), src.name
        assert src.files and src.licence
        for path, digest in src.files.items():
            assert re.fullmatch(r"[0-9a-f]{64}", digest), path
            assert not path.startswith("/") and ".." not in path


def test_the_cli_lists_and_refuses_another_version(tmp_path: Path):
    bad = tmp_path / "refs" / "DR-Venus" / "Inference" / "run_demo.py"
    bad.parent.mkdir(parents=True)
    bad.write_text("SYSTEM_PROMPT = 'not the pinned file'\n")
    env = {"DRVENUS_REFERENCE_DIR": str(tmp_path / "refs"), "COLUMNS": "200"}
    listed = drvenus("reference", "list", "DR-Venus", env=env, timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert "mismatch" in listed.stdout and "missing" in listed.stdout
    pulled = drvenus("reference", "pull", "DR-Venus", env=env, timeout=60)
    assert pulled.returncode == 2
    pinned = SOURCES["DR-Venus"].files["Inference/run_demo.py"]
    assert pulled.stderr.count("\n") == 1
    assert "DR-Venus/Inference/run_demo.py: sha256 " in pulled.stderr
    assert pinned in pulled.stderr


@NEEDS_REFERENCE
def test_the_real_files_match_the_pins():
    """Where the real files are (helpers.reference): every file there is the pinned version,
    DR-Venus's are all there, and each other source is there whole or not at all (HLE's pin
    could not be checked, so the workplace's copy has no hle/)."""
    states = real_store().states()
    assert [s for s in states if s.state == "mismatch"] == []
    assert {s.state for s in states if s.source == "DR-Venus"} == {"ok"}
    for name in SOURCES:
        assert len({s.state for s in states if s.source == name}) == 1, name


# ---------------------------------------------------------------- slow, silent and damaged
class _Drip:
    """A server on 127.0.0.1 that answers 200 with a long body, one byte every ``every``
    seconds (counting the bytes it sent), until the client goes."""

    def __init__(self, every: float = 0.05) -> None:
        self.sent = 0
        drip = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                self.send_response(200)
                self.send_header("Content-Length", "100000")
                self.end_headers()
                try:
                    for _ in range(100000):
                        self.wfile.write(b"x")
                        self.wfile.flush()
                        drip.sent += 1
                        threading.Event().wait(every)
                except OSError:  # the client hung up
                    pass

            def log_message(self, *args) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.template = f"http://127.0.0.1:{self.httpd.server_address[1]}/{{path}}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_a_dripping_server_meets_the_file_deadline(demo, tmp_path: Path):
    _, src = demo
    drip = _Drip(every=0.05)
    try:
        store = ReferenceStore(cache_dir=tmp_path / "cache", url_template=drip.template,
                               sources={"Demo": src}, timeout=30, deadline=1.0)
        with pytest.raises(ReferenceError) as info:
            store.read_bytes("Demo", "pkg/texts.py")
    finally:
        drip.close()
    line = str(info.value)
    assert "\n" not in line and "not complete after 1 s" in line
    assert 0 < drip.sent < 1000  # stopped long before the body (100,000 bytes) was sent
    assert not any((tmp_path / "cache").rglob("*.py")) if (tmp_path / "cache").exists() else True


def test_a_host_that_never_answers_fails_at_the_connect_timeout_once(demo, tmp_path: Path,
                                                                     monkeypatch):
    import socket

    _, src = demo
    # a listening socket whose accept queue is full: the kernel drops further SYNs, so a
    # connect waits, as for a host that never answers
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    for _ in range(3):
        filler = socket.socket()
        filler.setblocking(False)
        filler.connect_ex(("127.0.0.1", port))
        fillers.append(filler)
    sleeps: list[float] = []
    monkeypatch.setattr("drvenus.reference.store.time.sleep", sleeps.append)
    store = ReferenceStore(cache_dir=tmp_path / "cache", sources={"Demo": src},
                           url_template=f"http://127.0.0.1:{port}/{{path}}", connect_timeout=0.5)
    try:
        with pytest.raises(ReferenceError) as info:
            store.read_bytes("Demo", "pkg/texts.py")
    finally:
        for s in (*fillers, listener):
            s.close()
    assert "no answer from the host within 0.5 s" in str(info.value)
    assert sleeps == []  # not tried again


def test_a_damaged_cached_file_is_fetched_again_or_named_with_what_to_do(demo, tmp_path: Path,
                                                                          server):
    _, src = demo
    port = server.server_address[1]
    template = f"http://127.0.0.1:{port}/{{repo}}/{{commit}}/{{path}}"
    _Files.files[f"/someone/demo/{'a' * 40}/pkg/texts.py"] = MODULE.encode()
    cached = tmp_path / "cache" / f"Demo@{'a' * 40}" / "pkg" / "texts.py"
    cached.parent.mkdir(parents=True)
    cached.write_text(MODULE[:40])  # a truncated copy
    offline = ReferenceStore(cache_dir=tmp_path / "cache", url_template=template,
                             sources={"Demo": src}, download=False)
    with pytest.raises(ReferenceError) as info:
        offline.read_bytes("Demo", "pkg/texts.py")
    assert "is damaged" in str(info.value) and "delete it, or run `drvenus reference pull`" in (
        str(info.value))
    store = ReferenceStore(cache_dir=tmp_path / "cache", url_template=template,
                           sources={"Demo": src})
    assert [s.state for s in store.pull()] == ["ok"]  # pull fetches it again
    assert cached.read_text() == MODULE and len(_Files.hits) == 1


def test_an_empty_reference_dir_setting_is_unset(tmp_path: Path, monkeypatch):
    from drvenus.reference import reference_store

    monkeypatch.setenv("DRVENUS_REFERENCE_DIR", "")
    monkeypatch.chdir(tmp_path)
    store = reference_store()
    assert store.local_dir is None and store.cache_dir.name == "reference"
