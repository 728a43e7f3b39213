"""A chat channel's endpoint, checked where it is saved and again where it is posted to, after its
name is resolved (countersign.core.addresses says which addresses are public or allowed).

The allow-list is COUNTERSIGN_CHANNEL_ALLOW, read from the environment of the process at each check,
so every process that saves a channel or posts to one (the server, the worker, the CLI) follows the
same list the operator set for it.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket
from urllib.parse import urlsplit

from countersign.core.addresses import IpAddress, allowed_from, refusal

ALLOW_ENV = "COUNTERSIGN_CHANNEL_ALLOW"
RESOLVE_TIMEOUT_S = 5.0


class EndpointRefused(ValueError):
    """The endpoint is not public and not allowed (the message names the host, never the URL's
    path or query, which may hold a token)."""


async def addresses_of(host: str, port: int) -> list[IpAddress]:
    """Every address `host` resolves to (itself when it is an address literal)."""
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    loop = asyncio.get_running_loop()
    try:
        infos = await asyncio.wait_for(
            loop.getaddrinfo(host, port, type=socket.SOCK_STREAM), RESOLVE_TIMEOUT_S
        )
    except (OSError, TimeoutError, UnicodeError):
        return []
    return [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]


async def check_endpoint(url: str) -> None:
    """Refuse (EndpointRefused) an endpoint whose host is not public nor allowed by the operator.
    A URL without a host that parses is not judged: nothing can connect to it either."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:  # not a URL: nothing can be sent to it (the post fails as unreachable)
        return
    if not host:
        return
    try:
        allowed = allowed_from(os.environ.get(ALLOW_ENV))
    except ValueError as err:  # the operator's list is wrong: nothing is allowed past it
        raise EndpointRefused(str(err)) from None
    reason = refusal(host, port, await addresses_of(host, port), allowed)
    if reason is not None:
        raise EndpointRefused(reason)
