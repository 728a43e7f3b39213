"""free_port chooses below the kernel's ephemeral range, where no outgoing connection takes it."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from countersign.runtime import ports


def test_a_free_port_is_below_the_ephemeral_range_and_bindable() -> None:
    top = ports._ephemeral_start()
    for _ in range(50):
        port = ports.free_port()
        assert ports.BELOW_EPHEMERAL <= port < top
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", port))


def test_without_room_below_the_range_any_free_port_is_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "range").write_text("10100\t60999\n")
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE", tmp_path / "range")
    assert ports._ephemeral_start() == 10_100
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", ports.free_port()))
