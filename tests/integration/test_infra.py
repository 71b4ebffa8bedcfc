"""The project's own service manager: idempotent up, status JSON, clear errors."""
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from plumbing.secrets import redact_url
from infra.errors import InfraError
from infra.kafka_node import KafkaNode
from infra.services import LocalServices
from infra.state import ServiceRecord, ServicesState
from plumbing.settings import Settings

LEDGERLM = [sys.executable, "-m", "ledgerlm.cli.main"]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*LEDGERLM, *args], capture_output=True, text=True, timeout=120)


def test_status_json_reports_both_services_up(services):
    result = run_cli("infra", "status", "--json")
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    assert status["kafka"]["up"] is True and status["postgres"]["up"] is True
    assert status["kafka"]["bootstrap"] == services.kafka_bootstrap
    assert status["postgres"]["url"] == redact_url(services.database_url)


def test_up_twice_keeps_the_same_processes(services):
    from tests.services import test_stack_settings

    settings = test_stack_settings(Settings(kafka_bootstrap=None, database_url=None))
    local = LocalServices(settings)
    local.up()
    before = ServicesState.load(settings.state_file)
    local.up()
    after = ServicesState.load(settings.state_file)
    assert before.kafka.pid and before.kafka.pid == after.kafka.pid
    assert before.postgres.pid and before.postgres.pid == after.postgres.pid
    assert local.status()["kafka"]["up"] is True


def test_a_taken_port_is_named_in_the_error(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        taken = sock.getsockname()[1]
        with pytest.raises(InfraError, match=f"port {taken} for the Kafka broker is taken"):
            KafkaNode(tmp_path).start(ServiceRecord(), taken, None, timeout_s=5)


def test_missing_java_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(InfraError, match="Java not found"):
        KafkaNode(tmp_path).java()


def test_old_java_is_refused(tmp_path, monkeypatch):
    fake = tmp_path / "java"
    fake.write_text('#!/bin/sh\necho \'openjdk version "11.0.2" 2019-01-15\' >&2\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(InfraError, match="Java 11 found"):
        KafkaNode(tmp_path).java()


def test_a_failed_format_reports_the_storage_tool_error(tmp_path, settings):
    node = KafkaNode(tmp_path, jars=settings.home / "kafka-jars")
    node.resolve_jars()
    node.dir.mkdir(parents=True)
    bad = node.dir / "server.properties"
    bad.write_text("process.roles=broker,controller\n")  # no node.id, no log.dirs
    with pytest.raises(InfraError, match="Kafka storage tool `format` failed"):
        node._format(node.java(), bad, None)


def test_topics_ensure_cli_reports_no_drift(services, topics):
    result = run_cli("topics", "ensure", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    from schemas.topics import TOPICS

    assert report["created"] == [] and report["drift"] == [] and sorted(report["verified"]) == sorted(
        t.name for t in TOPICS)


def test_asyncapi_document_describes_every_topic_and_type():
    result = run_cli("docs", "asyncapi")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["asyncapi"] == "3.0.0"
    addresses = {(c["address"], name.split(":")[1]) for name, c in document["channels"].items()}
    from schemas.intake import TENANT_TOPICS
    from schemas.topics import TOPICS
    assert addresses == {(t.name, m.model_fields["type"].default) for t in TOPICS + TENANT_TOPICS for m in t.carries}
    assert "SubmitGeneration" in document["components"]["schemas"]


def test_settings_read_the_ledgerlm_prefix(monkeypatch):
    monkeypatch.setenv("LEDGERLM_TOPIC_PARTITIONS", "12")
    monkeypatch.setenv("LEDGERLM_KAFKA_BOOTSTRAP", "broker.example:9092")
    settings = Settings()
    assert settings.topic_partitions == 12
    assert settings.kafka_bootstrap == "broker.example:9092"
    assert LocalServices(settings).endpoints().kafka_bootstrap == "broker.example:9092"


def test_broker_faults_need_a_cluster_and_a_broker_it_has(tmp_path):
    from infra.kafka_cluster import KafkaCluster

    with pytest.raises(InfraError, match="runs no Kafka cluster"):
        LocalServices(Settings(home=tmp_path)).kill_broker(1)
    with pytest.raises(InfraError, match="2..9 brokers, not 1"):
        KafkaCluster(tmp_path, 1, "256m", None)
    cluster = KafkaCluster(tmp_path, 3, "256m", None)
    with pytest.raises(InfraError, match="no broker 4: the cluster has brokers 1..3"):
        cluster.kill_broker([ServiceRecord()] * 3, 4)


def test_a_state_file_from_before_clusters_still_loads(tmp_path):
    path = tmp_path / "services.json"
    path.write_text(json.dumps({"kafka": {"pid": None, "port": 19092, "extra": {"controller_port": 19093}},
                                "postgres": {"pid": None, "port": 55432, "extra": {}}}))
    state = ServicesState.load(path)
    assert (state.kafka.port, state.kafka_brokers) == (19092, [])
    state.kafka_brokers = [ServiceRecord(port=1, extra={"controller_port": 2})]
    state.save(path)
    assert ServicesState.load(path).kafka_brokers == [ServiceRecord(port=1, extra={"controller_port": 2})]
    assert LocalServices(Settings(home=tmp_path, kafka_bootstrap=None)).endpoints().kafka_bootstrap == "127.0.0.1:1"
