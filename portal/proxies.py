"""The client's address behind reverse proxies (settings.TRUSTED_PROXIES).

nginx's ``$proxy_add_x_forwarded_for`` appends the address it saw to whatever ``X-Forwarded-For``
the client sent, so only the right end of the header is true: read from the right, skip every hop
that is a trusted proxy, and the first address that is not one is the client. A request that did
not come from a trusted proxy is its own client (REMOTE_ADDR) whatever headers it carries, so a
client cannot pick its own throttle bucket or audit address by sending the header itself."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from django.conf import settings


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        ip = ipaddress.ip_address(text.strip())
    except ValueError:
        return None
    return ip.ipv4_mapped or ip if ip.version == 6 else ip


def address_in(address: str, networks: Iterable[str]) -> bool:
    """Is this address inside one of these addresses/CIDR networks (validated by the settings)?
    An IPv4-mapped IPv6 address (::ffff:127.0.0.1 from a dual-stack socket) counts as its IPv4."""
    ip = _ip(address)
    if ip is None:
        return False
    return any(ip.version == net.version and ip in net for net in map(_network, networks))


def _network(entry: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    return ipaddress.ip_network(entry, strict=False)


def client_address(request) -> str | None:
    """The real client address of a request, or None without a request (CLI commands, tasks)."""
    if request is None:
        return None
    remote = request.META.get("REMOTE_ADDR") or None
    trusted = settings.TRUSTED_PROXIES
    if not remote or not trusted or not address_in(remote, trusted):
        return remote
    hops = [hop.strip() for hop in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",") if hop.strip()]
    address = remote
    for hop in reversed(hops):
        if _ip(hop) is None:
            break  # garbage left of a trusted hop: the last trusted hop is all we know
        address = str(_ip(hop))
        if not address_in(hop, trusted):
            break
    return address
