"""The one configuration object of ledgerlm (environment prefix `LEDGERLM_`)."""
from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

REPO_ROOT = Path(__file__).resolve().parent.parent


class Settings(BaseSettings):
    """Settings passed down from the CLI; nothing reads the environment elsewhere.

    `kafka_bootstrap` / `database_url` point everything at existing services;
    when unset, the services started by `ledgerlm infra up` are used.
    """

    model_config = SettingsConfigDict(env_prefix="LEDGERLM_", extra="ignore")

    home: Path = Field(default=REPO_ROOT / ".ledgerlm", description="state, data and caches of local services")
    kafka_bootstrap: str | None = None
    database_url: str | None = None

    kafka_port: int | None = Field(default=None, description="local broker port; a free one when unset")
    kafka_controller_port: int | None = None
    kafka_heap: str = "768m"
    postgres_port: int | None = Field(default=None, description="local PostgreSQL port; a free one when unset")
    postgres_database: str = "ledgerlm"

    topic_partitions: int = 6
    topic_replication_factor: int = 1
    startup_timeout_s: float = 60.0

    @property
    def state_file(self) -> Path:
        return self.home / "services.json"
