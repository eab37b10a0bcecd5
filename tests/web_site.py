"""A real static web site on 127.0.0.1 for the page-reading tests (stdlib only, one thread).

Routes: an article page with page chrome, a table and non-ASCII text; a PDF; plain text;
JSON; redirect chains and loops; redirects to private and metadata addresses; a compressed
bomb; an oversized body; an image; a slow page; a page failing a few times first; a Jina-like
reader at ``/jina/{url}`` that wants a bearer key. Every request is recorded (path, headers).
With ``tls=(certfile, keyfile)`` the site speaks HTTPS.
"""

from __future__ import annotations

import gzip
import ssl
import subprocess
import threading
from collections import Counter
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ARTICLE = """<!DOCTYPE html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <title>Rivermouth Lighthouse – History</title>
  <script>window.analytics = {track: function () {}};</script>
  <style>body { font-family: serif; }</style>
</head>
<body>
  <header><a href="/">Coastal Heritage Society</a> | <a href="/login">Log in</a></header>
  <nav>
    <ul><li><a href="/">Home</a></li><li><a href="/towns">Towns</a></li>
    <li><a href="/donate">Donate</a></li></ul>
  </nav>
  <main>
    <article>
      <h1>Rivermouth Lighthouse</h1>
      <p>The Rivermouth lighthouse was built in 1871 by the engineer Thomas Hale. At 38 metres
      it is the tallest lighthouse on the coast, and its lamp can be seen from 40 kilometres
      away on a clear night.</p>
      <h2>Keepers</h2>
      <p>The first keeper, Jörg Åkesson from Zürich, kept a diary that is now in the town
      museum. A later visitor from Tokyo wrote of it in Japanese: 東京から来た訪問者は灯台について書いた。</p>
      <p>The light was automated in 1968, and the keeper's cottage became a small museum that
      is open to visitors from April to October every year.</p>
      <h2>Restorations</h2>
      <table>
        <thead><tr><th>Year</th><th>Work</th><th>Cost (£)</th></tr></thead>
        <tbody>
          <tr><td>1893</td><td>Lantern glass replaced after a storm</td><td>1,200</td></tr>
          <tr><td>1968</td><td>Light automated</td><td>14,500</td></tr>
          <tr><td>2004</td><td>Tower repainted</td><td>88,000</td></tr>
        </tbody>
      </table>
    </article>
  </main>
  <aside>Related: <a href="/towns/harbour">The harbour</a></aside>
  <footer>© 2024 Coastal Heritage Society. All rights reserved. Cookie settings.</footer>
</body>
</html>
"""

# No main content for trafilatura: the lxml fallback has to find the words.
BARE_PAGE = "<html><head><title>Bare</title></head><body><div>Tide table: 06:12</div></body></html>"

NOTES = "Plain notes about Rivermouth.\nFerry: twice a day in summer.\n"
PDF_LINES = ("Rivermouth Harbour Report 1893", "The storm destroyed the old pier.")


def make_pdf(lines: tuple[str, ...], title: str = "Harbour Report") -> bytes:
    """A minimal valid one-page PDF showing ``lines`` in Helvetica (offsets computed)."""
    ops = ["BT", "/F1 14 Tf", "72 720 Td", "18 TL"]
    for line in lines:
        escaped = line.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
        ops.append(f"({escaped}) Tj T*")
    ops.append("ET")
    stream = "\n".join(ops).encode("latin-1")
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
        b"/Resources << /Font << /F1 4 0 R >> >> /Contents 5 0 R >>",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream",
        b"<< /Title (" + title.encode("latin-1") + b") >>",
    ]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % off for off in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R /Info 6 0 R >>\n" % (len(objects) + 1)
    out += b"startxref\n%d\n%%%%EOF\n" % xref
    return bytes(out)


