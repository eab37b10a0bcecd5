"""The address policy: which IP addresses a page may be fetched from, when a model chooses the
URLs (:class:`AddressPolicy`; the safe fetcher of :mod:`drvenus.tools.web` enforces it).

Private, loopback, link-local, unspecified, multicast, reserved and shared addresses are refused
unless private ones are allowed; cloud metadata addresses (:func:`is_metadata`, IPv4-mapped,
IPv4-compatible, 6to4, Teredo and NAT64 forms included, the local-use NAT64 prefix too) stay
refused even then, unless named in the policy's
allow list. The standard library only.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# Cloud instance metadata services (most also fall in blocked ranges; named for clear errors).
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a)
    for a in (
        "169.254.169.254",  # AWS, GCP, Azure, OpenStack, DigitalOcean, ...
        "169.254.170.2",  # AWS ECS task metadata
        "169.254.169.253",  # AWS DNS
        "fd00:ec2::254",  # AWS IPv6
        "fd00:ec2::23",  # AWS IPv6 DNS
        "100.100.100.200",  # Alibaba Cloud
        "192.0.0.192",  # Oracle Cloud
        "168.63.129.16",  # Azure WireServer (a public address: refused by name)
    )
)
# The IPv4 link-local range the metadata services of AWS (EC2, ECS), Azure, GCP and OpenStack
# answer in: all of it counts as metadata, refused even where private addresses are allowed.
METADATA_NETWORKS = (ipaddress.ip_network("169.254.0.0/16"),)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")  # RFC 8215's local-use NAT64 prefix
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")  # RFC 4291's deprecated ::a.b.c.d


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> tuple[ipaddress.IPv4Address, ...]:
    """The IPv4 addresses an IPv6 one may carry (mapped, 6to4, Teredo client, NAT64 with the
    well-known or the local-use prefix, IPv4-compatible); none for a plain IPv6 address."""
    if ip.ipv4_mapped is not None:
        return (ip.ipv4_mapped,)
    if ip.sixtofour is not None:
        return (ip.sixtofour,)
    if ip.teredo is not None:
        return (ip.teredo[1],)
    n = int(ip)
    if ip in _NAT64:
        return (ipaddress.IPv4Address(n & 0xFFFFFFFF),)
    if ip in _NAT64_LOCAL:  # a /96 inside it (the last 32 bits), or RFC 6052's /48 layout
        rfc6052 = ((n >> 64) & 0xFFFF) << 16 | ((n >> 40) & 0xFFFF)
        return (ipaddress.IPv4Address(n & 0xFFFFFFFF), ipaddress.IPv4Address(rfc6052))
    if ip in _IPV4_COMPATIBLE and n > 1:  # :: and ::1 are themselves
        return (ipaddress.IPv4Address(n),)
    return ()


def _unscoped(ip: IPAddress) -> IPAddress:
    if isinstance(ip, ipaddress.IPv6Address) and ip.scope_id:
        return ipaddress.IPv6Address(str(ip).split("%", 1)[0])
    return ip


def is_metadata(ip: IPAddress) -> bool:
    """Whether ``ip`` is a cloud metadata address (or in the link-local range they live in),
    in any IPv6 form that carries one."""
    ip = _unscoped(ip)
    if isinstance(ip, ipaddress.IPv6Address) and any(map(is_metadata, _embedded_ipv4(ip))):
        return True
    return ip in METADATA_ADDRESSES or any(ip in net for net in METADATA_NETWORKS)


def blocked_reason(ip: IPAddress) -> str | None:
    """Why ``ip`` must not be fetched from (a short phrase), or None for a public address."""
    if isinstance(ip, ipaddress.IPv6Address):
        ip = _unscoped(ip)
        inner = _embedded_ipv4(ip)
        if inner:
            reason = next((r for r in map(blocked_reason, inner) if r), None)
            if reason:
                return f"{reason} (embedded in {ip})"
            if ip not in _IPV4_COMPATIBLE and ip not in _NAT64_LOCAL:
                return None  # the IPv4 address it reaches is public
            # a deprecated or local-use form: its own reason below (reserved, ...)
    checks = (
        (ip in METADATA_ADDRESSES, "a cloud metadata address"),
        (ip.is_loopback, "a loopback address"),
        (ip.is_link_local, "a link-local address"),
        (ip.is_unspecified, "an unspecified address"),
        (ip.is_multicast, "a multicast address"),
        (ip.is_reserved, "a reserved address"),
        (ip.is_private, "a private address"),
        (not ip.is_global, "not a public address"),
    )
    return next((reason for hit, reason in checks if hit), None)


def parse_networks(text: str | None) -> frozenset[IPNetwork]:
    """``"169.254.169.254, 10.1.0.0/16"`` as networks (an address is a one-address network);
    ValueError naming the entry that is neither."""
    networks = set()
    for part in (text or "").split(","):
        if part.strip():
            try:
                networks.add(ipaddress.ip_network(part.strip().strip("[]"), strict=False))
            except ValueError:
                raise ValueError(f"{part.strip()!r} is not an IP address or network") from None
    return frozenset(networks)


@dataclass(frozen=True)
class AddressPolicy:
    """Which addresses pages may be fetched from (a model chooses the URLs).

    By default only public addresses. ``allow_private``: also private, loopback, link-local
    and other non-public ones (tests, intranet use), but still not the cloud metadata
    addresses (:func:`is_metadata`). ``allowed``: addresses and networks allowed whatever
    they are, the only way to reach a metadata address (named explicitly, e.g. 169.254.169.254).
    """

    allow_private: bool = False
    allowed: frozenset[IPNetwork] = frozenset()

    @classmethod
    def of(cls, allow_private: bool = False, allowed: str | None = None) -> AddressPolicy:
        """The policy of the settings' ``allow_private_urls`` and ``allowed_addresses``."""
        return cls(allow_private, parse_networks(allowed))

    def reason(self, ip: IPAddress) -> str | None:
        """Why ``ip`` is refused under this policy (a short phrase), or None when allowed."""
        ip = _unscoped(ip)
        if any(ip.version == net.version and ip in net for net in self.allowed):
            return None
        if is_metadata(ip):
            return blocked_reason(ip) or "a cloud metadata address"
        return None if self.allow_private else blocked_reason(ip)

    @property
    def key(self) -> str:
        """A short text naming the policy (part of every page cache key: a page read under
        one policy is never served under another)."""
        key = "private" if self.allow_private else "public"
        if self.allowed:
            key += "+" + ",".join(sorted(str(net) for net in self.allowed))
        return key

    def advice(self, ip: IPAddress) -> str:
        """How the refused ``ip`` could be allowed (for the text the agent and user read)."""
        if is_metadata(ip):
            return ("cloud metadata addresses stay refused even with --allow-private-urls; name "
                    "one in DRVENUS_ALLOWED_ADDRESSES to allow it")
        return "private addresses are refused unless --allow-private-urls is given"



__all__ = [
    "METADATA_ADDRESSES",
    "METADATA_NETWORKS",
    "AddressPolicy",
    "IPAddress",
    "IPNetwork",
    "blocked_reason",
    "is_metadata",
    "parse_networks",
]
