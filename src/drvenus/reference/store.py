"""Find a pinned official file, check its SHA-256, and hand over its bytes.

Where a file comes from, in order:

1. ``DRVENUS_REFERENCE_DIR`` set: ``<dir>/<source name>/<path>`` (local checkouts named after
   their repositories: ``DR-Venus/``, ``simple-evals/``, ...), and nowhere else: a missing file
   there is an error, not a reason to go online;
2. the cache, ``<cache>/reference/<name>@<commit>/<path>``, filled by an earlier pull (a damaged
   copy there is fetched again);
3. a download over HTTPS of the file at the pinned commit (``reference_url``, a template with
   ``{repo}``, ``{commit}`` and ``{path}``), checked before it is kept: a few tries within one
   deadline per file, a host that does not answer given up after its connect timeout.

Every read checks the hash, so a checkout at another commit, an edited file or a truncated
download is refused with one line that names the file, the hash found and the one expected.

:meth:`ReferenceStore.pull` (``drvenus reference pull``) fetches ahead of time, into the cache
or into a folder laid out as local checkouts: one source at a time, whole or not at all.
"""

from __future__ import annotations

import ast
import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx

from drvenus.net.retry import is_retryable_status
from drvenus.net.urls import redact_url
from drvenus.reference.extract import ExtractError, parse
from drvenus.reference.sources import SOURCES, Source

log = logging.getLogger(__name__)

DEFAULT_URL = "https://raw.githubusercontent.com/{repo}/{commit}/{path}"
DOWNLOAD_ATTEMPTS = 3
DOWNLOAD_TIMEOUT = 30.0  # seconds one read may wait
CONNECT_TIMEOUT = 5.0  # seconds to reach the host: one that never answers fails fast, once
FILE_DEADLINE = 60.0  # seconds one file may take, every attempt included (a server dripping
#                       a byte a second passes every per-read timeout)
MAX_FILE_BYTES = 8 * 1024 * 1024  # the official files are source files of a few KB


class ReferenceError(ValueError):
    """An official file that cannot be had as pinned (missing, another version, offline)."""


class ReferenceUnreachable(ReferenceError):
    """A pinned file that could not be downloaded: the host unreachable or silent, an HTTP
    error, a download past its deadline (a network failure, not another version)."""


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _where(src: Source, path: str) -> str:
    return f"{src.name}/{path}"


@dataclass(frozen=True)
class FileState:
    """Where one pinned file stands: ``state`` is ``ok``, ``missing`` or ``mismatch``."""

    source: str
    path: str
    state: str
    location: Path | None
    expected: str
    found: str | None = None


