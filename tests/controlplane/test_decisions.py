"""The controller's rules in memory: budgets, routing, refusals, releases, leases, changelog rebuild."""
from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from consumers.controller.decisions import Decider
from consumers.controller.registry import WorkerRegistry
from consumers.controller.state import PartitionState
from plumbing.settings import Settings
from schemas.commands import AttemptRefused, CancelGeneration, ReleaseReservation, SubmitGeneration
from schemas.model_book import ModelBook
from schemas.registry_events import WorkerHeartbeat
from schemas.values import TenantLimits
from tests.factories import make_event

NOW = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
VERSION = "demo-tiny@1"


def heartbeat(worker_id: str, free_blocks: int = 64, at: datetime = NOW, **fields) -> WorkerHeartbeat:
    return WorkerHeartbeat(worker_id=worker_id, model_versions=(VERSION,), total_blocks=64, free_blocks=free_blocks,
                           block_size=16, running=0, queued_tokens=fields.pop("queued_tokens", 0), lease_ms=2000,
                           occurred_at=at, **fields)


def submit(request_id: str = "r1", tokens: int = 4, max_output: int = 60, tenant: str = "acme", **fields):
    return SubmitGeneration(tenant_id=tenant, request_id=request_id, gateway_id="gw", correlation_id=request_id,
                            model_version=VERSION, input_token_ids=tuple(range(1, tokens + 1)),
                            max_output_tokens=max_output, payload_hash=fields.pop("payload_hash", "ab" * 32),
                            occurred_at=fields.pop("occurred_at", NOW), **fields)


@pytest.fixture
def world():
    registry = WorkerRegistry()
    limits = {"acme": TenantLimits(max_tokens_in_flight=200, tokens_per_minute=300, max_concurrency=3)}
    models = ModelBook(versions={VERSION: make_event("ModelVersionRegistered")})
    decider = Decider(Settings(retry_after_ms=1000, max_refusals=2), registry, limits, models, random.Random(7))
    return decider, registry, PartitionState(0)


def test_admission_reserves_input_plus_output_and_dispatches_to_the_roomiest_worker(world):
    decider, registry, state = world
    registry.observe(heartbeat("w-small", free_blocks=10))
    registry.observe(heartbeat("w-big", free_blocks=40))
    effects = decider.submit(state, submit(), NOW)
    (reply,), (admitted,), (start,) = effects.replies, effects.generations, effects.dispatch
    assert (reply.http_status, reply.outcome) == (201, "created")
    assert (admitted.reserved_tokens, admitted.epoch, start.worker_id, start.epoch) == (64, 1, "w-big", 1)
    assert start.deadline_at == NOW + timedelta(seconds=10)
    assert state.tenant("acme").tokens_in_flight == 64 and state.tenant("acme").concurrency == 1
    # The held reservation (64 tokens = 4 blocks) counts until a later heartbeat reflects it.
    assert registry.workers["w-big"].room_tokens == 40 * 16 - 64


def test_repeat_is_200_and_a_different_payload_is_409_without_new_state(world):
    decider, registry, state = world
    registry.observe(heartbeat("w1"))
    created = decider.submit(state, submit(), NOW).replies[0]
    repeat = decider.submit(state, submit(), NOW)
    conflict = decider.submit(state, submit(payload_hash="cd" * 32), NOW)
    assert (repeat.replies[0].http_status, repeat.replies[0].generation_id) == (200, created.generation_id)
    assert conflict.replies[0].http_status == 409 and conflict.replies[0].error_code == "request_id_conflict"
    assert not (repeat.generations or repeat.dispatch or conflict.generations or conflict.changelog)
    assert state.tenant("acme").concurrency == 1


