"""A persistent cache of tool results (search answers, fetched pages), shared by processes.

One SQLite file (WAL mode, so readers never block the writer and several processes, e.g. RL
rollout workers and a tool server, can share it). Entries are keyed by a namespace (the provider
and operation, e.g. ``serper:search``) and a normalised key (the query or URL, see
:func:`normalize_query` and :func:`normalize_url`), and expire after a time to live chosen by the
reader. Failures are never cached: callers store only results they would return again.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
import unicodedata
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

log = logging.getLogger(__name__)

DEFAULT_TTL = 7 * 24 * 3600.0  # a week: search results and pages change slowly


def normalize_query(query: str) -> str:
    """The cache key of a search query: NFKC, case-folded, white space collapsed."""
    return " ".join(unicodedata.normalize("NFKC", query).casefold().split())


def normalize_url(url: str) -> str:
    """The cache key of a URL: scheme and host lower-cased, default port and fragment dropped."""
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    port = parts.port if parts.port not in (None, {"http": 80, "https": 443}.get(scheme)) else None
    netloc = f"{host}:{port}" if port else host
    if parts.username:
        netloc = f"{parts.username}@{netloc}"
    return urlunsplit((scheme, netloc, parts.path or "/", parts.query, ""))


class ToolCache:
    """``get(namespace, key, ttl)`` / ``put(namespace, key, value)`` over one SQLite file.

    Thread-safe (one connection behind a lock; each statement takes well under a millisecond)
    and safe across processes (WAL, a busy timeout). A cache that cannot be read or written logs
    a warning and behaves as empty: the tools go on without it.
    """

    def __init__(self, path: str | Path, *, default_ttl: float = DEFAULT_TTL) -> None:
        self.path = Path(path)
        self.default_ttl = default_ttl
        self._lock = threading.Lock()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, timeout=10.0, check_same_thread=False)
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS entries (namespace TEXT NOT NULL, key TEXT NOT NULL,"
                " value TEXT NOT NULL, stored REAL NOT NULL, PRIMARY KEY (namespace, key))"
            )
            self._db.commit()

    def get(self, namespace: str, key: str, ttl: float | None = None) -> str | None:
        """The value stored under ``(namespace, key)`` less than ``ttl`` seconds ago, or None."""
        ttl = self.default_ttl if ttl is None else ttl
        try:
            with self._lock:
                row = self._db.execute(
                    "SELECT value, stored FROM entries WHERE namespace = ? AND key = ?",
                    (namespace, key),
                ).fetchone()
        except sqlite3.Error as exc:
            log.warning("tool cache %s unreadable: %s", self.path, exc)
            row = None
        if row is None or time.time() - row[1] > ttl:
            return None
        return str(row[0])

    def put(self, namespace: str, key: str, value: str) -> None:
        try:
            with self._lock:
                self._db.execute(
                    "INSERT OR REPLACE INTO entries VALUES (?, ?, ?, ?)",
                    (namespace, key, value, time.time()),
                )
                self._db.commit()
        except sqlite3.Error as exc:
            log.warning("tool cache %s not writable: %s", self.path, exc)

    def close(self) -> None:
        with self._lock:
            self._db.close()


__all__ = ["DEFAULT_TTL", "ToolCache", "normalize_query", "normalize_url"]
