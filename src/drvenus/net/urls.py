"""The one URL redaction (credentials never reach logs, records, reprs or traces) and the one
base-URL rule of every OpenAI-compatible server drvenus talks to (models, judges, RL engines)."""

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


def normalize_base_url(base_url: str) -> str:
    """``http://host:port``, ``host:port``, ``.../v1`` or ``.../v1/`` -> ``http://host:port/v1``.
    Raises ``ValueError`` with a readable message for anything that is not an HTTP(S) server."""
    url = base_url.strip()
    if not url:
        raise ValueError("base_url is empty")
    scheme, sep, _ = url.partition("://")
    if not sep:
        url = "http://" + url
    elif scheme.lower() not in ("http", "https"):
        raise ValueError(f"server URL must be http:// or https://: {redact_url(base_url)!r}")
    url = url.rstrip("/")
    for suffix in ("/chat/completions", "/completions"):
        url = url.removesuffix(suffix)
    parts = urlsplit(url)
    if not parts.hostname:
        raise ValueError(f"not a server URL: {redact_url(base_url)!r}")
    try:
        _ = parts.port  # raises ValueError for a malformed port
    except ValueError:
        raise ValueError(f"bad port in server URL: {redact_url(base_url)!r}") from None
    return url if url.endswith("/v1") else url + "/v1"


def server_root(base_url: str) -> str:
    """The server's root (``http://host:port``) under the one base-URL rule: for routes outside
    ``/v1`` (SGLang's ``/generate``)."""
    return normalize_base_url(base_url).removesuffix("/v1")


__all__ = ["REDACTED", "normalize_base_url", "redact_url", "server_root"]
