"""Where the site may send a request of a team's choosing (a webhook's endpoint, an upstream MCP
server): public addresses only, checked when the URL is registered and again at each request (a
name may be pointed elsewhere later), unless GRUNDLAG_WEBHOOK_ALLOW_PRIVATE; the request then goes
to the address checked (``pinned``), so that DNS rebinding cannot lead it into the site's own
network."""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

from django.conf import settings

# IPv6 forms that carry an IPv4 address, which a gateway, a tunnel or the host's own stack may
# deliver to: Python's is_global judges the IPv6 prefix (and differs between versions on 6to4
# and Teredo), not the IPv4 address inside, so ::127.0.0.1 and 64:ff9b::a00:5 pass it. An address
# in one of these is as public as the IPv4 address it carries, and no more.
_LAST_32_BITS = (
    ipaddress.IPv6Network("::/96"),  # IPv4-compatible (deprecated, RFC 4291): ::a.b.c.d
    ipaddress.IPv6Network("::ffff:0:0:0/96"),  # SIIT's IPv4-translated (RFC 6145): ::ffff:0:a.b.c.d
    ipaddress.IPv6Network("64:ff9b::/96"),  # NAT64's well-known prefix (RFC 6052)
)
# NAT64's local-use prefix (RFC 8215): a site's own translator, with the IPv4 address wherever the
# site's prefix length puts it, so there is no one place to read it from. Never public.
_LOCAL_NAT64 = ipaddress.IPv6Network("64:ff9b:1::/48")
# Not global, though Python 3.11 calls them so: site-local (deprecated by RFC 3879, and still
# routed inside some networks), the documentation prefix of RFC 9637 and SRv6's SIDs (RFC 9602).
_NOT_GLOBAL = (
    ipaddress.IPv6Network("fec0::/10"),
    ipaddress.IPv6Network("3fff::/20"),
    ipaddress.IPv6Network("5f00::/16"),
)
PRIVATE = (
    "resolves to a private, loopback or link-local address (GRUNDLAG_WEBHOOK_ALLOW_PRIVATE=true allows it)"
)


def _embedded(address: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address] | None:
    """The IPv4 addresses this IPv6 address carries, where it is a form that carries any."""
    if address.ipv4_mapped is not None:  # ::ffff:a.b.c.d
        return [address.ipv4_mapped]
    if address.sixtofour is not None:  # 2002:AABB:CCDD::/48, 6to4 (RFC 3056)
        return [address.sixtofour]
    if address.teredo is not None:
        # 2001::/32 (RFC 4380): the client's address is where the packets go; a relay may ask
        # the server to reach it, so both must be public.
        server, client = address.teredo
        return [server, client]
    if any(address in network for network in _LAST_32_BITS):
        return [ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)]
    if (int(address) >> 32) & 0xFDFFFFFF == 0x5EFE:
        # ISATAP (RFC 5214): any prefix, an interface id of [02]00:5efe:a.b.c.d.
        return [ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)]
    return None


def _public(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Whether a webhook may be sent to this address: a global unicast address, and for an IPv6
    address that carries an IPv4 one (above), that IPv4 address is."""
    if address.is_multicast:
        return False
    if isinstance(address, ipaddress.IPv6Address):
        if address in _LOCAL_NAT64 or any(address in network for network in _NOT_GLOBAL):
            return False
        embedded = _embedded(address)
        if embedded is not None:
            return all(_public(inner) for inner in embedded)
    return address.is_global


def resolve(url: str) -> tuple[str, list[str]]:
    """(why the URL may not be an endpoint, or ""; the addresses it may be sent to)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "the URL must be http:// or https:// with a host", []
    if parts.username or parts.password:
        return "the URL must not carry credentials", []
    if not parts.hostname.isascii():
        # Looked up here by one IDNA, sent by httpx with another: write it as xn--.
        return "the host must be ASCII (write an internationalised name as xn--...)", []
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        infos = socket.getaddrinfo(parts.hostname, port, proto=socket.IPPROTO_TCP)
    except (OSError, ValueError, UnicodeError):
        return f"the host {parts.hostname!r} does not resolve", []
    addresses = list(dict.fromkeys(str(sockaddr[0]) for *_, sockaddr in infos))
    if not settings.GRUNDLAG_WEBHOOK_ALLOW_PRIVATE and not all(
        _public(ipaddress.ip_address(address)) for address in addresses
    ):
        return f"the host {parts.hostname!r} {PRIVATE}", []
    return "", addresses


def url_problem(url: str) -> str:
    """Why the site may not send requests to this URL ("" when it may)."""
    return resolve(url)[0]


def pinned(url: str, address: str) -> tuple[str, str, dict[str, str]]:
    """``url`` with its host replaced by ``address`` (one ``resolve`` gave), the Host header it
    needs, and the request extensions that keep TLS's server name the host's."""
    parts = urlsplit(url)
    netloc = f"[{address}]" if ":" in address else address
    if parts.port:
        netloc += f":{parts.port}"
    extensions = {"sni_hostname": parts.hostname or ""} if parts.scheme == "https" else {}
    return parts._replace(netloc=netloc).geturl(), parts.netloc.rpartition("@")[2], extensions
