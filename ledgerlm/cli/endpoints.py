"""Where the CLI finds Kafka and PostgreSQL: the environment, else what `infra up` started."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ledgerlm.cli.errors import CliError
from plumbing.settings import Settings

if TYPE_CHECKING:
    from plumbing.kafka.access import KafkaAccess


def _reach(settings: Settings, how) -> "KafkaAccess":
    """`how(LocalServices)`'s access, an InfraError or no Kafka at all as a CliError."""
    from infra.errors import InfraError
    from infra.services import LocalServices

    try:
        access = how(LocalServices(settings))
    except InfraError as exc:
        raise CliError(str(exc)) from exc
    if access is None:
        raise CliError("no Kafka: run `ledgerlm infra up` or set LEDGERLM_KAFKA_BOOTSTRAP")
    return access


def kafka_access(settings: Settings) -> "KafkaAccess":
    """Bootstrap servers and credentials every client of this process uses (plumbing/kafka/access.py)."""
    return _reach(settings, lambda local: local.kafka_access())


def service_kafka_access(settings: Settings, principal: str) -> "KafkaAccess":
    """Kafka for work on tenants' topics: the local SASL listener as service `principal` when the settings ask
    for PLAINTEXT (whose ANONYMOUS may not touch those topics), else as `kafka_access`."""
    return _reach(settings, lambda local: local.service_access(principal))


def tenant_kafka_access(settings: Settings, tenant_id: str) -> "KafkaAccess":
    """Kafka as the tenant's own principal when this machine keeps its password (`tenants create` stored it),
    else as `kafka_access` (a broker without ACLs)."""
    from ledgerlm.tenant_credentials import stored_password
    from producers.tenant_kafka import tenant_access

    password = stored_password(settings, tenant_id)
    if password is None:
        return kafka_access(settings)
    return tenant_access(service_kafka_access(settings, "admin"), tenant_id, password)


def database_url(settings: Settings) -> str:
    from infra.services import LocalServices

    url = LocalServices(settings).endpoints().database_url
    if not url:
        raise CliError("no PostgreSQL: run `ledgerlm infra up` or set LEDGERLM_DATABASE_URL")
    return url
