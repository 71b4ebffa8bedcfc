"""The gateway's key index gives what the `tenants` projection gives: the latest registration's key is live and
revokes the tenant's earlier keys for good; a hash live for two tenants authenticates nobody."""
from __future__ import annotations

from producers.gateway.auth.key_directory import ApiKeyIndex, Refused
from producers.gateway.database import Principal
from schemas.registry_events import TenantRegistered
from schemas.values import TenantLimits

A, B, C = "a" * 64, "b" * 64, "c" * 64


def make_registration(tenant_id: str, key_hash: str, max_tokens_in_flight: int = 1000) -> TenantRegistered:
    return TenantRegistered(tenant_id=tenant_id, name=tenant_id, api_key_hash=key_hash, api_key_prefix="llm_test",
                            limits=TenantLimits(max_tokens_in_flight=max_tokens_in_flight, tokens_per_minute=5000))


def index_of(*registrations: TenantRegistered) -> ApiKeyIndex:
    index = ApiKeyIndex()
    for registration in registrations:
        index.observe(registration)
    return index


def test_a_registered_key_gives_its_tenant_and_an_unknown_one_nothing():
    index = index_of(make_registration("acme", A))
    assert index.lookup(A) == Principal("acme", 1000, 5000)
    assert index.lookup(B) is None


def test_a_new_key_revokes_the_previous_one():
    index = index_of(make_registration("acme", A), make_registration("acme", B))
    assert index.lookup(A) == Refused("revoked")
    assert index.lookup(B) == Principal("acme", 1000, 5000)


def test_registering_the_same_key_again_keeps_it_and_takes_the_new_limits():
    index = index_of(make_registration("acme", A), make_registration("acme", A, max_tokens_in_flight=7))
    assert index.lookup(A) == Principal("acme", 7, 5000)


def test_a_revoked_key_registered_again_stays_revoked_as_its_row_does():
    index = index_of(make_registration("acme", A), make_registration("acme", B), make_registration("acme", A))
    assert index.lookup(A) == Refused("revoked")
    assert index.lookup(B) == Refused("revoked")


def test_a_hash_live_for_two_tenants_authenticates_nobody_until_one_lets_it_go():
    index = index_of(make_registration("acme", A), make_registration("other", A))
    assert index.lookup(A) == Refused("ambiguous")
    index.observe(make_registration("acme", C))
    assert index.lookup(A) == Principal("other", 1000, 5000)
    assert index.lookup(C) == Principal("acme", 1000, 5000)


def test_a_hash_one_tenant_revoked_still_authenticates_the_tenant_that_registers_it():
    index = index_of(make_registration("acme", A), make_registration("acme", B), make_registration("other", A))
    assert index.lookup(A) == Principal("other", 1000, 5000)
