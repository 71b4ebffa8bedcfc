"""Real Kafka and PostgreSQL for the test session, in this order of preference:

1. `LEDGERLM_KAFKA_BOOTSTRAP` / `LEDGERLM_DATABASE_URL`: existing services;
2. a reachable Docker engine: testcontainers (official Kafka and Postgres images);
3. otherwise the project's own local services (`ledgerlm infra up`).

Never skipped: if none of these can start, the session fails with the reason.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

from infra.services import Endpoints, LocalServices
from plumbing.settings import Settings

KAFKA_IMAGE = "apache/kafka:4.1.1"
POSTGRES_IMAGE = "postgres:16"


@dataclass
class RunningServices:
    endpoints: Endpoints
    how: str
    containers: tuple = ()

    def stop(self) -> None:
        for container in self.containers:
            container.stop()


def docker_reachable() -> bool:
    docker = shutil.which("docker")
    if docker is None:
        return False
    try:
        return subprocess.run([docker, "info"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def test_stack_settings(settings: Settings) -> Settings:
    """The test session's own local services: separate data and ports from a developer's `ledgerlm up`."""
    return settings.model_copy(update={
        "home": settings.home / "test-stack", "kafka_jars": settings.kafka_jars or settings.home / "kafka-jars",
        "kafka_bootstrap": None, "database_url": None, "kafka_port": None, "kafka_controller_port": None,
        "postgres_port": None})


test_stack_settings.__test__ = False  # a helper the test modules import, not a test


def start_services(settings: Settings) -> RunningServices:
    if settings.kafka_bootstrap and settings.database_url:
        return RunningServices(Endpoints(settings.kafka_bootstrap, settings.database_url.get_secret_value()), "external")
    if docker_reachable() and os.environ.get("LEDGERLM_TEST_LOCAL_SERVICES") != "1":
        return _start_containers()
    return _start_fresh_local(test_stack_settings(settings))


def _start_fresh_local(settings: Settings) -> RunningServices:
    """A fresh broker log and database every session: tests see only their own records, and the
    replay audit reads a log as long as one session, not every session before it."""
    local = LocalServices(settings)
    local.down()
    shutil.rmtree(settings.home, ignore_errors=True)
    endpoints = local.up()
    return RunningServices(endpoints, "local", (_Stopper(local),))


class _Stopper:
    def __init__(self, local: LocalServices) -> None:
        self.local = local

    def stop(self) -> None:
        self.local.down()


def _start_containers() -> RunningServices:
    from testcontainers.kafka import KafkaContainer
    from testcontainers.postgres import PostgresContainer

    kafka = KafkaContainer(KAFKA_IMAGE).with_kraft()
    # testcontainers defaults to the psycopg2 driver; we use psycopg 3 and plain libpq URLs.
    postgres = PostgresContainer(POSTGRES_IMAGE, driver=None)
    kafka.start()
    postgres.start()
    endpoints = Endpoints(kafka.get_bootstrap_server(), postgres.get_connection_url())
    return RunningServices(endpoints, "testcontainers", (kafka, postgres))


def sasl_access(endpoints: Endpoints, settings: Settings, principal: str):
    """The session broker's SASL_PLAINTEXT listener as `principal` (its generated SCRAM password), or None
    when the session's Kafka is not the project's own local node (testcontainers, external)."""
    from pydantic import SecretStr

    from plumbing.kafka.access import KafkaAccess, KafkaPrincipal

    if endpoints.kafka_sasl_bootstrap is None:
        return None
    password = LocalServices(test_stack_settings(settings)).kafka.scram_passwords()[principal]
    return KafkaAccess(endpoints.kafka_sasl_bootstrap, "SASL_PLAINTEXT", KafkaPrincipal(principal, SecretStr(password)))
