"""`ledgerlm infra up|down|status`: the local Kafka broker and PostgreSQL together.

When `LEDGERLM_KAFKA_BOOTSTRAP` / `LEDGERLM_DATABASE_URL` are set, that
service is external: it is probed, never started or stopped.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from infra.errors import InfraError
from infra.health import kafka_up, postgres_up
from infra.kafka_node import KafkaNode
from infra.postgres_node import PostgresNode
from infra.state import ServicesState
from ledgerlm.settings import Settings


@dataclass(frozen=True)
class Endpoints:
    kafka_bootstrap: str | None
    database_url: str | None


class LocalServices:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.kafka = KafkaNode(settings.home, settings.kafka_heap, settings.kafka_jars)
        self.postgres = PostgresNode(settings.home, settings.postgres_database)

    def endpoints(self) -> Endpoints:
        state = ServicesState.load(self.settings.state_file)
        bootstrap = self.settings.kafka_bootstrap or (
            f"127.0.0.1:{state.kafka.port}" if state.kafka.port else None)
        url = self.settings.database_url or (self.postgres.url(state.postgres.port) if state.postgres.port else None)
        return Endpoints(bootstrap, url)

    def up(self) -> Endpoints:
        """Start whatever is local and not running; wait until both are healthy."""
        state = ServicesState.load(self.settings.state_file)
        timeout = self.settings.startup_timeout_s
        if not self.settings.database_url:
            state.postgres = self.postgres.start(state.postgres, self.settings.postgres_port, timeout)
            state.save(self.settings.state_file)
        if not self.settings.kafka_bootstrap:
            state.kafka = self.kafka.start(state.kafka, self.settings.kafka_port,
                                           self.settings.kafka_controller_port, timeout)
            state.save(self.settings.state_file)
        endpoints = self.endpoints()
        self._wait_healthy(endpoints, timeout)
        return endpoints

    def _wait_healthy(self, endpoints: Endpoints, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        assert endpoints.kafka_bootstrap and endpoints.database_url
        while not kafka_up(endpoints.kafka_bootstrap, timeout_s=3):
            if time.monotonic() > deadline:
                raise InfraError(f"Kafka at {endpoints.kafka_bootstrap} did not list topics within {timeout_s:.0f}s")
            time.sleep(0.3)
        if not postgres_up(endpoints.database_url):
            raise InfraError(f"PostgreSQL at {endpoints.database_url} did not answer SELECT 1")

    def down(self) -> dict[str, bool]:
        """Stop only what `up` started; external services are left alone."""
        state = ServicesState.load(self.settings.state_file)
        stopped = {"kafka": False, "postgres": False}
        if not self.settings.kafka_bootstrap:
            stopped["kafka"] = self.kafka.stop(state.kafka)
            state.kafka.pid = None
        if not self.settings.database_url:
            stopped["postgres"] = self.postgres.stop(state.postgres)
            state.postgres.pid = None
        state.save(self.settings.state_file)
        return stopped

    def status(self) -> dict[str, dict[str, object]]:
        endpoints = self.endpoints()
        return {
            "kafka": {"bootstrap": endpoints.kafka_bootstrap,
                      "up": bool(endpoints.kafka_bootstrap) and kafka_up(endpoints.kafka_bootstrap, timeout_s=3),
                      "external": bool(self.settings.kafka_bootstrap)},
            "postgres": {"url": endpoints.database_url,
                         "up": bool(endpoints.database_url) and postgres_up(endpoints.database_url),
                         "external": bool(self.settings.database_url)},
        }
