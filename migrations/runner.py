"""Run alembic programmatically (`ledgerlm db upgrade|downgrade`, tests, audit shadow schemas)."""
from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

SCRIPT_LOCATION = Path(__file__).resolve().parent


def sqlalchemy_url(database_url: str) -> str:
    """libpq URL -> SQLAlchemy URL with the psycopg 3 driver (never psycopg2)."""
    for prefix in ("postgresql+psycopg://", "postgresql://", "postgres://"):
        if database_url.startswith(prefix):
            return "postgresql+psycopg://" + database_url[len(prefix):]
    raise ValueError(f"not a PostgreSQL URL: {database_url.split('@')[-1]}")


def alembic_config(database_url: str, schema: str | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(SCRIPT_LOCATION))
    config.attributes["sqlalchemy_url"] = sqlalchemy_url(database_url)
    if schema:
        config.attributes["schema"] = schema
    return config


def upgrade(database_url: str, revision: str = "head", schema: str | None = None) -> None:
    command.upgrade(alembic_config(database_url, schema), revision)


def downgrade(database_url: str, revision: str = "base", schema: str | None = None) -> None:
    command.downgrade(alembic_config(database_url, schema), revision)