class ReferenceStore:
    """Pinned official files from local checkouts, the cache, or HTTPS (see the module doc)."""

    def __init__(
        self,
        *,
        cache_dir: Path,
        local_dir: Path | None = None,
        url_template: str | None = None,
        download: bool = True,
        timeout: float = DOWNLOAD_TIMEOUT,
        connect_timeout: float = CONNECT_TIMEOUT,
        deadline: float = FILE_DEADLINE,
        sources: Mapping[str, Source] | None = None,
    ) -> None:
        # ``sources``: the pinned sources (default: SOURCES); tests give their own fixtures'
        self.sources = dict(SOURCES if sources is None else sources)
        self.cache_dir = cache_dir
        self.local_dir = local_dir
        self.url_template = url_template or DEFAULT_URL
        self.download = download
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.deadline = deadline

    # where a file would be -------------------------------------------------------------------

    def source(self, name: str) -> Source:
        try:
            return self.sources[name]
        except KeyError:
            known = ", ".join(sorted(self.sources))
            raise ReferenceError(f"no reference source {name!r} (known: {known})") from None

    def _expected(self, src: Source, path: str) -> str:
        try:
            return src.files[path]
        except KeyError:
            raise ReferenceError(
                f"{_where(src, path)} is not a pinned file of {src.short}") from None

    def location(self, name: str, path: str) -> Path:
        """The local checkout's copy when ``local_dir`` is set, else the cache's."""
        src = self.source(name)
        if self.local_dir is not None:
            return self.local_dir / src.name / path
        return self.cache_dir / f"{src.name}@{src.commit}" / path

    def state(self, name: str, path: str) -> FileState:
        src = self.source(name)
        expected = self._expected(src, path)
        where = self.location(name, path)
        if not where.is_file():
            return FileState(src.name, path, "missing", where, expected)
        found = sha256(where.read_bytes())
        return FileState(src.name, path, "ok" if found == expected else "mismatch", where,
                         expected, found)

    def states(self, names: list[str] | None = None) -> list[FileState]:
        return [self.state(n, p) for n in (names or list(self.sources))
                for p in self.source(n).files]

    # reading -----------------------------------------------------------------------------------

    def read_bytes(self, name: str, path: str) -> bytes:
        """The pinned file's bytes, hash checked (downloaded into the cache when allowed)."""
        src = self.source(name)
        expected = self._expected(src, path)
        where = self.location(name, path)
        if where.is_file():
            data = where.read_bytes()
            if self.local_dir is not None or sha256(data) == expected:
                self._check(src, path, data, expected, where)
                return data
            # a damaged copy in the cache (a disk fault, an edit): fetched again when allowed
            if not self.download:
                raise ReferenceError(
                    f"{_where(src, path)}: the cached copy {where} is damaged (sha256 "
                    f"{sha256(data)} where {expected} is expected): delete it, or run "
                    "`drvenus reference pull` with a network to fetch it again")
            log.warning("reference: %s in the cache is damaged; fetching it again",
                        _where(src, path))
        if self.local_dir is not None:
            raise ReferenceError(
                f"{_where(src, path)}: not found in DRVENUS_REFERENCE_DIR ({self.local_dir}); "
                f"expected a checkout of {src.repo} at {src.commit[:7]} with sha256 "
                f"{expected}")
        if not self.download:
            raise ReferenceError(
                f"{_where(src, path)}: not in the cache; run `drvenus reference pull` with a "
                f"network, or set DRVENUS_REFERENCE_DIR to local checkouts")
        data = self._download(src, path, expected)
        self._write(src, {path: data})
        return data

    def read_text(self, name: str, path: str) -> str:
        return self.read_bytes(name, path).decode("utf-8")

    def root(self, name: str) -> Path:
        """The folder holding the files of source ``name``: its checkout under ``local_dir``,
        else its commit's folder in the cache."""
        src = self.source(name)
        if self.local_dir is not None:
            return self.local_dir / src.name
        return self.cache_dir / f"{src.name}@{src.commit}"

    def pull(self, names: list[str] | None = None) -> list[FileState]:
        """Make every pinned file of ``names`` (default: all) available, source by source
        (:meth:`pull_source`); raises at the first source that fails, the ones before it
        written. Their states after."""
        for name in names or list(self.sources):
            self.pull_source(name)
        return self.states(names)

    def pull_source(self, name: str) -> list[FileState]:
        """Make every pinned file of source ``name`` available where this store reads it (the
        cache, or ``<local_dir>/<name>/<path>``), whole or not at all: the files not there are
        downloaded from the pinned commit (``url_template``; bounded tries within a deadline
        per file), every one checked against its SHA-256, and only then written, each
        atomically. A file of another version under ``local_dir`` (a checkout at another
        commit, an edit) is refused before anything is downloaded, never overwritten; a
        damaged copy in the cache is fetched again. Downloads happen whatever ``download``
        says (that governs reads). Raises :class:`ReferenceUnreachable` when a download fails,
        :class:`ReferenceError` for another version; the source's states after."""
        src = self.source(name)
        states = self.states([src.name])
        if self.local_dir is not None:
            for other in (s for s in states if s.state == "mismatch"):
                raise ReferenceError(
                    f"{_where(src, other.path)}: sha256 {other.found} where {other.expected} "
                    f"is expected ({src.repo} at {src.commit[:7]}; read from {other.location}); "
                    f"nothing of {src.name} was written: remove it, or check out {src.repo} "
                    f"at {src.commit[:7]} there")
        todo = [s for s in states if s.state != "ok"]
        for damaged in (s for s in todo if s.state == "mismatch"):
            log.warning("reference: %s in the cache is damaged; fetching it again",
                        _where(src, damaged.path))
        hint = f"nothing of {src.name} was written"
        fetched = {s.path: self._download(src, s.path, s.expected, hint) for s in todo}
        self._write(src, fetched)
        if fetched:
            log.info("reference: %s: %d file(s) written under %s", src.short, len(fetched),
                     self.root(src.name))
        return self.states([src.name])

    # internals ---------------------------------------------------------------------------------

    @staticmethod
    def _check(src: Source, path: str, data: bytes, expected: str, where: Path | str) -> None:
        found = sha256(data)
        if found != expected:
            raise ReferenceError(
                f"{_where(src, path)}: sha256 {found} where {expected} is expected "
                f"({src.repo} at {src.commit[:7]}; read from {where})")

    def _write(self, src: Source, files: Mapping[str, bytes]) -> None:
        """Write ``files`` (path -> checked bytes) of ``src`` where this store reads them, each
        atomically (a temporary file beside it, then a rename), the renames only once every
        temporary file is complete; a failure leaves no temporary file behind."""
        parts: list[tuple[Path, Path]] = []
        try:
            for path, data in files.items():
                where = self.location(src.name, path)
                where.parent.mkdir(parents=True, exist_ok=True)
                part = where.with_name(where.name + f".part{os.getpid()}")
                parts.append((part, where))
                part.write_bytes(data)
            for part, where in parts:
                part.replace(where)
                log.info("reference: saved %s", where)
        finally:
            for part, _ in parts:
                part.unlink(missing_ok=True)

    def _download(self, src: Source, path: str, expected: str, hint: str = "") -> bytes:
        """The file at the pinned commit, hash checked: up to :data:`DOWNLOAD_ATTEMPTS` tries
        (not after a 4xx or a host that never answered), all within ``deadline`` seconds;
        ``hint`` (what the caller did about it) ends the message of a failure."""
        url = self.url_template.format(repo=src.repo, commit=src.commit, path=path)
        shown = redact_url(url)
        ends = time.monotonic() + self.deadline
        last = ""
        for attempt in range(1, DOWNLOAD_ATTEMPTS + 1):
            try:
                data = self._fetch(url, ends)
                if isinstance(data, int):
                    last = f"HTTP {data}"
                    if not is_retryable_status(data):
                        break
                else:
                    if len(data) > MAX_FILE_BYTES:
                        raise ReferenceError(
                            f"{_where(src, path)}: {shown} is over {MAX_FILE_BYTES} bytes")
                    try:
                        self._check(src, path, data, expected, shown)
                    except ReferenceError as exc:
                        if hint:  # another version is not tried again
                            raise ReferenceError(f"{exc}; {hint}") from None
                        raise
                    return data
            except httpx.ConnectTimeout:
                last = f"no answer from the host within {self.connect_timeout:g} s"
                break
            except _Deadline:
                last = f"not complete after {self.deadline:g} s"
                break
            except httpx.HTTPError as exc:
                last = type(exc).__name__
            pause = 0.5 * 2 ** (attempt - 1)
            if attempt == DOWNLOAD_ATTEMPTS or time.monotonic() + pause >= ends:
                break
            time.sleep(pause)
        raise ReferenceUnreachable(
            f"{_where(src, path)}: cannot download {shown} ({last}); " + (
                hint or "run `drvenus reference pull` with a network, or set "
                        "DRVENUS_REFERENCE_DIR to local checkouts"))

    def _fetch(self, url: str, ends: float) -> bytes | int:
        """The body of ``url`` (at most one byte over :data:`MAX_FILE_BYTES`), or the status
        of a reply that is not 200; :class:`_Deadline` past ``ends``."""
        left = ends - time.monotonic()
        if left <= 0:
            raise _Deadline
        timeout = httpx.Timeout(min(self.timeout, left),
                                connect=min(self.connect_timeout, left))
        with httpx.Client(timeout=timeout, follow_redirects=True) as client:
            with client.stream("GET", url) as reply:
                if reply.status_code != 200:
                    return reply.status_code
                data = bytearray()
                for chunk in reply.iter_bytes():
                    data += chunk
                    if len(data) > MAX_FILE_BYTES:
                        break
                    if time.monotonic() > ends:
                        raise _Deadline
                return bytes(data)


