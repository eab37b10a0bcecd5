"""The web demo's Markdown (drvenus.serve.markdown): CommonMark + GFM tables rendered on the
server and sanitised; the cases people hit with real answers, and nothing executable survives."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("markdown_it")
pytest.importorskip("nh3")

from drvenus.serve.markdown import to_html  # noqa: E402
from drvenus.serve.view import for_client  # noqa: E402

WIKI = "https://en.wikipedia.org/wiki/Dracula_(disambiguation)"

# the cases: (Markdown, what the HTML must hold)
CASES = {
    "table": ("| Author | Year |\n|---|--:|\n| Bram Stoker | 1897 |",
              ["<table>", "<th>Author</th>", '<td style="text-align:right">1897</td>']),
    "quote": ("> Listen to them, the children of the night.",
              ["<blockquote>", "children of the night.</p>\n</blockquote>"]),
    "fence": ("```python\nx = 1\ny = 2\n```",
              ['<pre><code class="language-python">x = 1\ny = 2\n</code></pre>']),
    "parens": (f"[Dracula]({WIKI})", [f'<a href="{WIKI}"', ">Dracula</a>"]),
    "bare url, period": ("See https://example.com/page. Then more.",
                         ['href="https://example.com/page"', "https://example.com/page</a>. Then"]),
    "bare url, colon": ("Read https://example.org/book: it says",
                        ['href="https://example.org/book"', "https://example.org/book</a>: it"]),
    "snake_case": ("call snake_case_name now", ["<p>call snake_case_name now</p>"]),
    "arithmetic": ("2*3*4 is 24", ["<p>2*3*4 is 24</p>"]),
    "emphasis still works": ("*Dracula* and **Stoker**", ["<em>Dracula</em>", "<strong>Stoker</strong>"]),
}


@pytest.mark.parametrize("name", CASES)
def test_markdown_cases(name):
    text, expected = CASES[name]
    html = to_html(text)
    for part in expected:
        assert part in html, (name, html)
    assert "<em>" not in html or name == "emphasis still works"


def test_links_open_safely_and_only_to_web_addresses():
    html = to_html(f"[a]({WIKI}) [b](javascript:alert(1)) [c](data:text/html,x) <https://x.org>")
    assert html.count("<a ") == 2  # the http(s) ones
    assert 'target="_blank"' in html and 'rel="noopener noreferrer nofollow"' in html
    assert "javascript:" not in html.replace("[b](javascript:alert(1))", "")
    assert 'href="data:' not in html


HOSTILE = [
    "<script>alert(1)</script>",
    "<img src=x onerror=alert(1)>",
    '<a href="https://x.org" onclick="alert(1)">x</a>',
    "<svg onload=alert(1)>",
    "<iframe src=https://evil.example></iframe>",
    '<div style="background:url(javascript:alert(1))">x</div>',
    "[x](javascript:alert(1))",
    "![pixel](https://tracker.example/p.gif)",
    '<details open ontoggle="alert(1)">',
]


@pytest.mark.parametrize("text", HOSTILE)
def test_nothing_executable_survives(text):
    html = to_html(f"Answer: {text}\n\n{text}")
    assert not re.search(r"<(script|img|svg|iframe|div|details|style)\b", html, re.I), html
    assert not re.search(r"<[^>]*\son\w+\s*=", html, re.I), html  # no event handler attribute
    assert not re.search(r"""href\s*=\s*["']?\s*javascript:""", html, re.I), html


def test_the_page_gets_the_html_with_the_events():
    answer = {"type": "answer", "step": 1, "data": {"answer": "**Bram Stoker**", "forced": False}}
    view = for_client(3, answer)["view"]
    assert view["answer"] == "**Bram Stoker**" and view["html"] == "<p><strong>Bram Stoker</strong></p>\n"
    record = {"termination": "answered", "prediction": "| a |\n|---|\n| 1 |"}
    done = for_client(4, {"type": "finished", "step": 1, "data": {"record": record}})["view"]
    assert "<table>" in done["html"]
    failed = {"termination": "interrupted", "prediction": "", "error": "<b>x</b>"}
    view = for_client(5, {"type": "finished", "step": 1, "data": {"record": failed}})["view"]
    assert "html" not in view  # the page shows the reason as text
