"""The control plane over the local broker's SASL_PLAINTEXT (SCRAM-SHA-256) listener, and who it refuses.

The session's gateway, workers and controller process already reach Kafka
there, each as its own principal (conftest `cp_kafka`, `cp_env`); here one
generation is followed from the gateway to a projection that also reads over
SASL, and clients without the right credentials are shown the door.
"""
from __future__ import annotations

import psycopg
import pytest
from aiokafka.errors import KafkaConnectionError
from pydantic import SecretStr

from plumbing.kafka.access import KafkaAccess, KafkaPrincipal
from plumbing.kafka.clients import make_admin
from migrations import runner
from tests.controlplane.conftest import body
from tests.controlplane.test_projected_billing import project_all


@pytest.fixture(scope="module")
def sasl(cp_kafka) -> KafkaAccess:
    access = cp_kafka("admin")
    if isinstance(access, str):
        pytest.skip("the session's Kafka is not the project's own local node: there is no SASL listener to test")
    return access


async def listed_topics(access: KafkaAccess) -> list[str]:
    admin = make_admin(access, request_timeout_ms=5000)
    try:
        await admin.start()
        return await admin.list_topics()
    finally:
        await admin.close()


async def test_a_generation_goes_gateway_controller_worker_projection_over_sasl(
        sasl, cp_kafka, cp_env, gateway, worker, tenants, versions, scratch_database):
    assert cp_env["LEDGERLM_KAFKA_SECURITY_PROTOCOL"] == "SASL_PLAINTEXT"
    assert cp_env["LEDGERLM_KAFKA_BOOTSTRAP"] == sasl.bootstrap  # the controller process's only way in
    assert gateway.gateway.admission.kafka.principal.username == "gateway"
    assert worker.kafka.principal.username == "worker" and worker.kafka.bootstrap == sasl.bootstrap

    response = await gateway.post("/v1/generations?wait=true", headers=tenants["main"].headers,
                                  json=body(model=versions["served"], maxOutputTokens=5))
    assert response.status_code == 201, response.text
    done = response.json()
    assert (done["status"], done["usage"]["outputTokens"]) == ("completed", 5)

    runner.upgrade(scratch_database)
    await project_all(cp_kafka("projector"), scratch_database)
    with psycopg.connect(scratch_database) as conn:
        row = conn.execute("SELECT status FROM generations WHERE generation_id = %s", (done["id"],)).fetchone()
        bill = conn.execute("SELECT billed_output_tokens FROM billing_ledger WHERE generation_id = %s",
                            (done["id"],)).fetchone()
    assert row == ("completed",) and bill == (5,)


async def test_the_sasl_listener_takes_the_generated_credentials(sasl):
    assert "llm.commands" in await listed_topics(sasl)


@pytest.mark.parametrize("case", ["wrong password", "unknown principal", "no authentication"])
async def test_the_sasl_listener_refuses_clients_without_the_right_credentials(sasl, case, caplog):
    refused = {
        "wrong password": KafkaAccess(sasl.bootstrap, "SASL_PLAINTEXT",
                                      KafkaPrincipal("admin", SecretStr("not-the-password"))),
        "unknown principal": KafkaAccess(sasl.bootstrap, "SASL_PLAINTEXT",
                                         KafkaPrincipal("mallory", sasl.principal.password)),
        "no authentication": KafkaAccess(sasl.bootstrap),
    }[case]
    with pytest.raises((KafkaConnectionError, TimeoutError)):
        await listed_topics(refused)
    if case != "no authentication":  # (a PLAINTEXT client cannot even start the handshake)
        assert "SaslAuthenticationFailed" in caplog.text  # aiokafka logs the broker's answer
