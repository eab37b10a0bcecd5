"""Secrets never reach logs, error texts, records or traces.

The settings register every secret they hold (API keys, tokens, the password of a URL) with
:func:`register_secret`; :func:`redact` replaces each of them, and any ``user:password@`` part of
a URL, with ``***``. Servers and gateways often echo the key they refused in their 401 body, and
httpx logs each request URL at ``-v``: both pass through :func:`redact` (the model client's
errors, the agent's error texts) or through :class:`RedactingFilter` (every log record).
"""

from __future__ import annotations

import logging
import re
import threading
from urllib.parse import unquote, urlsplit

from drvenus.net.urls import REDACTED

MIN_SECRET_CHARS = 6  # shorter values would redact ordinary words
_URL_CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/\s@]+@")

_lock = threading.Lock()
_secrets: set[str] = set()
_pattern: re.Pattern[str] | None = None


def register_secret(value: str | None) -> None:
    """Redact ``value`` (and its URL-decoded form) from now on; short or empty values are
    ignored (see :data:`MIN_SECRET_CHARS`)."""
    global _pattern
    if not value:
        return
    forms = {v for v in (value, unquote(value)) if len(v) >= MIN_SECRET_CHARS}
    with _lock:
        if forms <= _secrets:
            return
        _secrets.update(forms)
        ordered = sorted(_secrets, key=len, reverse=True)  # the longest first
        _pattern = re.compile("|".join(re.escape(s) for s in ordered))


def register_url_secrets(url: str | None) -> None:
    """Register the password (and user name) inside ``url``, when it has them."""
    if not url:
        return
    try:
        parts = urlsplit(url)
        user, password = parts.username, parts.password
    except ValueError:
        return
    register_secret(password)
    if password:
        register_secret(user)


def redact(text: str) -> str:
    """``text`` with every registered secret and URL credentials replaced by ``***``."""
    if not text:
        return text
    text = _URL_CREDENTIALS.sub(lambda m: f"{m.group('scheme')}{REDACTED}@", text)
    pattern = _pattern
    return pattern.sub(REDACTED, text) if pattern is not None else text


class RedactingFilter(logging.Filter):
    """A handler filter: the record's final message, redacted (arguments merged in first)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a broken format string: leave it to the handler's own error path
            return True
        clean = redact(message)
        if clean != message or record.args:
            record.msg, record.args = clean, None
        return True


__all__ = ["MIN_SECRET_CHARS", "RedactingFilter", "redact", "register_secret",
           "register_url_secrets"]
