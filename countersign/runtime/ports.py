"""Small helpers for local processes: free ports and waiting for a port to accept connections."""

from __future__ import annotations

import random
import socket
import time
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
BELOW_EPHEMERAL = 10_000  # the lowest port handed out; above the well-known and most registered ones


def _ephemeral_start() -> int:
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now, for a process started next to bind.

    Chosen at random below the kernel's ephemeral range, not by binding port 0: that hands out a
    port from the ephemeral range, which every outgoing connection on the machine draws from too,
    so in the moment before the process binds it, a client socket (a test's, a browser's) could
    take it ("port … is taken by a process this stack did not start"). Below the range only
    another explicit bind can take it."""
    top = _ephemeral_start()
    for _ in range(100) if top > BELOW_EPHEMERAL + 1_000 else ():
        port = random.randrange(BELOW_EPHEMERAL, top)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # no room below the range
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def wait_for_port(host: str, port: int, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if port_open(host, port):
            return
        time.sleep(0.1)
    raise TimeoutError(f"{what} did not listen on {host}:{port} within {timeout_s:.0f}s")
