"""Which addresses a chat channel may be posted to (issue 53, item 7): public ones only, unless the
operator allowed a self-hosted bot API by name, `host:port` or CIDR range.

A channel's endpoint is typed by a tenant's admin, and each post carries the bot's token in its path:
an endpoint on loopback, a private network or a link-local address (169.254.169.254, the cloud's
metadata service) would turn the server and the worker into a way to reach what only they can reach.
Pure: the caller resolves the name (countersign.runtime.endpoints) and asks about each address.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class Allowed:
    """The operator's allow-list (COUNTERSIGN_CHANNEL_ALLOW): host names, `host:port` and ranges."""

    hosts: frozenset[str] = frozenset()
    host_ports: frozenset[tuple[str, int]] = frozenset()
    networks: tuple[IpNetwork, ...] = ()

    def names(self, host: str, port: int) -> bool:
        """The URL's own host (a name or an address literal), with or without its port."""
        host = host.lower().strip("[]")
        return host in self.hosts or (host, port) in self.host_ports

    def holds(self, address: IpAddress) -> bool:
        return any(address in network for network in self.networks)


def allowed_from(spec: str | None) -> Allowed:
    """Read the allow-list; ValueError naming an entry that is neither a host, `host:port` nor a
    CIDR range (a typo must not silently allow nothing, nor everything)."""
    hosts: set[str] = set()
    host_ports: set[tuple[str, int]] = set()
    networks: list[IpNetwork] = []
    for raw in (spec or "").split(","):
        entry = raw.strip().lower()
        if not entry:
            continue
        if "/" in entry:
            try:
                networks.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                raise ValueError(f"COUNTERSIGN_CHANNEL_ALLOW: {entry!r} is not a CIDR range") from None
            continue
        if entry.startswith("[") and "]:" in entry:  # [IPv6]:port
            host, port = entry[1:].split("]:", 1)
        elif entry.count(":") == 1:  # name:port or IPv4:port (a bare IPv6 address has more)
            host, port = entry.split(":")
        else:
            hosts.add(entry.strip("[]"))
            continue
        if not port.isdigit() or not 0 < int(port) < 65_536 or not host:
            raise ValueError(f"COUNTERSIGN_CHANNEL_ALLOW: {entry!r} is not host:port")
        host_ports.add((host, int(port)))
    return Allowed(frozenset(hosts), frozenset(host_ports), tuple(networks))


def public(address: IpAddress) -> bool:
    """Reachable on the internet: not loopback, private, link-local, multicast, reserved or
    unspecified (an IPv4 address mapped into IPv6 is judged as itself)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_global and not address.is_multicast


def refusal(host: str, port: int, addresses: list[IpAddress], allowed: Allowed) -> str | None:
    """Why an endpoint on `host:port`, resolving to `addresses`, may not be posted to; None when it
    may (every address public, or the operator allowed the host, the host:port or the range). A
    name that resolves to nothing is not judged: nothing can connect to it (the post fails as
    unreachable), and the post checks it again once it resolves."""
    if allowed.names(host, port):
        return None
    for address in addresses:
        if not public(address) and not allowed.holds(address):
            return (
                f"the channel's endpoint is not a public address ({host} is {address}); an operator "
                "can allow a self-hosted bot API with COUNTERSIGN_CHANNEL_ALLOW"
            )
    return None
