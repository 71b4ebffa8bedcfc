"""What `infra up` started, so `down` stops only that (`.ledgerlm/services.json`)."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass
class ServiceRecord:
    pid: int | None = None
    port: int | None = None
    extra: dict[str, int | str] = field(default_factory=dict)


@dataclass
class ServicesState:
    kafka: ServiceRecord = field(default_factory=ServiceRecord)
    postgres: ServiceRecord = field(default_factory=ServiceRecord)
    kafka_brokers: list[ServiceRecord] = field(default_factory=list)  # a multi-broker cluster, broker 1 first

    @classmethod
    def load(cls, path: Path) -> "ServicesState":
        if not path.exists():
            return cls()
        raw = json.loads(path.read_text())
        return cls(**{name: ServiceRecord(**raw.get(name, {})) for name in ("kafka", "postgres")},
                   kafka_brokers=[ServiceRecord(**broker) for broker in raw.get("kafka_brokers", [])])

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        tmp.replace(path)