class _Deadline(Exception):
    """A download past its file's deadline."""


def reference_store(settings: object | None = None) -> ReferenceStore:
    """The store of ``settings`` (default: the environment's): ``reference_dir``,
    ``reference_url`` and the cache root."""
    from drvenus.config import Settings, load_settings

    s = settings if isinstance(settings, Settings) else load_settings()
    local = s.reference_dir.expanduser() if s.reference_dir is not None else None
    return ReferenceStore(cache_dir=s.cache_root() / "reference", local_dir=local,
                          url_template=s.reference_url)


_T = TypeVar("_T")
_ONCE: dict[tuple[Any, ...], Any] = {}
_ONCE_LOCK = threading.Lock()


def read_once(kind: str, load: Callable[[ReferenceStore], _T], store: ReferenceStore) -> _T:
    """``load(store)`` (texts taken out of pinned files), run once per process for each
    ``kind``, store location and pin: the pinned files are hash-checked, so the same pins give
    the same texts; a failure is not kept (the next call tries again)."""
    key = (kind, store.local_dir, store.cache_dir, store.url_template,
           tuple(sorted((n, s.commit, tuple(sorted(s.files.items())))
                        for n, s in store.sources.items())))
    with _ONCE_LOCK:
        if key not in _ONCE:
            _ONCE[key] = load(store)
            log.debug("%s read from the pinned files", kind)
        return _ONCE[key]  # type: ignore[no-any-return]


class PinnedFiles:
    """The pinned files of one source, each read once through ``store`` (hash-checked there)
    and decoded as UTF-8; ``hashes`` keeps the SHA-256 of every file read, for reports."""

    def __init__(self, store: ReferenceStore, name: str) -> None:
        self.store, self.name = store, name
        self.source = store.source(name)
        self._texts: dict[str, str] = {}
        self.hashes: dict[str, str] = {}

    def where(self, path: str) -> str:
        return f"{self.name}/{path}"

    def text(self, path: str) -> str:
        if path not in self._texts:
            data = self.store.read_bytes(self.name, path)
            self.hashes[path] = sha256(data)
            try:
                self._texts[path] = data.decode("utf-8")
            except UnicodeDecodeError:
                raise ExtractError(f"{self.where(path)}: not UTF-8 text") from None
        return self._texts[path]

    def tree(self, path: str) -> ast.Module:
        return parse(self.text(path), self.where(path))
