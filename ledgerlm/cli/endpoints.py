"""Where the CLI finds Kafka and PostgreSQL: the environment, else what `infra up` started."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ledgerlm.cli.errors import CliError
from plumbing.settings import Settings

if TYPE_CHECKING:
    from plumbing.kafka.access import KafkaAccess


def kafka_access(settings: Settings) -> "KafkaAccess":
    """Bootstrap servers and credentials every client of this process uses (plumbing/kafka/access.py)."""
    from infra.errors import InfraError
    from infra.services import LocalServices

    try:
        access = LocalServices(settings).kafka_access()
    except InfraError as exc:
        raise CliError(str(exc)) from exc
    if access is None:
        raise CliError("no Kafka: run `ledgerlm infra up` or set LEDGERLM_KAFKA_BOOTSTRAP")
    return access


def database_url(settings: Settings) -> str:
    from infra.services import LocalServices

    url = LocalServices(settings).endpoints().database_url
    if not url:
        raise CliError("no PostgreSQL: run `ledgerlm infra up` or set LEDGERLM_DATABASE_URL")
    return url
