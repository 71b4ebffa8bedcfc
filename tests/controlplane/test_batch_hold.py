"""Batch work the controller holds: never refused for load, dispatched oldest first to a worker with room,
expired only past its completion window, and rebuilt exactly from the changelog."""
from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from consumers.controller.decisions import Decider
from consumers.controller.registry import WorkerRegistry
from consumers.controller.state import PartitionState
from plumbing.settings import Settings
from schemas.commands import AttemptRefused, CancelGeneration, SubmitGeneration
from schemas.model_book import ModelBook
from schemas.registry_events import WorkerHeartbeat
from schemas.values import TenantLimits
from tests.factories import make_event

NOW = datetime(2026, 12, 2, 9, 0, 0, tzinfo=UTC)
VERSION = "demo-tiny@1"


def heartbeat(free_blocks: int, at: datetime = NOW, worker_id: str = "w1", **fields) -> WorkerHeartbeat:
    return WorkerHeartbeat(worker_id=worker_id, model_versions=(VERSION,), total_blocks=64, free_blocks=free_blocks,
                           block_size=16, running=fields.pop("running", 0), queued_tokens=fields.pop("queued_tokens", 0), lease_ms=2000,
                           occurred_at=at, tokens_per_s=200.0, **fields)


def batch(request_id: str, at: datetime = NOW, **fields) -> SubmitGeneration:
    return SubmitGeneration(tenant_id="acme", request_id=request_id, gateway_id="gw", correlation_id=request_id,
                            model_version=VERSION, input_token_ids=(1, 2, 3, 4), max_output_tokens=12,
                            payload_hash="ab" * 32, tier="batch", occurred_at=at, **fields)


@pytest.fixture
def world():
    registry = WorkerRegistry()
    limits = {"acme": TenantLimits(max_concurrency=1000, batch_completion_window_s=3600)}
    models = ModelBook(versions={VERSION: make_event("ModelVersionRegistered")})
    decider = Decider(Settings(), registry, limits, models, random.Random(3))
    return decider, registry, PartitionState(0)


def held_ids(state: PartitionState) -> list[str]:
    return [ticket.request_id for ticket in state.held.values()]


def test_batch_work_beyond_the_room_of_every_worker_is_accepted_and_held_in_arrival_order(world):
    decider, registry, state = world
    registry.observe(heartbeat(free_blocks=1))  # 16 tokens of room; each attempt reserves 4 + 12
    replies = [decider.submit(state, batch(f"b{i}"), NOW) for i in range(4)]
    assert [r.replies[0].http_status for r in replies] == [201] * 4
    assert [len(r.dispatch) for r in replies] == [1, 0, 0, 0]  # the first fits now; the rest wait here
    assert held_ids(state) == ["b1", "b2", "b3"]
    assert state.find("acme", replies[1].replies[0].generation_id).worker_id is None


def test_held_work_goes_oldest_first_to_the_room_a_heartbeat_shows_and_leaves_the_changelog(world):
    decider, registry, state = world
    registry.observe(heartbeat(free_blocks=0))
    gen_ids = [decider.submit(state, batch(f"b{i}"), NOW).replies[0].generation_id for i in range(3)]
    assert not decider.dispatch_held(state, NOW + timedelta(seconds=1))  # still no room: nothing moves
    registry.observe(heartbeat(free_blocks=2, at=NOW + timedelta(seconds=2)))  # room for two
    effects = decider.dispatch_held(state, NOW + timedelta(seconds=2))
    assert [order.generation_id for order in effects.dispatch] == gen_ids[:2]
    (order, _) = effects.dispatch
    assert (order.worker_id, order.tier, order.epoch) == ("w1", "batch", 1)
    assert order.deadline_at == NOW + timedelta(seconds=3600)  # the tenant's completion window
    assert sorted(effects.tombstones) == sorted(f"ledgerlm-controller/acme/h/{g}" for g in gen_ids[:2])
    moved = state.find("acme", gen_ids[0])
    assert (moved.worker_id, moved.queued, moved.dispatched_at) == ("w1", False, NOW + timedelta(seconds=2))
    assert held_ids(state) == ["b2"] and state.tenant("acme").queued_tokens == 16


