"""The safe fetcher and the page readers, against a real site on 127.0.0.1 (no internet)."""

from __future__ import annotations

import asyncio
import ipaddress
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from drvenus.net.addresses import AddressPolicy, parse_networks
from drvenus.net.retry import RetryPolicy
from drvenus.tools import web
from drvenus.tools.base import ProviderError
from drvenus.tools.pages import FetchReader, JinaReader, html_to_page
from drvenus.tools.web import FetchTimeout, SafeFetcher, blocked_reason, check_url
from web_site import ARTICLE, NOTES, PDF_LINES, WebSite, make_cert

FAST = RetryPolicy(attempts=3, base=0.0)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def site() -> Iterator[WebSite]:
    with WebSite() as running:
        yield running


async def fetch(url: str, **options: Any) -> web.FetchResult:
    options.setdefault("allow_private", True)
    options.setdefault("retry", FAST)
    fetcher = SafeFetcher(**options)
    try:
        return await fetcher.fetch(url)
    finally:
        await fetcher.aclose()


def fails(url: str, **options: Any) -> ProviderError:
    with pytest.raises(ProviderError) as info:
        run(fetch(url, **options))
    return info.value


# --- the address policy ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("127.0.0.1", "loopback"),
        ("10.0.0.5", "private"),
        ("192.168.1.1", "private"),
        ("172.16.3.4", "private"),
        ("169.254.10.1", "link-local"),
        ("169.254.169.254", "metadata"),
        ("100.100.100.200", "metadata"),
        ("fd00:ec2::254", "metadata"),
        ("100.64.1.1", "not a public"),
        ("0.0.0.0", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("240.0.0.1", "reserved"),
        ("::1", "loopback"),
        ("fe80::1", "link-local"),
        ("fc00::1", "private"),
        ("::ffff:127.0.0.1", "loopback"),
        ("::ffff:169.254.169.254", "metadata"),
        ("2002:7f00:1::", "loopback"),  # 6to4 of 127.0.0.1
        ("64:ff9b::a00:1", "private"),  # NAT64 of 10.0.0.1
    ],
)
def test_blocked_addresses(address: str, reason: str) -> None:
    found = blocked_reason(ipaddress.ip_address(address))
    assert found is not None and reason in found


@pytest.mark.parametrize("address", ["93.184.216.34", "8.8.8.8", "2606:4700::1111"])
def test_public_addresses_pass(address: str) -> None:
    assert blocked_reason(ipaddress.ip_address(address)) is None


METADATA = [
    "169.254.169.254", "169.254.170.2", "169.254.1.1", "fd00:ec2::254", "100.100.100.200",
    "192.0.0.192", "::ffff:169.254.169.254", "64:ff9b::a9fe:a9fe",
]


@pytest.mark.parametrize("address", METADATA)
def test_metadata_addresses_stay_refused_with_allow_private(address: str) -> None:
    ip = ipaddress.ip_address(address)
    permissive = AddressPolicy(allow_private=True)
    assert permissive.reason(ip) is not None
    assert AddressPolicy().reason(ip) is not None
    named = AddressPolicy.of(True, f"{address}, 10.9.0.0/16")
    assert named.reason(ip) is None  # named explicitly: the only way in
    error = fails(f"http://[{address}]/" if ":" in address else f"http://{address}/",
                  allow_private=True)
    assert error.refused and "DRVENUS_ALLOWED_ADDRESSES" in str(error)


def test_address_policy_allows_private_and_named_networks() -> None:
    permissive = AddressPolicy(allow_private=True)
    for address in ("127.0.0.1", "10.0.0.5", "::1", "fe80::1"):
        assert permissive.reason(ipaddress.ip_address(address)) is None
        assert AddressPolicy().reason(ipaddress.ip_address(address)) is not None
    only_one = AddressPolicy.of(False, "10.1.0.0/16")
    assert only_one.reason(ipaddress.ip_address("10.1.2.3")) is None
    assert only_one.reason(ipaddress.ip_address("10.2.0.1")) is not None
    keys = {AddressPolicy().key, permissive.key, only_one.key, AddressPolicy.of(True, "::1").key}
    assert len(keys) == 4
    with pytest.raises(ValueError, match="'nope' is not an IP address"):
        parse_networks("10.0.0.1, nope")


