"""One client factory: nothing but plumbing/kafka/clients.py constructs a Kafka client, and it applies the
security settings to every one it makes."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
from pydantic import SecretStr

from plumbing.kafka.access import KafkaAccess, KafkaAccessError, KafkaPrincipal
from plumbing.kafka.clients import faststream_security, make_admin, make_consumer, make_producer
from plumbing.settings import REPO_ROOT, Settings

CLIENTS = {"AIOKafkaProducer", "AIOKafkaConsumer", "AIOKafkaAdminClient", "KafkaBroker"}
FACTORY = Path("plumbing/kafka/clients.py")
SCANNED = ("plumbing", "consumers", "producers", "projections", "infra", "ledgerlm", "bench", "schemas", "migrations", "tests")
SASL = KafkaAccess("127.0.0.1:1", "SASL_PLAINTEXT", KafkaPrincipal("worker", SecretStr("s3cret-pw")))


def constructions(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if name in CLIENTS:
                found.append((node.lineno, name))
    return found


def test_no_module_but_the_factory_constructs_a_kafka_client():
    offenders = []
    for top in SCANNED:
        for path in sorted((REPO_ROOT / top).rglob("*.py")):
            relative = path.relative_to(REPO_ROOT)
            if relative == FACTORY or ".venv" in relative.parts:
                continue
            offenders += [f"{relative}:{line} {name}" for line, name in constructions(ast.parse(path.read_text()))]
    assert offenders == [], "build clients with plumbing.kafka.clients (make_producer/make_consumer/make_admin/" \
                            "make_broker) so they carry the security settings"


def test_the_scan_finds_a_hand_built_client():
    assert constructions(ast.parse("from aiokafka import AIOKafkaConsumer\nc = AIOKafkaConsumer('x')")) == \
        [(2, "AIOKafkaConsumer")]


async def test_every_client_the_factory_makes_authenticates_as_the_access_says():
    producer, consumer, admin = make_producer(SASL), make_consumer(SASL), make_admin(SASL)  # none started
    for client in (producer, consumer, admin):
        conn = getattr(client, "client", None) or client._client  # noqa: SLF001 - what aiokafka connects with
        assert (conn._security_protocol, conn._sasl_mechanism) == ("SASL_PLAINTEXT", "SCRAM-SHA-256")
        assert (conn._sasl_plain_username, conn._sasl_plain_password) == ("worker", "s3cret-pw")
    await producer.stop()
    await consumer.stop()
    await admin.close()
    security = faststream_security(SASL)
    assert type(security).__name__ == "SASLScram256" and security.username == "worker"
    assert faststream_security(KafkaAccess("127.0.0.1:1")) is None


def test_settings_describe_the_access_and_never_show_the_password():
    settings = Settings(kafka_security_protocol="SASL_PLAINTEXT", kafka_sasl_mechanism="SCRAM-SHA-512",
                        kafka_sasl_username="gateway", kafka_sasl_password="s3cret-pw")
    access = KafkaAccess.from_settings(settings, "broker:9093")
    assert access.client_options()["sasl_mechanism"] == "SCRAM-SHA-512"
    assert access.client_options()["sasl_plain_password"] == "s3cret-pw"
    assert "s3cret-pw" not in repr(access) and "s3cret-pw" not in repr(settings)
    assert "s3cret" not in repr(Settings(database_url="postgresql://u:s3cret@h/db"))


def test_sasl_without_a_principal_and_missing_tls_files_are_clear_errors(tmp_path):
    with pytest.raises(KafkaAccessError, match="LEDGERLM_KAFKA_SASL_USERNAME"):
        KafkaAccess.from_settings(Settings(kafka_security_protocol="SASL_SSL"), "broker:9093")
    settings = Settings(kafka_security_protocol="SSL", kafka_ssl_cafile=tmp_path / "absent.pem")
    with pytest.raises(KafkaAccessError, match="absent.pem"):
        KafkaAccess.from_settings(settings, "broker:9093").client_options()


def test_a_principal_of_its_own_keeps_brokers_and_transport():
    tenant = KafkaPrincipal("tenant-a", SecretStr("pw"), "SCRAM-SHA-512")
    assert KafkaAccess("b:1").as_principal(tenant) == KafkaAccess("b:1", "SASL_PLAINTEXT", tenant)
    assert KafkaAccess("b:1", "SSL").as_principal(tenant).protocol == "SASL_SSL"