def test_a_dispatch_waits_for_the_prefill_queue_on_the_worker_as_well_as_for_kv_room(world):
    decider, registry, state = world
    registry.observe(heartbeat(free_blocks=0))
    decider.submit(state, batch("b0"), NOW)
    # Room enough, but 1,000 prompt tokens queued at 200 tokens/s: 5 s before it could start (1 s allowed).
    registry.observe(heartbeat(free_blocks=64, queued_tokens=1000, at=NOW + timedelta(seconds=1)))
    assert not decider.dispatch_held(state, NOW + timedelta(seconds=1)).dispatch
    registry.observe(heartbeat(free_blocks=64, queued_tokens=100, at=NOW + timedelta(seconds=2)))
    assert len(decider.dispatch_held(state, NOW + timedelta(seconds=2)).dispatch) == 1


def test_held_work_expires_only_past_its_completion_window_unbilled_with_its_budget_back(world):
    decider, registry, state = world
    registry.observe(heartbeat(free_blocks=0))
    reply = decider.submit(state, batch("short", completion_window_s=600), NOW).replies[0]
    decider.submit(state, batch("tenant-window"), NOW)
    assert not decider.dispatch_held(state, NOW + timedelta(seconds=599))
    effects = decider.dispatch_held(state, NOW + timedelta(seconds=600))
    (expired,) = effects.generations
    assert (expired.type, expired.generation_id, expired.epoch) == ("Expired", reply.generation_id, 1)
    assert state.find("acme", reply.generation_id).end_reason == "expired" and held_ids(state) == ["tenant-window"]
    assert f"ledgerlm-controller/acme/h/{reply.generation_id}" in effects.tombstones
    assert state.tenant("acme").concurrency == 1
    # A request asking for more than its tenant's window gets the tenant's.
    decider.submit(state, batch("long", completion_window_s=7200), NOW)
    (long,) = [ticket for ticket in state.held.values() if ticket.request_id == "long"]
    assert long.expires_at == NOW + timedelta(seconds=3600)


def test_the_platform_window_applies_when_the_tenant_names_none(world):
    decider, registry, state = world
    decider.tenants["acme"] = TenantLimits()
    registry.observe(heartbeat(free_blocks=0))
    decider.submit(state, batch("b"), NOW)
    (ticket,) = state.held.values()
    assert ticket.expires_at == NOW + timedelta(seconds=decider.settings.batch_completion_window_s)


def test_canceling_held_work_ends_it_at_once_without_a_worker(world):
    decider, registry, state = world
    registry.observe(heartbeat(free_blocks=0))
    gen_id = decider.submit(state, batch("b"), NOW).replies[0].generation_id
    cancel = CancelGeneration(tenant_id="acme", generation_id=gen_id, gateway_id="gw", correlation_id="c")
    effects = decider.cancel(state, cancel, NOW)
    assert effects.replies[0].http_status == 202 and not effects.dispatch
    assert [event.type for event in effects.generations] == ["Canceled"]
    assert not state.held and state.find("acme", gen_id).end_reason == "canceled"
    assert state.tenant("acme").budget() == state.tenant("acme").recount() and state.tenant("acme").concurrency == 0


def test_a_refused_batch_attempt_is_held_again_as_the_next_epoch_ahead_of_later_work(world):
    decider, registry, state = world
    registry.observe(heartbeat(free_blocks=1))
    first = decider.submit(state, batch("first"), NOW)
    decider.submit(state, batch("later", at=NOW + timedelta(seconds=1)), NOW + timedelta(seconds=1))
    (order,) = first.dispatch
    refused = AttemptRefused(tenant_id="acme", generation_id=order.generation_id, epoch=1, worker_id="w1",
                             reason="kv-full", attempt=order)
    effects = decider.refused(state, refused, NOW + timedelta(seconds=2))
    assert not effects.dispatch and not effects.generations  # not rejected, not rerouted at once
    assert held_ids(state) == ["first", "later"] and next(iter(state.held.values())).epoch == 2
    assert state.find("acme", order.generation_id).epoch == 2