def test_budgets_refuse_with_429_and_a_jittered_retry_after(world):
    decider, registry, state = world
    registry.observe(heartbeat("w1"))
    assert decider.submit(state, submit("a", max_output=96), NOW).replies[0].http_status == 201
    refused = decider.submit(state, submit("b", max_output=150), NOW).replies[0]
    assert (refused.http_status, refused.error_code) == (429, "tokens_in_flight")
    assert 1000 <= refused.retry_after_ms <= 1500
    assert decider.submit(state, submit("c", max_output=10), NOW).replies[0].http_status == 201
    assert decider.submit(state, submit("d", max_output=10), NOW).replies[0].http_status == 201
    busy = decider.submit(state, submit("e", max_output=1), NOW).replies[0]
    assert (busy.http_status, busy.error_code) == (429, "concurrency")
    retries = {decider.submit(state, submit(f"x{i}", max_output=1), NOW).replies[0].retry_after_ms for i in range(8)}
    assert len(retries) > 1 and all(1000 <= r <= 1500 for r in retries)


def test_token_rate_window_refuses_until_the_minute_has_passed(world):
    decider, registry, state = world
    registry.observe(heartbeat("w1", at=NOW + timedelta(seconds=50)))
    first = decider.submit(state, submit("a", max_output=146), NOW).replies[0]  # 150 tokens charged at NOW
    gen = state.find("acme", first.generation_id)
    decider.release(state, ReleaseReservation(tenant_id="acme", generation_id=gen.generation_id, epoch=1,
                                              used_tokens=150), NOW)
    later = NOW + timedelta(seconds=20)
    decider.submit(state, submit("b", max_output=96, occurred_at=later), later)  # 100 more: 250 in the window
    refused = decider.submit(state, submit("c", max_output=96, occurred_at=later), later).replies[0]
    assert (refused.http_status, refused.error_code) == (429, "token_rate")
    assert 40_000 <= refused.retry_after_ms <= 60_000  # the charge at NOW leaves the window 40 s later


def test_no_live_worker_with_the_version_is_503(world):
    decider, registry, state = world
    registry.observe(heartbeat("stale", at=NOW - timedelta(seconds=3)))  # lease 2 s: expired
    registry.observe(heartbeat("draining", draining=True))
    registry.observe(WorkerHeartbeat(worker_id="other-model", model_versions=("x@1",), total_blocks=64,
                                     free_blocks=64, block_size=16, running=0, queued_tokens=0, occurred_at=NOW))
    reply = decider.submit(state, submit(), NOW).replies[0]
    assert (reply.http_status, reply.error_code) == (503, "no_capacity") and 1000 <= reply.retry_after_ms <= 1500
    assert not state.tenant("acme").generations


def test_refusal_reroutes_with_a_new_epoch_then_rejects_when_nobody_has_room(world):
    decider, registry, state = world
    registry.observe(heartbeat("w1"))
    registry.observe(heartbeat("w2", free_blocks=30))
    start = decider.submit(state, submit(), NOW).dispatch[0]
    assert start.worker_id == "w1"
    moved = decider.refused(state, AttemptRefused(tenant_id="acme", generation_id=start.generation_id, epoch=1,
                                                  worker_id="w1", reason="kv-full", attempt=start), NOW)
    (restart,) = moved.dispatch
    assert (restart.worker_id, restart.epoch, restart.input_token_ids) == ("w2", 2, start.input_token_ids)
    assert state.find("acme", start.generation_id).epoch == 2
    stale = decider.refused(state, AttemptRefused(tenant_id="acme", generation_id=start.generation_id, epoch=1,
                                                  worker_id="w1", reason="kv-full", attempt=start), NOW)
    assert not stale
    again = decider.refused(state, AttemptRefused(tenant_id="acme", generation_id=start.generation_id, epoch=2,
                                                  worker_id="w2", reason="kv-full", attempt=restart), NOW)
    assert [(d.worker_id, d.epoch) for d in again.dispatch] == [("w1", 3)]  # max_refusals = 2 reroutes
    ended = decider.refused(state, AttemptRefused(tenant_id="acme", generation_id=start.generation_id, epoch=3,
                                                  worker_id="w1", reason="kv-full", attempt=again.dispatch[0]), NOW)
    (rejected,) = ended.generations
    assert (rejected.type, rejected.epoch, rejected.error_code) == ("Rejected", 3, "no_capacity")
    assert state.tenant("acme").tokens_in_flight == 0


