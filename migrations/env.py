"""Alembic environment: psycopg 3 through SQLAlchemy; optional target schema.

The URL and schema come from `config.attributes` (set by migrations.runner),
so nothing here reads the environment. With a schema, the migration runs with
`search_path` set to it — how `audit replay` builds a shadow copy.
"""
from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, text

config = context.config


def run_migrations_online() -> None:
    url = config.attributes["sqlalchemy_url"]
    schema = config.attributes.get("schema")
    engine = create_engine(url, future=True)
    with engine.connect() as connection:
        if schema:
            connection.execute(text(f'CREATE SCHEMA IF NOT EXISTS "{schema}"'))
            connection.execute(text(f'SET search_path TO "{schema}"'))
            connection.commit()
        context.configure(connection=connection, version_table_schema=schema, transactional_ddl=True)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline (SQL script) migrations are not supported; run `ledgerlm db upgrade`")
run_migrations_online()
