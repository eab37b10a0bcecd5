"""URL helpers for the page store: canonical lookup keys, Wikipedia URLs, pseudo URLs.

The agent writes URLs back as it saw them, or slightly changed (``http`` instead of
``https``, a mobile Wikipedia host, spaces instead of underscores, percent-encoded or not, a
trailing slash). :func:`url_key` maps all those spellings of one page to one key.
"""

from __future__ import annotations

import re
from urllib.parse import quote, unquote, urlsplit

WEB_SCHEMES = ("http", "https")

# Characters Wikipedia leaves as they are in article paths.
_WIKI_SAFE = "/:@!$()*,;'-._~"
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
_MOBILE_WIKI = re.compile(r"^([a-z0-9-]+)\.m\.(wiki[a-z]+\.org)$")
_DEFAULT_PORTS = {"http": 80, "https": 443}
# Already canonical but for the scheme: lowercase host, no port, query, fragment or escapes.
_PLAIN_URL = re.compile(
    r"https?://([a-z0-9-]+(?:\.[a-z0-9-]+)*)((?:/[A-Za-z0-9._~!$&'()*+,;=:@-]*)*)"
)


def wikipedia_url(title: str, lang: str = "en") -> str:
    """The article URL for a Wikipedia title (spaces as underscores, percent-encoded)."""
    path = quote(title.strip().replace(" ", "_"), safe=_WIKI_SAFE)
    return f"https://{lang}.wikipedia.org/wiki/{path}"


def pseudo_url(corpus_name: str, doc_id: str) -> str:
    """A stable URL for a document that has none: derived from the corpus name and its id."""
    name = re.sub(r"[^a-z0-9-]+", "-", corpus_name.lower()).strip("-") or "corpus"
    return f"https://{name}.corpus.local/doc/{quote(doc_id, safe='')}"


def is_web_url(url: str) -> bool:
    """True for ``http(s)://`` URLs and for scheme-less ones such as ``en.wikipedia.org/...``."""
    text = url.strip()
    match = _SCHEME.match(text)
    if match is None:
        return bool(text) and not text.startswith("/")
    # "host:port/path" parses as a scheme; treat digits after the colon as a port.
    if re.match(r"^[^/:]+:\d+(/|$)", text):
        return True
    return match.group(0)[:-1].lower() in WEB_SCHEMES


def url_key(url: str) -> str | None:
    """The canonical lookup key of a web URL, or None when it is not an http(s) URL.

    Scheme, ``www.``, default ports, the fragment and a trailing slash are ignored; the mobile
    Wikipedia host maps to the desktop one; the path is percent-decoded and spaces become
    underscores. The query string is kept.
    """
    plain = _PLAIN_URL.fullmatch(url)
    if plain is not None:  # fast path, the same key as below (index builds call this per page)
        host = plain.group(1)
        if not host.startswith("www.") and _MOBILE_WIKI.match(host) is None:
            return host + plain.group(2).rstrip("/")
    return _canonical_key(url)


def _canonical_key(url: str) -> str | None:
    """:func:`url_key` the long way, for any URL."""
    text = url.strip()
    if not is_web_url(text):
        return None
    if not re.match(r"^https?://", text, re.IGNORECASE):
        text = "https://" + text.removeprefix("//")
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError:
        return None
    host = (parts.hostname or "").lower().rstrip(".")
    if not host:
        return None
    host = host.removeprefix("www.")
    host = _MOBILE_WIKI.sub(r"\1.\2", host)
    if port is not None and port != _DEFAULT_PORTS.get(parts.scheme.lower()):
        host = f"{host}:{port}"
    path = unquote(parts.path).replace(" ", "_").rstrip("/")
    key = host + path
    if parts.query:
        key += "?" + unquote(parts.query)
    return key
