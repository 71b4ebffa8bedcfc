"""API keys: shown once at creation, stored and transported only as SHA-256.

Keys carry 256 random bits, so a plain (unsalted) SHA-256 is enough to make
the stored value useless to an attacker while keeping lookup a primary-key hit.
"""
from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

import psycopg

KEY_PREFIX = "llm"


@dataclass(frozen=True)
class IssuedKey:
    plain: str
    hash: str
    prefix: str  # safe to display: identifies the key without revealing it


def hash_api_key(plain: str) -> str:
    return hashlib.sha256(plain.encode("utf-8")).hexdigest()


def issue_api_key() -> IssuedKey:
    secret = secrets.token_urlsafe(32)
    plain = f"{KEY_PREFIX}_{secret}"
    return IssuedKey(plain=plain, hash=hash_api_key(plain), prefix=plain[:10])


def could_be_key(presented: str | None) -> bool:
    """Shape check before any lookup: a value that cannot be a key is refused without touching the database."""
    return bool(presented) and presented.startswith(f"{KEY_PREFIX}_") and len(presented) <= 256


def authenticate(conn: psycopg.Connection, presented: str | None) -> str | None:
    """The tenant id of a live key, or None. Only the hash is ever compared or stored."""
    if not could_be_key(presented):
        return None
    rows = conn.execute(
        "SELECT tenant_id FROM api_keys WHERE key_hash = %s AND revoked_at IS NULL LIMIT 2",
        (hash_api_key(presented),),
    ).fetchall()
    # A hash claimed by two tenants is ambiguous: it authenticates nobody.
    return rows[0][0] if len(rows) == 1 else None