def test_a_refusal_without_the_order_rejects_at_once_and_releases_the_budget(world):
    decider, registry, state = world
    registry.observe(heartbeat("w1"))
    registry.observe(heartbeat("w2"))
    start = decider.submit(state, submit(), NOW).dispatch[0]
    ended = decider.refused(state, AttemptRefused(tenant_id="acme", generation_id=start.generation_id, epoch=1,
                                                  worker_id=start.worker_id, reason="kv-full"), NOW)
    (rejected,) = ended.generations
    assert (rejected.type, rejected.epoch, rejected.error_code) == ("Rejected", 1, "attempt_too_large")
    assert rejected.reason.startswith("worker refused the attempt (kv-full); ")
    assert not ended.dispatch and state.tenant("acme").tokens_in_flight == 0


def test_release_frees_the_budget_once_and_ignores_stale_epochs(world):
    decider, registry, state = world
    registry.observe(heartbeat("w1"))
    gen_id = decider.submit(state, submit(), NOW).replies[0].generation_id
    stale = ReleaseReservation(tenant_id="acme", generation_id=gen_id, epoch=2, used_tokens=10)
    assert not decider.release(state, stale, NOW)
    assert state.tenant("acme").tokens_in_flight == 64
    release = ReleaseReservation(tenant_id="acme", generation_id=gen_id, epoch=1, used_tokens=14,
                                 end_reason="completed")
    effects = decider.release(state, release, NOW)
    assert state.find("acme", gen_id).status == "ended" and state.tenant("acme").tokens_in_flight == 0
    assert effects.changelog[-1].rate_buckets == ((int(NOW.timestamp()), 14),)  # charged down to actual use
    assert not decider.release(state, release, NOW)


def test_lease_expiry_interrupts_and_releases_but_starts_nothing_new(world):
    decider, registry, state = world
    registry.observe(heartbeat("w1"))
    gen_id = decider.submit(state, submit(), NOW).replies[0].generation_id
    assert not decider.expire_leases(state, NOW + timedelta(seconds=1.9))
    effects = decider.expire_leases(state, NOW + timedelta(seconds=2.1))
    (interrupted,), (cancel,) = effects.generations, effects.dispatch
    assert (interrupted.type, interrupted.epoch, interrupted.worker_id) == ("Interrupted", 1, "w1")
    assert (cancel.type, cancel.reason) == ("CancelAttempt", "lease-expired")
    assert state.find("acme", gen_id).end_reason == "interrupted" and state.tenant("acme").concurrency == 0
    assert not decider.expire_leases(state, NOW + timedelta(seconds=5))


def test_an_attempt_its_worker_self_fenced_is_interrupted_while_the_worker_stays_live(world):
    # After a broker outage, heartbeats sent during it arrive late: the lease looks alive, yet the worker gave
    # its attempts up. Its heartbeat names them, and they end Interrupted instead of hanging forever.
    decider, registry, state = world
    registry.observe(heartbeat("w1"))
    gen_id = decider.submit(state, submit(), NOW).replies[0].generation_id
    registry.observe(heartbeat("w1", at=NOW + timedelta(seconds=1), fenced=(f"{gen_id}:2",)))
    assert not decider.expire_leases(state, NOW + timedelta(seconds=1.5))  # another epoch: not this attempt
    registry.observe(heartbeat("w1", at=NOW + timedelta(seconds=1.6), fenced=(f"{gen_id}:1",)))
    effects = decider.expire_leases(state, NOW + timedelta(seconds=1.7))
    (interrupted,), (cancel,) = effects.generations, effects.dispatch
    assert (interrupted.type, interrupted.epoch, cancel.reason) == ("Interrupted", 1, "lease-expired")
    assert state.find("acme", gen_id).end_reason == "interrupted" and state.tenant("acme").concurrency == 0
    assert not decider.expire_leases(state, NOW + timedelta(seconds=1.8))


