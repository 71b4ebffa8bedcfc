"""Where the CLI finds Kafka and PostgreSQL: the environment, else what `infra up` started."""
from __future__ import annotations

from ledgerlm.cli.errors import CliError
from ledgerlm.settings import Settings


def kafka_bootstrap(settings: Settings) -> str:
    from infra.services import LocalServices

    bootstrap = LocalServices(settings).endpoints().kafka_bootstrap
    if not bootstrap:
        raise CliError("no Kafka: run `ledgerlm infra up` or set LEDGERLM_KAFKA_BOOTSTRAP")
    return bootstrap


def database_url(settings: Settings) -> str:
    from infra.services import LocalServices

    url = LocalServices(settings).endpoints().database_url
    if not url:
        raise CliError("no PostgreSQL: run `ledgerlm infra up` or set LEDGERLM_DATABASE_URL")
    return url
