"""Markdown as safe HTML for the web demo: CommonMark + GFM tables, strikethrough and bare-URL
links (markdown-it-py with linkify-it-py), then sanitised with nh3 (ammonia): an allow-list of
tags and attributes (no images: an answer cannot make the visitor's browser fetch anything),
links only to http(s) and mailto, opened in a new tab without a referrer.

The answer and the thinking of a run are rendered here, on the server, so the page needs no
parser of its own and no script from elsewhere (it works offline). Raw HTML in the text is
shown as text; nothing executable survives the sanitiser either way.
"""

from __future__ import annotations

from functools import cache
from typing import Any

TAGS = {
    "p", "br", "hr", "h1", "h2", "h3", "h4", "h5", "h6", "strong", "em", "del", "s", "code",
    "pre", "blockquote", "ul", "ol", "li", "a", "table", "thead", "tbody", "tr", "th", "td",
}
ATTRIBUTES = {
    "a": {"href", "title", "target"},
    "ol": {"start"},
    "th": {"style"},
    "td": {"style"},
    "code": {"class"},
}
URL_SCHEMES = {"http", "https", "mailto"}
STYLES = {"text-align"}  # table column alignment (GFM's :--: markers)


def _arithmetic_star(state: Any, silent: bool) -> bool:
    """Inline rule: a ``*`` between two digits is a times sign (``2*3*4``), not emphasis."""
    pos, src = state.pos, state.src
    if src[pos] != "*" or pos == 0 or pos + 1 >= len(src):
        return False
    if not (src[pos - 1].isdigit() and src[pos + 1].isdigit()):
        return False
    if not silent:
        state.pending += "*"
    state.pos += 1
    return True


def _trim_link_colon(state: Any) -> None:
    """Core rule: a bare URL does not take in the colon after it ("see https://x.org/a: ...");
    linkify-it leaves trailing periods and commas out, not colons."""
    from markdown_it.token import Token

    for block in state.tokens:
        children = block.children or []
        for i, tok in enumerate(children):
            href = tok.attrs.get("href") if tok.type == "link_open" else None
            if tok.markup != "linkify" or not isinstance(href, str) or not href.endswith(":"):
                continue
            text = children[i + 1] if i + 1 < len(children) else None
            if text is None or text.type != "text" or not text.content.endswith(":"):
                continue
            tok.attrs["href"] = href[:-1]
            text.content = text.content[:-1]
            after = Token("text", "", 0)
            after.content = ":"
            children.insert(i + 3, after)


@cache
def _parser() -> Any:
    from markdown_it import MarkdownIt

    md = MarkdownIt("commonmark", {"html": False, "linkify": True, "typographer": False})
    md.enable(["table", "strikethrough", "linkify"])
    md.inline.ruler.before("emphasis", "arithmetic_star", _arithmetic_star)
    md.core.ruler.after("linkify", "trim_link_colon", _trim_link_colon)
    return md


def to_html(text: str) -> str:
    """``text`` (Markdown) as sanitised HTML."""
    import nh3

    if not text:
        return ""
    raw = _parser().render(text)
    return nh3.clean(
        raw, tags=TAGS, attributes=ATTRIBUTES, url_schemes=URL_SCHEMES,
        filter_style_properties=STYLES, link_rel="noopener noreferrer nofollow",
        set_tag_attribute_values={"a": {"target": "_blank"}},
    )


__all__ = ["to_html"]