def test_cancel_is_recorded_once_repeats_harmlessly_and_is_404_for_another_tenant(world):
    decider, registry, state = world
    registry.observe(heartbeat("w1"))
    gen_id = decider.submit(state, submit(), NOW).replies[0].generation_id
    cancel = CancelGeneration(tenant_id="acme", generation_id=gen_id, gateway_id="gw", correlation_id="c1")
    first, again = decider.cancel(state, cancel, NOW), decider.cancel(state, cancel, NOW)
    assert [e.type for e in first.generations] == ["CancelRequested"] and not again.generations
    assert [r.http_status for r in first.replies + again.replies] == [202, 202]
    assert [d.type for d in first.dispatch + again.dispatch] == ["CancelAttempt", "CancelAttempt"]
    foreign = CancelGeneration(tenant_id="mallory", generation_id=gen_id, gateway_id="gw", correlation_id="c2")
    assert decider.cancel(state, foreign, NOW).replies[0].http_status == 404


def test_changelog_rebuilds_the_same_budgets(world):
    decider, registry, state = world
    registry.observe(heartbeat("w1"))
    log = []
    for i in range(3):
        log += decider.submit(state, submit(f"r{i}", max_output=20), NOW).changelog
    first = state.find("acme", log[0].generation_id)
    log += decider.release(state, ReleaseReservation(tenant_id="acme", generation_id=first.generation_id, epoch=1,
                                                     used_tokens=9), NOW).changelog
    assert {record.plane for record in log} == {"ledgerlm-controller"}  # the runtime rebuilds its plane's only
    rebuilt = PartitionState(0)
    for record in log:
        rebuilt.apply_changelog(record)
    now_s = int(NOW.timestamp())
    for tenant in (state.tenant("acme"), rebuilt.tenant("acme")):
        assert (tenant.tokens_in_flight, tenant.concurrency, tenant.tokens_in_window(now_s)) == (48, 2, 57)
    assert decider.submit(rebuilt, submit("r1", max_output=20), NOW).replies[0].http_status == 200


def test_commands_the_gateway_gave_up_on_are_not_admitted(world):
    decider, registry, state = world
    registry.observe(heartbeat("w1", at=NOW + timedelta(seconds=30)))
    late = decider.submit(state, submit(), NOW + timedelta(seconds=30)).replies[0]
    assert (late.http_status, late.error_code) == (503, "command_expired")
    assert not state.tenant("acme").generations


def test_batch_work_without_room_now_is_held_and_counts_against_queued_tokens(world):
    decider, registry, state = world
    decider.tenants["acme"] = TenantLimits(max_queued_tokens=100)
    # 32 tokens of room; 10 tokens/s: the 32 missing tokens predict a 3.2 s wait, over the 2 s TTFT
    # allowance. Batch work is not sent to wait on the worker: the controller holds it.
    registry.observe(heartbeat("w1", free_blocks=2, tokens_per_s=10.0))
    interactive = decider.submit(state, submit("i", max_output=60), NOW).replies[0]
    first = decider.submit(state, submit("b1", max_output=60, tier="batch"), NOW)
    second = decider.submit(state, submit("b2", max_output=60, tier="batch"), NOW).replies[0]
    assert (interactive.http_status, interactive.error_code) == (503, "no_capacity")
    assert first.replies[0].http_status == 201 and not first.dispatch
    assert first.changelog[-1].type == "HeldAttempt" and state.tenant("acme").queued_tokens == 64
    assert (second.http_status, second.error_code) == (429, "queued_tokens")


def test_interactive_request_queues_when_the_predicted_ttft_fits_the_allowance(world):
    decider, registry, state = world
    # An optimistic worker reserves prompt + 32 headroom tokens: 36 of them for this request, 4 more than its
    # 32 tokens of room; with 100 queued prefill tokens at 200 tokens/s the wait is (100 + 4) / 200 = 0.52 s
    # and the TTFT 0.54 s (its own 4 tokens).
    registry.observe(heartbeat("w1", free_blocks=2, queued_tokens=100, tokens_per_s=200.0,
                               reservation="optimistic", headroom_tokens=32))
    effects = decider.submit(state, submit("q", max_output=60), NOW)
    assert effects.replies[0].http_status == 201 and effects.dispatch[0].worker_id == "w1"
    assert effects.changelog[0].queued and state.tenant("acme").queued_tokens == 64
    # The held reservation is what the worker will take (36 tokens), not the logical 64 of the tenant budget.
    assert registry.workers["w1"].room_tokens == 32 - 36


