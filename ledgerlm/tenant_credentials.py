"""Tenants' Kafka passwords on this machine: `<home>/credentials/kafka-tenant-<tenant>.json`, mode 0600.

`tenants create` / `tenants grant-kafka` make one (or reuse the stored one) and hand it to the broker as the
tenant principal's SCRAM credential; `submit --kafka` and `bench intake` read it to log in as the tenant.
"""
from __future__ import annotations

import json
import secrets
from pathlib import Path

from plumbing.secrets import write_secret_file
from plumbing.settings import Settings


def credentials_path(settings: Settings, tenant_id: str) -> Path:
    return settings.home / "credentials" / f"kafka-tenant-{tenant_id}.json"


def stored_password(settings: Settings, tenant_id: str) -> str | None:
    path = credentials_path(settings, tenant_id)
    return json.loads(path.read_text())["password"] if path.is_file() else None


def password_for(settings: Settings, tenant_id: str) -> str:
    """The tenant's stored password, or a new random one (stored by `store_grant` once the broker has it)."""
    return stored_password(settings, tenant_id) or secrets.token_urlsafe(24)


def store_grant(settings: Settings, grant, password: str) -> Path:
    """Keep the password of a grant that set up a principal (0600 from the first byte)."""
    path = credentials_path(settings, grant.tenant_id)
    write_secret_file(path, json.dumps({"username": grant.username, "password": password,
                                        "mechanism": "SCRAM-SHA-256", "bootstrap": grant.bootstrap}, indent=2))
    return path
