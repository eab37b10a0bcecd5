"""The one URL redaction: credentials never reach logs, records, reprs or traces."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

REDACTED = "***"


def redact_url(url: str) -> str:
    """``url`` with any ``user:password@`` part replaced by ``***@``, safe for logs, records and
    traces; ``"<unparseable URL>"`` for what cannot be parsed (it might hide a secret)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return "<unparseable URL>"
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    if ":" in host:  # an IPv6 address keeps its brackets
        host = f"[{host}]"
    if port is not None:
        host = f"{host}:{port}"
    return urlunsplit((parts.scheme, f"{REDACTED}@{host}", parts.path, parts.query, parts.fragment))


__all__ = ["REDACTED", "redact_url"]