def test_held_work_is_never_interrupted_by_a_lease_check(world):
    decider, registry, state = world
    registry.observe(heartbeat(free_blocks=0))
    decider.submit(state, batch("b"), NOW)
    assert not decider.expire_leases(state, NOW + timedelta(hours=2))  # the worker is long silent
    assert held_ids(state) == ["b"]


def test_a_rebuild_from_the_changelog_holds_the_same_work_in_the_same_order(world):
    decider, registry, state = world
    registry.observe(heartbeat(free_blocks=0))
    changelog, tombstones = [], []
    for i in range(4):
        effects = decider.submit(state, batch(f"b{i}", at=NOW + timedelta(seconds=i)), NOW + timedelta(seconds=i))
        changelog += effects.changelog
    registry.observe(heartbeat(free_blocks=1, at=NOW + timedelta(seconds=5)))
    effects = decider.dispatch_held(state, NOW + timedelta(seconds=5))
    changelog += effects.changelog
    tombstones += effects.tombstones
    rebuilt = PartitionState(0)
    for record in changelog:
        rebuilt.apply_changelog(record)
    for key in tombstones:
        rebuilt.apply_tombstone(key, "ledgerlm-controller")
    rebuilt.order_held()
    assert held_ids(rebuilt) == held_ids(state) == ["b1", "b2", "b3"]
    assert rebuilt.tenant("acme").budget() == state.tenant("acme").budget()


def test_interactive_work_is_predicted_behind_interactive_prompts_only_and_batch_behind_all(world):
    """The engine admits interactive prompts first: a worker busy with a burst of batch prefill still takes
    interactive work within its allowance, and takes no more batch work."""
    decider, registry, state = world
    registry.observe(heartbeat(free_blocks=64, queued_tokens=3000, batch_queued_tokens=2900))
    chat = SubmitGeneration(tenant_id="acme", request_id="chat", gateway_id="gw", correlation_id="chat",
                            model_version=VERSION, input_token_ids=(1, 2, 3, 4), max_output_tokens=12,
                            payload_hash="ab" * 32, occurred_at=NOW)
    assert decider.submit(state, chat, NOW).dispatch  # 100 interactive tokens ahead: 0.5 s at 200 tokens/s
    decider.submit(state, batch("b"), NOW)
    assert held_ids(state) == ["b"]  # 3,000 tokens ahead of it: 15 s


def test_a_worker_holding_its_maximum_of_attempts_gets_no_more_until_some_end(world):
    """Batch work stops a quarter short of the bound, so interactive work still finds a place beside a backlog."""
    decider, registry, state = world
    registry.observe(heartbeat(free_blocks=64, running=2, max_attempts=4))
    first = decider.submit(state, batch("b1"), NOW)
    second = decider.submit(state, batch("b2"), NOW)  # 2 held + 1 dispatched since the heartbeat: 3 of 4
    assert len(first.dispatch) == 1 and not second.dispatch and held_ids(state) == ["b2"]

    def chat(name: str) -> SubmitGeneration:
        return SubmitGeneration(tenant_id="acme", request_id=name, gateway_id="gw", correlation_id=name,
                                model_version=VERSION, input_token_ids=(1, 2, 3, 4), max_output_tokens=12,
                                payload_hash="ab" * 32, occurred_at=NOW)

    assert len(decider.submit(state, chat("c1"), NOW).dispatch) == 1  # the place batch work left
    refused = decider.submit(state, chat("c2"), NOW).replies[0]  # 4 of 4: full
    assert (refused.http_status, refused.error_code) == (503, "no_capacity")
    registry.observe(heartbeat(free_blocks=64, running=1, max_attempts=4, at=NOW + timedelta(seconds=2)))
    assert len(decider.dispatch_held(state, NOW + timedelta(seconds=2)).dispatch) == 1