def test_interactive_request_beyond_the_predicted_ttft_is_503_with_a_retry_after_from_the_prediction(world):
    decider, registry, state = world
    # 600 queued prefill tokens at 200 tokens/s: a 3 s wait and its own 4 tokens, a 3.02 s TTFT where 2 s is
    # allowed -> retry in about 1 s.
    registry.observe(heartbeat("w1", free_blocks=64, queued_tokens=600, tokens_per_s=200.0,
                               reservation="optimistic", headroom_tokens=32))
    reply = decider.submit(state, submit("late", max_output=60), NOW).replies[0]
    assert (reply.http_status, reply.error_code) == (503, "no_capacity")
    assert 1020 <= reply.retry_after_ms <= 1530  # (3.02 - 2.0) s, jittered by up to +50%
    assert "predicted time to the first token, 3.02 s" in reply.reason and not state.tenant("acme").generations
    # The reason says what the TTFT is made of: the queue model, what is queued, and the worker's measured error.
    assert "queue model 3.00 s (600 prompt tokens queued ahead, 0 dispatched since" in reply.reason
    assert "TTFT model 3.02 s, + measured error +0.00 s" in reply.reason
    batch = decider.submit(state, submit("b", max_output=60, tier="batch"), NOW).replies[0]
    assert batch.http_status == 201  # batch work is never refused for load: the controller holds it


def test_queued_prompts_are_predicted_in_prefill_steps_of_the_token_budget(world):
    decider, registry, state = world
    # 300 queued prompt tokens leave room in the next 512-token step: this prefill starts beside them, no step
    # waited; 1,100 fill two whole steps of 400 ms first: 0.8 s, and its first token a step later, 1.2 s.
    for queued, request_id in ((300, "same-step"), (1100, "two-steps")):
        registry.observe(heartbeat("w1", queued_tokens=queued, tokens_per_s=50.0, prefill_step_ms=400.0,
                                   max_batched_tokens=512, reservation="optimistic", headroom_tokens=32))
        decision = decider.submit(state, submit(request_id, max_output=60), NOW)
        assert decision.replies[0].http_status == 201
        (start,) = [e for e in decision.dispatch if e.type == "StartAttempt"]
        assert start.model_wait_ms == (0 if queued == 300 else 800)
    # 2,600 (with the two just dispatched, not yet in a heartbeat: 2,608) are five whole steps, its first token
    # comes with the sixth: 2.4 s -> 503, retry once 0.4 s of it has passed.
    registry.observe(heartbeat("w1", queued_tokens=2600, tokens_per_s=50.0, prefill_step_ms=400.0,
                               max_batched_tokens=512, reservation="optimistic", headroom_tokens=32,
                               at=NOW + timedelta(seconds=1)))
    refused = decider.submit(state, submit("three-steps", max_output=60), NOW + timedelta(seconds=1)).replies[0]
    assert (refused.http_status, refused.error_code) == (503, "no_capacity")
    assert 400 <= refused.retry_after_ms <= 600


def test_a_refusal_names_the_workers_measured_error_beside_the_queue_model(world):
    decider, registry, state = world
    # Nothing queued, but the worker measured its recent interactive waits 1.8 s longer than the model said:
    # its own step (0.4 s) and that make 2.2 s.
    registry.observe(heartbeat("w1", queued_tokens=0, tokens_per_s=50.0, prefill_step_ms=400.0,
                               max_batched_tokens=512, wait_error_ms=1800.0))
    refused = decider.submit(state, submit("r", max_output=60), NOW).replies[0]
    assert (refused.http_status, refused.error_code) == (503, "no_capacity")
    assert "first token, 2.20 s (on w1: queue model 0.00 s (0 prompt tokens queued ahead" in refused.reason
    assert "TTFT model 0.40 s, + measured error +1.80 s" in refused.reason
