"""Who a request's client is: its address, believing `X-Forwarded-For` / `X-Real-IP` only from
a peer inside `VKGATE_TRUSTED_PROXY_CIDRS`. Both services name clients this way: the proxy to
throttle invalid keys, the control plane to throttle failed admin authentications.

Addresses are parsed with `socket.inet_pton` into (family, integer) pairs: measured, the
`ipaddress` module spends about 2 µs parsing one address and 1 µs testing it against a
network, which a flood of refused requests would pay on every request; this takes a third.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Mapping, Sequence
from typing import Any

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

UNKNOWN = "unknown"
"""The address of a request whose server named no peer (a Unix socket)."""
IPV6_PREFIX = 64
# One IPv6 host is usually given a whole /64: throttling each /128 apart would let it present
# a fresh address, with a fresh bucket, for every attempt.

Address = tuple[int, int]
"""An IP address as (4 or 6, its value); an IPv4-mapped IPv6 address is its IPv4 address."""


class TrustedProxies:
    """Networks whose peers' forwarding headers name the client, compiled for quick tests."""

    __slots__ = ("_networks",)

    def __init__(self, networks: Sequence[IPNetwork]) -> None:
        self._networks = tuple(
            (n.version, int(n.network_address), int(n.netmask)) for n in networks
        )

    def __bool__(self) -> bool:
        return bool(self._networks)

    def __contains__(self, address: Address) -> bool:
        version, value = address
        # A loop: measured, `any()` over a generator costs several times as much.
        for v, net, mask in self._networks:  # noqa: SIM110
            if v == version and value & mask == net:
                return True
        return False


def client_address(scope: Mapping[str, Any], trusted: TrustedProxies | Sequence[IPNetwork]) -> str:
    """The address of the request's client.

    The server's peer, unless the peer is a trusted proxy: then the right-most address of
    `X-Forwarded-For` that is not itself trusted (every hop to its right was appended by a
    proxy we trust, and anything to its left the client may have written), else `X-Real-IP`.
    A malformed value is ignored, and the peer answered. With nothing trusted no header is read.
    """
    if not trusted:
        client = scope.get("client")
        return client[0] if client else UNKNOWN
    found = client_of(
        scope, trusted if isinstance(trusted, TrustedProxies) else TrustedProxies(trusted)
    )
    return found if isinstance(found, str) else format_ip(found)


def client_of(scope: Mapping[str, Any], trusted: TrustedProxies) -> Address | str:
    """The client's address; the peer as the server named it when that is no IP address."""
    client = scope.get("client")
    peer: str = client[0] if client else UNKNOWN
    peer_ip = parse_ip(peer)
    if peer_ip is None:
        return peer
    if not trusted or peer_ip not in trusted:
        return peer_ip
    forwarded: list[bytes] = []
    real_ip: bytes | None = None
    for name, value in scope["headers"]:
        if name == b"x-forwarded-for":
            forwarded.append(value)  # several headers are one list, in order (RFC 9110)
        elif name == b"x-real-ip":
            real_ip = value
    found: Address | None = None
    if forwarded:
        found = _right_most_untrusted(b",".join(forwarded).decode("latin-1"), trusted)
    elif real_ip is not None:
        found = parse_ip(real_ip.decode("latin-1").strip())
    return found if found is not None else peer_ip


def _right_most_untrusted(header: str, trusted: TrustedProxies) -> Address | None:
    """The client an `X-Forwarded-For` chain names; None when the part we read is malformed."""
    hop: Address | None = None
    for item in reversed(header.split(",")):
        hop = parse_ip(item.strip())
        if hop is None:
            # Written by a proxy we trust, yet unreadable: believe nothing of this chain.
            return None
        if hop not in trusted:
            return hop
    # Every hop is trusted: the request began inside, and the left-most one is its client.
    return hop


def parse_ip(text: str) -> Address | None:
    """An IP address as proxies write it (`1.2.3.4`, `1.2.3.4:5678`, `[2001:db8::1]:443`).

    An IPv4-mapped IPv6 address (a dual-stack listener's `::ffff:1.2.3.4`) is its IPv4 address,
    so one client has one name whichever socket it came through. A zone id (`%eth0`) names an
    interface, not a client, and is dropped.
    """
    if text.startswith("["):
        end = text.find("]")
        if end < 0 or not _port_or_nothing(text[end + 1 :]):
            return None
        text = text[1:end]
    elif text.count(":") == 1:
        text, _, port = text.partition(":")
        if not _port_or_nothing(":" + port):
            return None
    try:
        if ":" in text:
            value = int.from_bytes(socket.inet_pton(socket.AF_INET6, text.partition("%")[0]))
            if value >> 32 == 0xFFFF:
                return 4, value & 0xFFFF_FFFF
            return 6, value
        return 4, int.from_bytes(socket.inet_pton(socket.AF_INET, text))
    except (OSError, ValueError):  # malformed; ValueError: a NUL or a non-ASCII character
        return None


def _port_or_nothing(rest: str) -> bool:
    return not rest or (rest[0] == ":" and rest[1:].isascii() and rest[1:].isdigit())


def format_ip(address: Address) -> str:
    """The canonical text of an address (IPv6 compressed and in lower case)."""
    version, value = address
    if version == 4:
        return socket.inet_ntop(socket.AF_INET, value.to_bytes(4))
    return socket.inet_ntop(socket.AF_INET6, value.to_bytes(16))


def throttle_key(address: Address | str) -> str:
    """What the throttle counts by: the address, or for IPv6 the /64 it belongs to."""
    if isinstance(address, str):
        parsed = parse_ip(address)
        if parsed is None:
            return address
        address = parsed
    version, value = address
    if version == 6:
        shift = 128 - IPV6_PREFIX
        return f"{format_ip((6, value >> shift << shift))}/{IPV6_PREFIX}"
    return format_ip(address)
