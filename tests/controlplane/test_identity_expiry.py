"""Controller state that does not grow forever (issue 15, finding 4): identities of ended generations expire
after `identity_ttl_s` with a changelog tombstone, and tenant budgets are counters that always equal a scan.
In memory, like test_decisions; the restart on a real broker is in test_identity_restart.py."""
from __future__ import annotations

from datetime import timedelta

from consumers.controller.state import PartitionState
from schemas.changelog import identity_key, identity_of_key
from schemas.commands import AttemptRefused, CancelGeneration, ReleaseReservation
from tests.controlplane.test_decisions import NOW, heartbeat, submit, world  # noqa: F401 -- `world` is a fixture

TTL_S = 3600.0


def at(seconds: float):
    return NOW + timedelta(seconds=seconds)


def replay(log: list) -> PartitionState:
    """A controller's rebuild: every changelog record in order, a tombstone (a key alone) forgetting its identity."""
    rebuilt = PartitionState(0)
    for item in log:
        if isinstance(item, str):
            rebuilt.apply_tombstone(item, "ledgerlm-controller")
        else:
            rebuilt.apply_changelog(item)
    return rebuilt


def compacted(log: list) -> list:
    """What compaction may leave of the log: the latest item per key (a tombstone included), in log order."""
    latest = {}
    for i, item in enumerate(log):
        latest[item if isinstance(item, str) else item.changelog_key] = (i, item)
    return [item for _, item in sorted(latest.values(), key=lambda pair: pair[0])]


def assert_counters_match_a_scan(state: PartitionState) -> None:
    for tenant in state.tenants.values():
        assert tenant.budget() == tenant.recount(), tenant.tenant_id


def test_identity_keys_name_tenant_and_request_even_with_slashes_in_the_request_id():
    key = identity_key("plane/x", "acme", "a/g/b")
    assert identity_of_key(key, "plane/x") == ("acme", "a/g/b")
    assert identity_of_key(key, "other") is None
    assert identity_of_key("plane/x/acme/budget", "plane/x") is None


def test_an_ended_identity_expires_after_the_ttl_with_a_tombstone_and_its_request_id_is_then_new(world):
    decider, registry, state = world
    decider.settings = decider.settings.model_copy(update={"identity_ttl_s": TTL_S})
    registry.observe(heartbeat("w1", at=at(0)))
    ended_id = decider.submit(state, submit("done", max_output=10), at(0)).replies[0].generation_id
    live_id = decider.submit(state, submit("running", max_output=10), at(0)).replies[0].generation_id
    decider.release(state, ReleaseReservation(tenant_id="acme", generation_id=ended_id, epoch=1, used_tokens=5),
                    at(10))
    registry.observe(heartbeat("w1", at=at(TTL_S + 9), attempts=(f"{live_id}:1",)))
    assert not decider.expire_identities(state, at(TTL_S + 9))  # one second short of the TTL since its end
    effects = decider.expire_identities(state, at(TTL_S + 10))
    assert effects.tombstones == [identity_key("ledgerlm-controller", "acme", "done")]
    assert state.find("acme", ended_id) is None and state.find("acme", live_id).status == "active"
    # A live generation never expires, however old.
    registry.observe(heartbeat("w1", at=at(10 * TTL_S), attempts=(f"{live_id}:1",)))
    decider.settings = decider.settings.model_copy(update={"max_attempt_s": 100 * TTL_S})
    assert not decider.expire_identities(state, at(10 * TTL_S))
    again = decider.submit(state, submit("done", max_output=10, occurred_at=at(TTL_S + 11),
                                         payload_hash="cd" * 32), at(TTL_S + 11)).replies[0]
    assert again.http_status == 201 and again.generation_id != ended_id  # a new request, not a 409


def test_budget_counters_equal_a_recount_after_admit_end_interrupt_cancel_expire_and_rebuild(world):
    decider, registry, state = world
    decider.settings = decider.settings.model_copy(update={"identity_ttl_s": TTL_S})
    decider.tenants["beta"] = decider.tenants["acme"].model_copy(update={"max_concurrency": 10})
    decider.tenants["acme"] = decider.tenants["acme"].model_copy(update={"max_concurrency": 10})
    registry.observe(heartbeat("w1", at=at(0)))
    registry.observe(heartbeat("w2", at=at(0)))
    log: list = []

    def run(effects):
        log.extend(effects.changelog)
        log.extend(effects.tombstones)
        assert_counters_match_a_scan(state)
        return effects

    ids = {}
    for i, (tenant, name) in enumerate([("acme", "a"), ("acme", "b"), ("beta", "c"), ("beta", "d"), ("acme", "e")]):
        reply = run(decider.submit(state, submit(name, max_output=10 + i, tenant=tenant), at(i / 10))).replies[0]
        assert reply.http_status == 201
        ids[name] = (tenant, reply.generation_id)
    run(decider.release(state, ReleaseReservation(tenant_id="acme", generation_id=ids["a"][1], epoch=1,
                                                  used_tokens=7), at(10)))
    run(decider.cancel(state, CancelGeneration(tenant_id="beta", generation_id=ids["c"][1], gateway_id="gw",
                                               correlation_id="x"), at(11)))
    refused = AttemptRefused(tenant_id="beta", generation_id=ids["c"][1], epoch=1, worker_id="w1", reason="full")
    run(decider.refused(state, refused, at(12)))  # canceling and refused: ended canceled
    # w2 goes silent: whatever it ran is interrupted; w1 keeps listing the rest.
    w1 = tuple(f"{g}:1" for t, g in ids.values() if state.find(t, g).worker_id == "w1")
    registry.observe(heartbeat("w1", at=at(30), attempts=w1))
    run(decider.expire_leases(state, at(30)))
    expired = run(decider.expire_identities(state, at(TTL_S + 11)))  # "a" ended at 10; "c" at 12, the rest at 30
    assert expired.tombstones == [identity_key("ledgerlm-controller", "acme", "a")]
    registry.observe(heartbeat("w1", at=at(TTL_S + 12), attempts=w1))
    again = run(decider.submit(state, submit("a", max_output=3, occurred_at=at(TTL_S + 12), tenant="acme"),
                               at(TTL_S + 12)))
    assert again.replies[0].http_status == 201
    budgets = {t: tenant.budget() for t, tenant in state.tenants.items()}
    assert any(b.concurrency for b in budgets.values())  # the sequence leaves live work behind
    for log_read in (log, compacted(log)):
        rebuilt = replay(log_read)
        assert_counters_match_a_scan(rebuilt)
        assert {t: tenant.budget() for t, tenant in rebuilt.tenants.items()} == budgets
        assert set(rebuilt.owners) == set(state.owners) and set(rebuilt.live) == set(state.live)
