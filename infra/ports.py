"""Port probing for the local services.

A port for a process that binds it later comes from outside the kernel's ephemeral range: a port the kernel
handed out and we released can be taken, before our process binds it, as the local end of any outbound
connection (a Kafka client's, a database driver's), and then stays taken as long as that connection lives (a
chaos run's gateway failed to bind for two minutes that way)."""
from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LISTEN_FLOOR = 10_000  # below: ports that well-known local services (and Postgres' 5432 family) use
_handed_out: set[int] = set()


def is_port_open(port: int, host: str = "127.0.0.1") -> bool:
    """True when something accepts TCP connections on host:port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.3)
        return sock.connect_ex((host, port)) == 0


def can_bind(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def ephemeral_range() -> tuple[int, int]:
    try:
        low, high = (int(part) for part in EPHEMERAL_RANGE.read_text().split())
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default
    return low, high


def listen_ranges() -> list[range]:
    """The ports outside the ephemeral range, above LISTEN_FLOOR."""
    low, high = ephemeral_range()
    ranges = [range(LISTEN_FLOOR, low), range(high + 1, 65536)]
    return [r for r in ranges if len(r) > 0]


def listen_port(host: str = "127.0.0.1", rng: random.Random | None = None) -> int:
    """A port nobody binds now, outside the ephemeral range, never handed out before by this process.

    Random rather than sequential, so that processes picking at the same time rarely pick the same one."""
    rng = rng or random.SystemRandom()
    ranges = listen_ranges()
    for _ in range(512):
        span = rng.choices(ranges, weights=[len(r) for r in ranges])[0]
        port = rng.choice(span)
        if port not in _handed_out and can_bind(port, host):
            _handed_out.add(port)
            return port
    raise OSError("no free TCP port outside the ephemeral range")


def free_port(preferred: int, host: str = "127.0.0.1") -> int:
    """`preferred` when it can be bound, else a free port outside the ephemeral range."""
    if preferred and can_bind(preferred, host):
        return preferred
    return listen_port(host)
