"""tools.broker.free_port: listening ports for test servers stay clear of the kernel's
ephemeral range, where a parallel test's outgoing connection could take them."""

from __future__ import annotations

import socket
from pathlib import Path

from tools.broker import free_port


def _ephemeral() -> range:
    low, high = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    return range(low, high + 1)


def test_ports_are_outside_the_ephemeral_range_and_never_handed_out_twice() -> None:
    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)
    eph = _ephemeral()
    assert not [p for p in ports if p in eph]


def test_a_port_in_use_is_not_handed_out() -> None:
    held = []
    try:
        for _ in range(50):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", free_port()))
            s.listen()
            held.append(s)
        taken = {s.getsockname()[1] for s in held}
        assert not taken & {free_port() for _ in range(300)}
    finally:
        for s in held:
            s.close()
