"""Ports for processes that bind later come from outside the kernel's ephemeral range and never twice."""
from __future__ import annotations

import random
import socket

from infra.ports import ephemeral_range, free_port, listen_port, listen_ranges


def test_a_listen_port_is_outside_the_ephemeral_range_and_bindable():
    low, high = ephemeral_range()
    ports = [listen_port(rng=random.Random(seed)) for seed in range(40)]
    assert all(not low <= port <= high for port in ports), ports
    assert len(set(ports)) == len(ports)  # never handed out twice, even by the same draw
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", ports[0]))


def test_a_port_in_use_is_never_handed_out():
    with socket.socket() as held:
        held.bind(("127.0.0.1", listen_port()))
        held.listen()
        busy = held.getsockname()[1]
        assert free_port(busy) != busy
        assert busy not in {listen_port() for _ in range(200)}


def test_a_free_preferred_port_is_kept():
    port = listen_port()
    assert free_port(port) == port