def test_allowed_addresses_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    from drvenus.config import load_settings

    monkeypatch.setenv("DRVENUS_ALLOWED_ADDRESSES", "169.254.169.254")
    policy = load_settings(allow_private_urls=True).address_policy()
    assert policy.reason(ipaddress.ip_address("169.254.169.254")) is None
    assert policy.reason(ipaddress.ip_address("169.254.170.2")) is not None
    monkeypatch.setenv("DRVENUS_ALLOWED_ADDRESSES", "169.254.169.254/99")
    with pytest.raises(ValueError, match="not an IP address"):
        load_settings()


def test_redirect_from_an_allowed_page_to_metadata_is_refused(
    site: WebSite, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With --allow-private-urls the local site may be read, but its redirect to the metadata
    address is refused before any connection (the guard below would say otherwise)."""
    original = SafeFetcher._get

    async def loopback_only(self: SafeFetcher, target: web.Target, headers: Any) -> Any:
        if target.ip != "127.0.0.1":  # never send a test request anywhere else
            raise ProviderError(f"test guard: would connect to {target.ip}")
        return await original(self, target, headers)

    monkeypatch.setattr(SafeFetcher, "_get", loopback_only)
    error = fails(site.url + "/to-metadata", allow_private=True)
    assert error.refused and "metadata" in str(error)
    assert "Thomas Hale" in run(fetch(site.url + "/redirect/1")).text()


def resolver_to(*addresses: str) -> web.Resolver:
    async def resolve(host: str, port: int) -> list[str]:
        return list(addresses)

    return resolve


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1/",
        "http://10.0.0.1/x",
        "http://192.168.0.10:8080/admin",
        "http://169.254.169.254/latest/meta-data/",
        "http://[::1]/",
        "http://[::ffff:127.0.0.1]/",
        "http://[fe80::1]/",
        "http://2130706433/",  # 127.0.0.1 as one number: the resolver says what it is
        "ftp://example.com/file",
        "file:///etc/passwd",
        "gopher://example.com/",
        "http://user:secret@example.com/",
        "http:///no-host",
    ],
)
def test_ssrf_refusals_before_any_connection(url: str) -> None:
    error = fails(url, allow_private=False, resolver=web.system_resolver)
    assert error.refused and not error.retryable


def test_hostname_resolving_to_loopback_is_refused(site: WebSite) -> None:
    before = len(site.seen)
    url = f"http://intranet.example:{site.port}/article.html"
    error = fails(url, allow_private=False, resolver=resolver_to("93.184.216.34", "127.0.0.1"))
    assert error.refused and "loopback" in str(error)
    assert len(site.seen) == before  # nothing was sent


def test_check_url_pins_the_resolved_address() -> None:
    target = run(check_url("https://Example.COM/a?b=1", resolver_to("93.184.216.34")))
    assert (target.scheme, target.host, target.port, target.ip) == (
        "https", "example.com", 443, "93.184.216.34"
    )
    assert str(target.connect_url()) == "https://93.184.216.34/a?b=1"
    assert target.host_header() == "example.com"
    v6 = run(check_url("http://h.example:8080/", resolver_to("2606:4700::1111")))
    assert str(v6.connect_url()) == "http://[2606:4700::1111]:8080/"
    assert v6.host_header() == "h.example:8080"


@pytest.fixture()
def loopback_is_public(monkeypatch: pytest.MonkeyPatch) -> None:
    """Treat the test site's address as public, so the policy itself is under test."""
    from drvenus.net import addresses

    original = addresses.blocked_reason
    monkeypatch.setattr(
        addresses, "blocked_reason", lambda ip: None if str(ip) == "127.0.0.1" else original(ip)
    )


@pytest.mark.usefixtures("loopback_is_public")
@pytest.mark.parametrize(
    ("path", "reason"),
    [("/to-private", "private"), ("/to-metadata", "metadata"), ("/to-file", "scheme")],
)
def test_redirect_to_a_blocked_address_is_refused(site: WebSite, path: str, reason: str) -> None:
    resolver = resolver_to("127.0.0.1")
    error = fails(f"http://site.example:{site.port}{path}", allow_private=False, resolver=resolver)
    assert error.refused and reason in str(error)


@pytest.mark.usefixtures("loopback_is_public")
def test_connects_to_the_checked_address_with_the_host_header(site: WebSite) -> None:
    calls: list[str] = []

    async def rebinding(host: str, port: int) -> list[str]:
        calls.append(host)  # a second answer would point elsewhere: it is never asked for
        return ["127.0.0.1"] if len(calls) == 1 else ["10.0.0.1"]

    url = f"http://news.example:{site.port}/article.html"
    result = run(fetch(url, allow_private=False, resolver=rebinding))
    assert result.status == 200 and result.url == url and calls == ["news.example"]
    assert site.seen[-1].headers["Host"] == f"news.example:{site.port}"


# --- fetching ----------------------------------------------------------------------------------


def test_allow_private_reads_the_local_site(site: WebSite) -> None:
    result = run(fetch(site.url + "/article.html"))
    assert result.status == 200 and result.content_type == "text/html"
    assert result.charset == "utf-8" and "Thomas Hale" in result.text()
    assert "Zürich" in result.text()


def test_redirect_chain_is_followed_and_capped(site: WebSite) -> None:
    result = run(fetch(site.url + "/redirect/4"))
    assert result.url.endswith("/article.html") and "Thomas Hale" in result.text()
    error = fails(site.url + "/redirect/4", max_redirects=3)
    assert "redirects" in str(error) and not error.retryable
    assert "redirects" in str(fails(site.url + "/loop"))


def test_content_types(site: WebSite) -> None:
    assert run(fetch(site.url + "/notes.txt")).text() == NOTES
    assert run(fetch(site.url + "/paper.pdf")).body.startswith(b"%PDF-")
    assert run(fetch(site.url + "/data.json")).content_type == "application/json"
    error = fails(site.url + "/photo.png")
    assert "image/png" in str(error) and not error.retryable and not error.refused


def test_size_caps(site: WebSite) -> None:
    error = fails(site.url + "/bomb", max_decoded_bytes=1_000_000)
    assert "decompressed" in str(error)
    assert "too large" in str(fails(site.url + "/huge", max_bytes=100_000))
    assert len(run(fetch(site.url + "/huge")).body) == 300_000


def test_timeouts_and_retries(site: WebSite) -> None:
    error = fails(site.url + "/slow", timeout=0.3, retry=RetryPolicy(attempts=2, base=0.0))
    assert isinstance(error, FetchTimeout) and "2 attempts" in str(error)
    assert "Thomas Hale" in run(fetch(site.url + "/flaky")).text()
    assert site.hits["/flaky"] == 3
    error = fails(site.url + "/missing")
    assert "HTTP 404" in str(error) and site.hits["/missing"] == 1  # not retried


def test_https_verifies_the_real_host_name(tmp_path: Path) -> None:
    pair = make_cert(tmp_path, "secure.example")
    if pair is None:
        pytest.skip("openssl is not available")
    trusted = ssl.create_default_context(cafile=str(pair[0]))
    with WebSite(tls=pair) as secure:
        url = f"https://secure.example:{secure.port}/article.html"
        result = run(fetch(url, resolver=resolver_to("127.0.0.1"), verify=trusted))
        assert "Thomas Hale" in result.text()
        assert secure.seen[-1].headers["Host"] == f"secure.example:{secure.port}"
        wrong = f"https://other.example:{secure.port}/article.html"
        error = fails(wrong, resolver=resolver_to("127.0.0.1"), verify=trusted)
        assert "other.example" in str(error) and not error.retryable  # the cert names another


# --- readers -----------------------------------------------------------------------------------


def test_fetch_reader_html_pdf_text(site: WebSite) -> None:
    async def read_all() -> list[Any]:
        reader = FetchReader(allow_private=True, retry=FAST)
        try:
            return [await reader.read(site.url + p) for p in ("/article.html", "/paper.pdf")]
        finally:
            await reader.aclose()

    article, pdf = run(read_all())
    assert article.title == "Rivermouth Lighthouse"
    assert article.text.startswith("# Rivermouth Lighthouse")
    assert "## Keepers" in article.text and "| 1968 | Light automated | 14,500 |" in article.text
    assert "東京から来た訪問者" in article.text and "Jörg Åkesson" in article.text
    for chrome in ("Log in", "Donate", "Cookie settings", "analytics", "font-family"):
        assert chrome not in article.text
    assert pdf.title == "Harbour Report"
    assert all(line in pdf.text for line in PDF_LINES)


def test_html_falls_back_to_lxml(monkeypatch: pytest.MonkeyPatch) -> None:
    import trafilatura

    monkeypatch.setattr(trafilatura, "extract", lambda *a, **k: None)
    page = html_to_page(ARTICLE, "http://x.example/a")
    assert "Thomas Hale" in page.text and "14,500" in page.text
    for chrome in ("Log in", "Donate", "Cookie settings", "analytics"):
        assert chrome not in page.text


def test_jina_reader(site: WebSite) -> None:
    async def read(key: str | None, url: str) -> Any:
        reader = JinaReader(key, base_url=site.url + "/jina", retry=FAST)
        try:
            return await reader.read(url)
        finally:
            await reader.aclose()

    page = run(read("jina-key", "https://example.org/lighthouse?x=1"))
    assert page.title == "Rivermouth Lighthouse" and "Thomas Hale" in page.text
    assert site.seen[-1].path == "/jina/https://example.org/lighthouse?x=1"
    assert site.seen[-1].headers["Authorization"] == "Bearer jina-key"
    with pytest.raises(ProviderError, match="HTTP 401"):
        run(read("wrong-key", "https://example.org/"))
    with pytest.raises(ProviderError) as info:
        run(read("jina-key", "http://169.254.169.254/latest/"))
    assert info.value.refused
    assert "jina-key" not in repr(JinaReader("jina-key"))


# ------------------------------------------------------------------ metadata in every form (issue 43)
def _forms(v4: ipaddress.IPv4Address) -> list[ipaddress.IPv6Address]:
    """The IPv6 forms that carry ``v4``: mapped, IPv4-compatible, 6to4, NAT64 with the
    well-known prefix, the local-use prefix as a /96 and in RFC 6052's /48 layout."""
    n = int(v4)
    local48 = (0x64FF9B0001 << 80) | ((n >> 16) << 64) | ((n & 0xFFFF) << 40)
    return [ipaddress.IPv6Address(x) for x in (
        (0xFFFF << 32) | n, n, (0x2002 << 112) | (n << 80), (0x64FF9B << 96) | n,
        (0x64FF9B0001 << 80) | n, local48)]


@settings(max_examples=60, deadline=None)
@given(v4=st.one_of(
    st.sampled_from(["169.254.169.254", "168.63.129.16", "100.100.100.200", "192.0.0.192"]),
    st.integers(0, 0xFFFF).map(lambda k: f"169.254.{k >> 8}.{k & 0xFF}"),
).map(ipaddress.IPv4Address))
def test_metadata_is_refused_in_every_ipv6_form(v4):
    permissive = AddressPolicy(allow_private=True)
    for ip in [v4, *_forms(v4)]:
        assert permissive.reason(ip) is not None, ip
        assert AddressPolicy().reason(ip) is not None, ip


def test_the_forms_carry_what_they_say():
    assert str(_forms(ipaddress.IPv4Address("169.254.169.254"))[1]) == "::a9fe:a9fe"
    assert str(_forms(ipaddress.IPv4Address("169.254.169.254"))[4]) == "64:ff9b:1::a9fe:a9fe"


def test_azure_wireserver_is_refused_by_default_and_named_in_the_error():
    error = fails("http://168.63.129.16/machine?comp=goalstate")
    assert error.refused and "metadata" in str(error)


@pytest.mark.parametrize("address", ["::8.8.8.8", "64:ff9b:1::808:808"])
def test_deprecated_forms_of_public_addresses_stay_refused_by_default(address):
    assert AddressPolicy().reason(ipaddress.ip_address(address)) is not None
