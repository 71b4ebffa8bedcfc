"""Generation ids that name their tenant: `gen_<nonce><tag>`, the tag an HMAC of (tenant, nonce).

    gen_ 8f3c…(24 hex nonce) 51a0…(16 hex tag = HMAC-SHA256(secret, tenant \\0 nonce)[:8 bytes])

The controller mints an id only for an admission it commits (the id reaches the
client in the same Kafka transaction as `Admitted`), so an id whose tag
verifies for the caller's tenant is a generation that tenant owns, known
without any read model: a gateway whose projections lag can still tell "mine,
not yet in view" (wait for it) from "not mine or never issued" (404 at once).
Another tenant's id fails the check by construction (the tag binds the
tenant), so ownership leaks nothing beyond what a miss already says.
Ids minted before tags existed (`gen_<32 hex>`) never verify; they keep the
projection-only lookup.
"""
from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Callable

PREFIX = "gen_"
NONCE_HEX = 24
TAG_HEX = 16


def _tag(secret: str, tenant_id: str, nonce: str) -> str:
    digest = hmac.new(secret.encode(), f"{tenant_id}\0{nonce}".encode(), hashlib.sha256).hexdigest()
    return digest[:TAG_HEX]


PREFERRED_TRIES = 64  # a share of 1/16 of the partitions is missed in 64 draws with probability 1.6%


def mint_generation_id(secret: str, tenant_id: str, preferred: Callable[[str], bool] | None = None) -> str:
    """A fresh id for a generation of `tenant_id` (96 random bits, 64-bit tag); with `preferred`, the first of
    at most PREFERRED_TRIES draws it accepts (else the last draw): still uniform within what it accepts."""
    for _ in range(PREFERRED_TRIES if preferred else 1):
        nonce = secrets.token_hex(NONCE_HEX // 2)
        generation_id = f"{PREFIX}{nonce}{_tag(secret, tenant_id, nonce)}"
        if preferred is None or preferred(generation_id):
            break
    return generation_id


def owned_by(secret: str, generation_id: str, tenant_id: str) -> bool:
    """Whether `generation_id` was minted for `tenant_id` under `secret` (constant-time tag comparison)."""
    body = generation_id[len(PREFIX):] if generation_id.startswith(PREFIX) else ""
    if len(body) != NONCE_HEX + TAG_HEX:
        return False
    nonce, tag = body[:NONCE_HEX], body[NONCE_HEX:]
    return hmac.compare_digest(tag, _tag(secret, tenant_id, nonce))
