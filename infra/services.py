"""`ledgerlm infra up|down|status`: the local Kafka (one node or a cluster) and PostgreSQL together.

When `LEDGERLM_KAFKA_BOOTSTRAP` / `LEDGERLM_DATABASE_URL` are set, that
service is external: it is probed, never started or stopped.

`settings.kafka_brokers` > 1 starts a KRaft cluster (`infra/kafka_cluster.py`)
instead of the single node; `services.json` remembers which one this home runs,
so `down`, `status`, `kill_broker` and `start_broker` need no flag.

`kafka_access()` is how clients reach Kafka as the settings ask: PLAINTEXT, or
the single local node's SASL listener with its generated SCRAM credentials
(`<home>/credentials/kafka-scram.json`), or an external cluster. Status output
never shows a password (`redact_url`).
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from pydantic import SecretStr

from plumbing.kafka.access import KafkaAccess, KafkaAccessError, KafkaPrincipal
from plumbing.secrets import redact_url
from infra.errors import InfraError
from infra.health import kafka_up, postgres_up
from infra.kafka_acls import ensure_development_acls
from infra.kafka_cluster import KafkaCluster
from infra.kafka_node import KafkaNode
from infra.postgres_node import PostgresNode
from infra.state import ServiceRecord, ServicesState
from plumbing.settings import Settings


@dataclass(frozen=True)
class Endpoints:
    kafka_bootstrap: str | None
    database_url: str | None  # holds the password: never print it unredacted
    kafka_sasl_bootstrap: str | None = None  # the local node's SASL_PLAINTEXT listener


class LocalServices:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.kafka = KafkaNode(settings.home, settings.kafka_heap, settings.kafka_jars,
                               scram_file=settings.home / "credentials" / "kafka-scram.json")
        self.postgres = PostgresNode(settings.home, settings.postgres_database)

    def cluster(self, size: int) -> KafkaCluster:
        return KafkaCluster(self.settings.home, size, self.settings.kafka_heap, self.settings.kafka_jars)

    def endpoints(self) -> Endpoints:
        state = ServicesState.load(self.settings.state_file)
        bootstrap = self.settings.kafka_bootstrap or _local_bootstrap(state)
        external_url = self.settings.database_url.get_secret_value() if self.settings.database_url else None
        url = external_url or (self.postgres.url(state.postgres.port) if state.postgres.port else None)
        sasl_port = None if self.settings.kafka_bootstrap or state.kafka_brokers else state.kafka.extra.get("sasl_port")
        return Endpoints(bootstrap, url, f"127.0.0.1:{sasl_port}" if sasl_port else None)

    def kafka_access(self) -> KafkaAccess | None:
        """How clients reach Kafka as the settings ask (None when there is no Kafka to reach).

        Without a SASL password in the settings, a SASL principal takes the local broker's generated one."""
        settings, endpoints = self.settings, self.endpoints()
        sasl = settings.kafka_security_protocol.startswith("SASL_")
        if not sasl:
            return KafkaAccess.from_settings(settings, endpoints.kafka_bootstrap) if endpoints.kafka_bootstrap else None
        bootstrap = settings.kafka_bootstrap or endpoints.kafka_sasl_bootstrap
        if bootstrap is None:
            raise InfraError("SASL asked for, but the local Kafka has no SASL listener (a cluster, or storage "
                             "formatted before SCRAM credentials: `infra down`, remove it, `infra up`)")
        username = settings.kafka_sasl_username or "admin"
        local = self.kafka.scram_passwords().get(username)
        try:
            return KafkaAccess.from_settings(settings.model_copy(update={"kafka_sasl_username": username}),
                                             bootstrap, SecretStr(local) if local else None)
        except KafkaAccessError as exc:
            raise InfraError(str(exc)) from None

    def local_principal_access(self, principal: str) -> KafkaAccess | None:
        """The local node's SASL listener as one of its service principals (`kafka_node.PRINCIPALS`), or None
        when this home's Kafka has no SASL listener (external, a cluster, or formatted before SCRAM)."""
        sasl_bootstrap = self.endpoints().kafka_sasl_bootstrap
        password = self.kafka.scram_passwords().get(principal)
        if sasl_bootstrap is None or password is None:
            return None
        return KafkaAccess(sasl_bootstrap, "SASL_PLAINTEXT", KafkaPrincipal(principal, SecretStr(password)))

    def principal_env(self, principal: str) -> dict[str, str]:
        """Environment that makes a role process log in to the local SASL listener as `principal` (its password
        is looked up in the credentials file by that name, never passed in the environment); {} without one."""
        access = self.local_principal_access(principal)
        if access is None:
            return {}
        return {"LEDGERLM_KAFKA_BOOTSTRAP": access.bootstrap, "LEDGERLM_KAFKA_SECURITY_PROTOCOL": access.protocol,
                "LEDGERLM_KAFKA_SASL_USERNAME": principal}

    def service_access(self, principal: str) -> KafkaAccess | None:
        """How a role that handles tenants' topics reaches Kafka: as the settings say when they ask for SASL
        else the local SASL listener as `principal` (PLAINTEXT's ANONYMOUS may
        not touch tenants' topics, see infra/kafka_acls.py), else PLAINTEXT."""
        if self.settings.kafka_security_protocol != "PLAINTEXT":
            return self.kafka_access()
        return self.local_principal_access(principal) or self.kafka_access()

    def local_brokers(self) -> int | None:
        """How many brokers this home's Kafka has (live or not); None when Kafka is external."""
        if self.settings.kafka_bootstrap:
            return None
        return len(ServicesState.load(self.settings.state_file).kafka_brokers) or 1

    def up(self) -> Endpoints:
        """Start whatever is local and not running; wait until both are healthy."""
        state = ServicesState.load(self.settings.state_file)
        timeout = self.settings.startup_timeout_s
        if not self.settings.database_url:
            state.postgres = self.postgres.start(state.postgres, self.settings.postgres_port, timeout)
            state.save(self.settings.state_file)
        if not self.settings.kafka_bootstrap:
            if self.settings.kafka_brokers == 1:
                self._start_single(state, timeout)
            else:
                self._start_cluster(state, self.settings.kafka_brokers, timeout)
            state.save(self.settings.state_file)
        endpoints = self.endpoints()
        self._wait_healthy(endpoints, timeout)
        admin = self.local_principal_access("admin")
        if admin is not None:
            asyncio.run(ensure_development_acls(admin))
        return endpoints

    def _start_single(self, state: ServicesState, timeout_s: float) -> None:
        if state.kafka_brokers and any(self.cluster(len(state.kafka_brokers)).running(state.kafka_brokers)):
            raise InfraError(f"a {len(state.kafka_brokers)}-broker cluster of this home is running: "
                             "`ledgerlm infra down` first, or pass the same --brokers")
        state.kafka_brokers = []
        state.kafka = self.kafka.start(state.kafka, self.settings.kafka_port, self.settings.kafka_controller_port,
                                       timeout_s)

    def _start_cluster(self, state: ServicesState, size: int, timeout_s: float) -> None:
        if self.kafka.is_ours_running(state.kafka):
            raise InfraError("the single Kafka node of this home is running: `ledgerlm infra down` first")
        if state.kafka_brokers and len(state.kafka_brokers) != size:
            raise InfraError(f"this home's cluster has {len(state.kafka_brokers)} brokers, not {size}: "
                             f"pass --brokers {len(state.kafka_brokers)}, or `infra down` and remove "
                             f"{self.cluster(size).dir}")
        state.kafka = ServiceRecord()
        state.kafka_brokers = self.cluster(size).start(state.kafka_brokers, timeout_s)

    def kill_broker(self, index: int) -> bool:
        """kill -9 broker `index` (1-based) of this home's cluster; False when it was not running."""
        state, cluster = self._cluster_state()
        return cluster.kill_broker(state.kafka_brokers, index)

    def start_broker(self, index: int) -> None:
        """Restart broker `index` with its remembered ports and data; waits until its port answers."""
        state, cluster = self._cluster_state()
        state.kafka_brokers[index - 1] = cluster.start_broker(state.kafka_brokers, index,
                                                              self.settings.startup_timeout_s)
        state.save(self.settings.state_file)

    def _cluster_state(self) -> tuple[ServicesState, KafkaCluster]:
        state = ServicesState.load(self.settings.state_file)
        if not state.kafka_brokers:
            raise InfraError("this home runs no Kafka cluster: `ledgerlm infra up --brokers 3` starts one")
        return state, self.cluster(len(state.kafka_brokers))

    def _wait_healthy(self, endpoints: Endpoints, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        assert endpoints.kafka_bootstrap and endpoints.database_url
        while not kafka_up(self._probe_access(endpoints), timeout_s=3):
            if time.monotonic() > deadline:
                raise InfraError(f"Kafka at {endpoints.kafka_bootstrap} did not list topics within {timeout_s:.0f}s")
            time.sleep(0.3)
        if not postgres_up(endpoints.database_url):
            raise InfraError(f"PostgreSQL at {redact_url(endpoints.database_url)} did not answer SELECT 1")

    def down(self) -> dict[str, bool]:
        """Stop only what `up` started; external services are left alone."""
        state = ServicesState.load(self.settings.state_file)
        stopped = {"kafka": False, "postgres": False}
        if not self.settings.kafka_bootstrap:
            stopped["kafka"] = self.kafka.stop(state.kafka)
            state.kafka.pid = None
            if state.kafka_brokers:
                stopped["kafka"] = self.cluster(len(state.kafka_brokers)).stop(state.kafka_brokers) or stopped["kafka"]
                for broker in state.kafka_brokers:
                    broker.pid = None
        if not self.settings.database_url:
            stopped["postgres"] = self.postgres.stop(state.postgres)
            state.postgres.pid = None
        state.save(self.settings.state_file)
        return stopped

    def status(self) -> dict[str, dict[str, object]]:
        endpoints = self.endpoints()
        kafka: dict[str, object] = {
            "bootstrap": endpoints.kafka_bootstrap,
            "sasl_bootstrap": endpoints.kafka_sasl_bootstrap,
            "up": bool(endpoints.kafka_bootstrap) and kafka_up(self._probe_access(endpoints), timeout_s=3),
            "external": bool(self.settings.kafka_bootstrap)}
        state = ServicesState.load(self.settings.state_file)
        if state.kafka_brokers and not self.settings.kafka_bootstrap:
            running = self.cluster(len(state.kafka_brokers)).running(state.kafka_brokers)
            kafka["brokers"] = [{"id": i, "port": broker.port, "running": alive}
                                for i, (broker, alive) in enumerate(zip(state.kafka_brokers, running), start=1)]
        return {
            "kafka": kafka,
            "postgres": {"url": redact_url(endpoints.database_url),
                         "up": bool(endpoints.database_url) and postgres_up(endpoints.database_url),
                         "external": bool(self.settings.database_url)},
        }


    def _probe_access(self, endpoints: Endpoints) -> KafkaAccess | str:
        """What health probes connect with: an external cluster as configured (it may refuse PLAINTEXT), the
        local one over PLAINTEXT."""
        if not self.settings.kafka_bootstrap:
            return endpoints.kafka_bootstrap or ""
        try:
            return self.kafka_access() or endpoints.kafka_bootstrap
        except InfraError:
            return endpoints.kafka_bootstrap


def _local_bootstrap(state: ServicesState) -> str | None:
    if state.kafka_brokers:
        return KafkaCluster.bootstrap(state.kafka_brokers)
    return f"127.0.0.1:{state.kafka.port}" if state.kafka.port else None