def make_cert(folder: Path, host: str) -> tuple[Path, Path] | None:
    """A self-signed certificate for ``host`` (openssl), or None without openssl."""
    cert, key = folder / "cert.pem", folder / "key.pem"
    command = [
        "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        "-keyout", str(key), "-out", str(cert), "-subj", f"/CN={host}",
        "-addext", f"subjectAltName=DNS:{host}",
    ]
    try:
        subprocess.run(command, check=True, capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return cert, key


@dataclass(frozen=True)
class Seen:
    path: str
    headers: dict[str, str]


class WebSite:
    """The site; ``with WebSite() as site: site.url + "/article.html"``."""

    def __init__(self, *, tls: tuple[Path, Path] | None = None, jina_key: str = "jina-key") -> None:
        self.tls = tls
        self.jina_key = jina_key
        self.seen: list[Seen] = []
        self.hits: Counter[str] = Counter()
        self.bomb = gzip.compress(b"\0" * 5_000_000)
        self.pdf = make_pdf(PDF_LINES)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._server: ThreadingHTTPServer | None = None

    def __enter__(self) -> WebSite:
        handler = type("_Bound", (_Handler,), {"site": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        if self.tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*map(str, self.tls))
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def record(self, path: str, headers: dict[str, str]) -> int:
        with self._lock:
            self.seen.append(Seen(path, headers))
            self.hits[path] += 1
            return self.hits[path]

    def sleep(self, seconds: float) -> None:
        self._stop.wait(seconds)


class _Handler(BaseHTTPRequestHandler):
    site: WebSite
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def send(self, status: int, body: bytes = b"", kind: str = "text/html; charset=utf-8",
             headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def redirect(self, location: str, status: int = 302) -> None:
        self.send(status, b"", headers={"Location": location})

    def do_GET(self) -> None:  # http.server naming
        path = self.path
        count = self.site.record(path, dict(self.headers.items()))
        if path.startswith("/jina/"):
            return self.jina(path.removeprefix("/jina/"))
        if path.startswith("/redirect/"):
            left = int(path.rsplit("/", 1)[1])
            target = "/article.html" if left <= 1 else f"/redirect/{left - 1}"
            return self.redirect(target, (301, 302, 303, 307, 308)[left % 5])
        routes = {
            "/article.html": lambda: self.send(200, ARTICLE.encode()),
            "/bare.html": lambda: self.send(200, BARE_PAGE.encode()),
            "/paper.pdf": lambda: self.send(200, self.site.pdf, "application/pdf"),
            "/notes.txt": lambda: self.send(200, NOTES.encode(), "text/plain; charset=utf-8"),
            "/data.json": lambda: self.send(200, b'{"tide": "06:12"}', "application/json"),
            "/photo.png": lambda: self.send(200, b"\x89PNG\r\n\x1a\n" + b"\0" * 64, "image/png"),
            "/loop": lambda: self.redirect("/loop"),
            "/to-private": lambda: self.redirect("http://10.1.2.3/admin"),
            "/to-metadata": lambda: self.redirect("http://169.254.169.254/latest/meta-data/"),
            "/to-file": lambda: self.redirect("file:///etc/passwd"),
            "/missing": lambda: self.send(404, b"not found"),
        }
        if path in routes:
            return routes[path]()
        if path == "/bomb":
            return self.send(200, self.site.bomb, "text/html", {"Content-Encoding": "gzip"})
        if path == "/huge":
            return self.send(200, b"x" * 300_000, "text/plain")
        if path == "/slow":
            self.site.sleep(10.0)
            return self.send(200, ARTICLE.encode())
        if path == "/flaky":
            if count <= 2:
                return self.send(503, b"busy", headers={"Retry-After": "0"})
            return self.send(200, ARTICLE.encode())
        self.send(404, b"no such page")

    def jina(self, target: str) -> None:
        if self.headers.get("Authorization") != f"Bearer {self.site.jina_key}":
            return self.send(401, b'{"detail": "bad key"}', "application/json")
        body = (
            f"Title: Rivermouth Lighthouse\n\nURL Source: {target}\n\nMarkdown Content:\n"
            "# Rivermouth Lighthouse\n\nThe Rivermouth lighthouse was built in 1871 by the "
            "engineer Thomas Hale. It is 38 metres tall.\n"
        )
        self.send(200, body.encode(), "text/plain; charset=utf-8")


__all__ = ["ARTICLE", "NOTES", "PDF_LINES", "WebSite", "make_cert", "make_pdf"]
