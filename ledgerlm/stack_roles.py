"""Which role processes `ledgerlm up --gateways N --workers N --controllers N --projectors N [--export S]`
starts, and the ports each one opens.

    name            command                                     port (preferred; the next free one if taken)
    controller-i    ledgerlm controller                          metrics 9100+i-1  (/metrics /healthz /readyz)
    worker-i        ledgerlm worker --worker-id local-worker-i   metrics 9200+i-1
    projector-i     ledgerlm project                             metrics 9300+i-1
    gateway-i       ledgerlm gateway --port P                    HTTP gateway_port+i-1 (8080, 8081, ...; its
                                                                 /metrics on the same port)
    intake-i        ledgerlm intake --index i-1                  metrics 9400+i-1 (instance id intake-<host>-<i-1>)
    export-S        ledgerlm export --sink S                     metrics 9500+i-1, the i-th `--export` (none unless
                                                                 asked: a sink must be configured first)

A role's metrics port set in the environment (LEDGERLM_CONTROLLER_METRICS_PORT, ...) replaces the base.
Every instance of a kind joins the same consumer group: controllers split `llm.commands` partitions,
projectors split the projected topics' partitions, workers register under distinct stable ids, and
gateways are stateless (any of them serves any request); intakes split tenants' request topics in their
group (0 of them with `--no-intake`); each exporter is its sink's whole consumer group.
"""
from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass, field

from infra.ports import listen_port
from plumbing.settings import Settings

KINDS = ("controller", "worker", "projector", "gateway", "intake", "export")  # start order; `down` stops in reverse
METRICS_BASE = {"controller": 9100, "worker": 9200, "projector": 9300, "intake": 9400, "export": 9500}
MAX_INSTANCES = 16
READY_LOG = {"controller": "controller owns partitions", "worker": "worker ready", "intake": "intake started",
             "export": "metrics listening"}
OPTIONAL = {"intake", "export"}  # a kind that may run 0 times
SINKS = ("kafka", "openmeter", "stripe", "lago")  # projections/export/sinks/factory.py


@dataclass(frozen=True)
class RoleCounts:
    """How many processes of each role; every role but the intake runs at least once. `exports`: the sinks
    to run an exporter for, one each (none by default)."""

    gateways: int = 1
    workers: int = 1
    controllers: int = 1
    projectors: int = 1
    intakes: int = 1
    exports: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        unknown = [sink for sink in self.exports if sink not in SINKS]
        if unknown or len(set(self.exports)) < len(self.exports):
            raise ValueError(f"--export takes each of {', '.join(SINKS)} at most once, not {list(self.exports)}")
        for kind in KINDS:
            n, least = self.of(kind), 0 if kind in OPTIONAL else 1
            if not least <= n <= MAX_INSTANCES:
                raise ValueError(f"--{kind}s must be between {least} and {MAX_INSTANCES}, not {n}")

    def of(self, kind: str) -> int:
        return len(self.exports) if kind == "export" else getattr(self, f"{kind}s")


@dataclass(frozen=True)
class RoleProcess:
    """One process to start: its name in stack.json, its CLI arguments, the port it opens and its extra env."""

    name: str
    kind: str
    args: tuple[str, ...]
    port: int
    env: dict[str, str] = field(default_factory=dict)

    @property
    def ready_log(self) -> str | None:
        return READY_LOG.get(self.kind)


def port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


class PortPicker:
    """Preferred ports when free, else free ones outside the ephemeral range; never the same port twice (the processes it picks for
    have not bound theirs yet, so the OS cannot tell)."""

    def __init__(self, is_free: Callable[[int], bool] = port_is_free,
                 any_port: Callable[[], int] = listen_port) -> None:
        self.is_free, self.any_port = is_free, any_port
        self.taken: set[int] = set()

    def take(self, preferred: int) -> int:
        port = preferred if preferred and preferred not in self.taken and self.is_free(preferred) else 0
        while not port or port in self.taken:
            port = self.any_port()
        self.taken.add(port)
        return port


def metrics_base(settings: Settings, kind: str) -> int:
    return getattr(settings, f"{kind}_metrics_port") or METRICS_BASE[kind]


def plan_roles(settings: Settings, counts: RoleCounts, model: str, ports: PortPicker | None = None
               ) -> list[RoleProcess]:
    """Every process, in start order (controllers, workers, projectors, gateways, intakes, exporters)."""
    ports = ports or PortPicker()
    planned = []
    for kind in KINDS:
        for i in range(1, counts.of(kind) + 1):
            if kind == "gateway":
                port = ports.take(settings.gateway_port + i - 1)
                planned.append(RoleProcess(f"gateway-{i}", kind, ("gateway", "--port", str(port)), port))
                continue
            port = ports.take(metrics_base(settings, kind) + i - 1)
            if kind == "export":
                sink = counts.exports[i - 1]
                planned.append(RoleProcess(f"export-{sink}", kind, ("export", "--sink", sink), port,
                                           {"LEDGERLM_EXPORT_METRICS_PORT": str(port)}))
                continue
            args = {"controller": ("controller",), "projector": ("project",),
                    "intake": ("intake", "--index", str(i - 1)),
                    "worker": ("worker", "--model-version", model, "--worker-id", f"local-worker-{i}")}[kind]
            planned.append(RoleProcess(f"{kind}-{i}", kind, args, port,
                                       {f"LEDGERLM_{kind.upper()}_METRICS_PORT": str(port)}))
    return planned


def kind_of(name: str) -> str:
    """`gateway-2` -> `gateway`, `export-kafka` -> `export` (a stack.json written before instances were
    numbered says `gateway`)."""
    if name.startswith("export-"):
        return "export"
    return name.rsplit("-", 1)[0] if name.rsplit("-", 1)[-1].isdigit() else name


def stop_order(names: list[str]) -> list[str]:
    """Exporters first (they only read), then intakes and gateways (no new requests), controllers last (they
    interrupt what lost workers ran)."""
    rank = {kind: n for n, kind in enumerate(reversed(KINDS))}
    return sorted(names, key=lambda name: (rank.get(kind_of(name), -1), name))
