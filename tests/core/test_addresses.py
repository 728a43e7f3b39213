"""Which addresses a chat channel may be posted to (issue 53, item 7): public ones, and what the
operator allowed by name, host:port or range."""

from __future__ import annotations

import ipaddress

import pytest

from countersign.core.addresses import allowed_from, refusal

NONE = allowed_from(None)


def ips(*texts: str) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    return [ipaddress.ip_address(t) for t in texts]


@pytest.mark.parametrize(
    "address",
    ["127.0.0.1", "10.1.2.3", "172.16.0.9", "192.168.1.1", "169.254.169.254", "0.0.0.0", "::1",
     "fe80::1", "fd00::1", "::ffff:127.0.0.1", "100.64.0.1", "224.0.0.1"],
)  # fmt: skip
def test_an_address_that_is_not_public_is_refused(address: str) -> None:
    reason = refusal("h", 443, ips(address), NONE)
    assert reason is not None and "COUNTERSIGN_CHANNEL_ALLOW" in reason


def test_public_addresses_pass_and_one_private_among_them_is_enough_to_refuse() -> None:
    assert refusal("api.telegram.org", 443, ips("149.154.167.220", "2001:67c:4e8:f004::9"), NONE) is None
    assert refusal("h", 443, ips("149.154.167.220", "127.0.0.1"), NONE) is not None
    assert refusal("h", 443, [], NONE) is None  # nothing to connect to: the post checks again


def test_the_operator_allows_by_range_host_or_host_and_port() -> None:
    allowed = allowed_from(" 127.0.0.0/8, bots.internal ,10.0.0.5:8081,[::1]:9000")
    assert refusal("x", 80, ips("127.0.0.1"), allowed) is None
    assert refusal("bots.internal", 443, ips("10.9.9.9"), allowed) is None
    assert refusal("10.0.0.5", 8081, ips("10.0.0.5"), allowed) is None
    assert refusal("10.0.0.5", 8082, ips("10.0.0.5"), allowed) is not None  # another port
    assert refusal("[::1]", 9000, ips("::1"), allowed) is None
    assert refusal("y", 80, ips("169.254.169.254"), allowed) is not None


@pytest.mark.parametrize("spec", ["10.0.0.0/33", "host:port", ":80", "host:99999"])
def test_a_wrong_entry_is_an_error_not_a_silent_allow(spec: str) -> None:
    with pytest.raises(ValueError, match="COUNTERSIGN_CHANNEL_ALLOW"):
        allowed_from(spec)
