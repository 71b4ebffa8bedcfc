"""Secrets of the local stack: 0600 from creation, never printed, and a PostgreSQL that asks for them."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest

from plumbing.secrets import redact_url, write_secret_file
from infra.services import LocalServices
from plumbing.settings import Settings
from tests.services import test_stack_settings

LEDGERLM = [sys.executable, "-m", "ledgerlm.cli.main"]


@pytest.fixture(scope="module")
def local(services) -> LocalServices:
    """The session's own local services (their home, files and generated passwords)."""
    local = LocalServices(test_stack_settings(Settings()))
    if local.endpoints().database_url != services.database_url:
        pytest.skip("the session's PostgreSQL is not the project's own local cluster")
    return local


@pytest.fixture
def no_chmod(monkeypatch):
    """A world-readable umask and no chmod: only a file created 0600 ends up 0600."""
    monkeypatch.setattr(os, "chmod", lambda *a, **k: None)
    monkeypatch.setattr(Path, "chmod", lambda *a, **k: None)
    previous = os.umask(0)
    yield
    os.umask(previous)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def status_output(env: dict[str, str]) -> str:
    runs = [subprocess.run([*LEDGERLM, "infra", "status", *flag], capture_output=True, text=True, timeout=120,
                           env=env) for flag in ([], ["--json"])]
    assert all(run.returncode == 0 for run in runs), [run.stderr for run in runs]
    return "".join(run.stdout + run.stderr for run in runs)


def test_infra_status_prints_no_database_password(services, local):
    password = urlsplit(services.database_url).password
    assert password and password == local.postgres.password()
    external = status_output(dict(os.environ))  # the URL given in LEDGERLM_DATABASE_URL
    home_env = {k: v for k, v in os.environ.items() if k not in ("LEDGERLM_DATABASE_URL", "LEDGERLM_KAFKA_BOOTSTRAP")}
    own = status_output({**home_env, "LEDGERLM_HOME": str(local.settings.home)})  # the URL made from the home
    for output in (external, own):
        assert password not in output and "postgres:***@127.0.0.1" in output


def test_postgres_refuses_a_wrong_or_missing_password_over_tcp_and_the_socket(services, local):
    parts = urlsplit(services.database_url)
    socket_dir = local.postgres.dir
    for conninfo in (f"host=127.0.0.1 port={parts.port} user=postgres dbname=ledgerlm password=wrong",
                     f"host=127.0.0.1 port={parts.port} user=postgres dbname=ledgerlm",
                     f"host={socket_dir} port={parts.port} user=postgres dbname=ledgerlm password=wrong"):
        with pytest.raises(psycopg.OperationalError, match="password"):
            psycopg.connect(conninfo, connect_timeout=5)
    with psycopg.connect(services.database_url) as conn:
        assert conn.execute("SHOW fsync").fetchone() == ("on",)
        assert conn.execute("SHOW password_encryption").fetchone() == ("scram-sha-256",)


def test_the_generated_credentials_are_0600(local):
    for path in (local.postgres.password_file, local.kafka.scram_file):
        assert path.is_file() and mode(path) == 0o600, path
    assert mode(local.postgres.password_file.parent) == 0o700


def test_a_secret_file_is_0600_from_its_creation(tmp_path, no_chmod):
    path = tmp_path / "new" / "secret.json"
    write_secret_file(path, "{}")
    assert mode(path) == 0o600 and path.read_text() == "{}"
    write_secret_file(path, "{\"again\": 1}")  # replaced whole, still 0600
    assert mode(path) == 0o600 and json.loads(path.read_text()) == {"again": 1}
    assert [p.name for p in path.parent.iterdir()] == ["secret.json"]


def test_stack_json_and_the_demo_tenant_file_are_0600_from_their_creation(tmp_path, bootstrap, database_url,
                                                                          topics, no_chmod):
    from ledgerlm.stack import Stack, StackRunner, stack_file, write_stack

    settings = Settings(home=tmp_path)
    write_stack(settings, Stack(gateway="http://x", api_key="llm_secret", tenant_id="t", model="m"))
    assert mode(stack_file(settings)) == 0o600
    tenant_id, api_key = StackRunner(settings).tenant(bootstrap, database_url)
    demo = tmp_path / "demo-tenant.json"
    assert mode(demo) == 0o600 and json.loads(demo.read_text()) == {"tenantId": tenant_id, "apiKey": api_key}


def test_redact_url_hides_only_the_password():
    assert redact_url("postgresql://postgres:pw@127.0.0.1:5432/db") == "postgresql://postgres:***@127.0.0.1:5432/db"
    assert redact_url("postgresql://postgres@127.0.0.1:5432/db") == "postgresql://postgres@127.0.0.1:5432/db"
    assert redact_url(None) is None
