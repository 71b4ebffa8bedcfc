"""Liveness that tells a starved reader or a slow broker from a dead worker.

The controller and the gateway judge a lease as of the time they have read the heartbeats through; a worker
keeps its lease while a recent heartbeat is still on its way to the broker."""
from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from types import SimpleNamespace

from consumers.controller.registry import WorkerRegistry
from consumers.worker.heartbeats import GIVE_UP_LEASES, HeartbeatAcks
from producers.gateway.admission.workers import EARLY_REFUSAL_LEASES, WorkerBoard
from schemas.registry_events import WorkerHeartbeat

SENT = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
LEASE_S = 5.0


def make_heartbeat(worker_id: str = "w1", **fields) -> WorkerHeartbeat:
    return WorkerHeartbeat(worker_id=worker_id, model_versions=("demo-tiny@1",), total_blocks=64, free_blocks=64,
                           block_size=16, running=0, queued_tokens=0, lease_ms=int(LEASE_S * 1000),
                           **{"occurred_at": SENT, **fields})


def test_a_heartbeat_is_within_its_lease_only_up_to_a_lease_after_its_sending():
    hb, sent = make_heartbeat(), SENT.timestamp()
    assert hb.within_lease(sent + LEASE_S)
    assert not hb.within_lease(sent + LEASE_S + 0.001)


def test_a_silence_counts_only_up_to_the_time_the_heartbeats_were_read_through():
    hb, sent = make_heartbeat(), SENT.timestamp()
    late = sent + LEASE_S + 30  # the reader wakes up 30 s past the lease (a frozen broker, a starved process)
    assert hb.within_lease(late, read_through=sent + 1)
    assert not hb.within_lease(late, read_through=sent + LEASE_S + 1)  # read past the lease: the worker is silent
    assert not hb.within_lease(sent + LEASE_S + 1, read_through=late)  # a read-through time never extends now


def test_the_controller_registry_keeps_a_worker_live_while_it_has_not_read_past_its_lease():
    registry = WorkerRegistry()
    registry.observe(make_heartbeat())
    late = SENT.timestamp() + LEASE_S + 10
    assert not registry.is_live("w1", late)
    registry.read_through = SENT.timestamp() + 2
    assert registry.is_live("w1", late)
    registry.read_through = SENT.timestamp() + LEASE_S + 2
    assert not registry.is_live("w1", late)
    assert not registry.is_live("unknown", late)


def test_the_gateway_board_judges_its_workers_as_of_its_read_through_time():
    board = WorkerBoard(plane="p")
    board.observe(make_heartbeat(plane="p"))
    late = SENT.timestamp() + LEASE_S + 10
    assert not board.could_serve(["demo-tiny@1"], 100, late + 3 * LEASE_S)
    read_through = SENT.timestamp() + 1
    assert board.could_serve(["demo-tiny@1"], 100, late, read_through)
    # live, but its pool could never hold it
    assert not board.could_serve(["demo-tiny@1"], 64 * 16 + 1, late, read_through)


def test_the_gateway_refuses_early_only_after_several_leases_of_silence_or_a_goodbye():
    board = WorkerBoard(plane="p")
    board.observe(make_heartbeat(plane="p"))
    sent = SENT.timestamp()
    a_moment_late = sent + LEASE_S + 1  # the controller may see it live again by the time it decides
    assert not board.is_live(board.latest["w1"], a_moment_late)
    assert board.could_serve(["demo-tiny@1"], 100, a_moment_late)
    assert board.could_serve(["demo-tiny@1"], 100, sent + EARLY_REFUSAL_LEASES * LEASE_S)
    assert not board.could_serve(["demo-tiny@1"], 100, sent + EARLY_REFUSAL_LEASES * LEASE_S + 0.01)
    assert board.freshest_age_s(["demo-tiny@1"], a_moment_late) == LEASE_S + 1
    assert board.freshest_age_s(["other@1"], a_moment_late) is None
    board.observe(make_heartbeat(plane="p", draining=True, occurred_at=datetime.fromtimestamp(sent + 1, UTC)))
    assert not board.could_serve(["demo-tiny@1"], 100, sent + 1)  # a draining worker stops counting at once


def make_acks(last_ok: float = 0.0) -> HeartbeatAcks:
    settings = SimpleNamespace(lease_ms=int(LEASE_S * 1000), heartbeat_interval_ms=1000)
    return HeartbeatAcks(SimpleNamespace(settings=settings, worker_id="w1", last_heartbeat_ok=last_ok))


async def test_a_heartbeat_on_its_way_holds_the_lease_and_its_acknowledgement_renews_it_from_its_sending():
    acks = make_acks()
    assert acks.must_fence(4.5)  # nothing acknowledged for lease - interval, nothing on its way
    delivery = asyncio.get_running_loop().create_future()
    acks.sent(delivery, sent_at=3.0)
    assert not acks.must_fence(4.5) and not acks.must_fence(6.9)
    assert acks.must_fence(7.1)  # the one on its way is itself older than the horizon
    delivery.set_result(None)
    await asyncio.sleep(0)  # the done callback runs on the loop
    assert acks.worker.last_heartbeat_ok == 3.0 and not acks.in_flight
    assert not acks.must_fence(6.9)


async def test_failed_heartbeats_leave_nothing_to_hold_the_lease():
    acks = make_acks()
    delivery = asyncio.get_running_loop().create_future()
    acks.sent(delivery, sent_at=3.0)
    delivery.set_exception(ConnectionError("broker gone"))
    await asyncio.sleep(0)
    assert acks.worker.last_heartbeat_ok == 0.0 and not acks.in_flight
    assert acks.must_fence(4.5)


async def test_heartbeats_forever_on_their_way_give_the_lease_up_after_a_few_leases():
    acks = make_acks()
    horizon = GIVE_UP_LEASES * LEASE_S
    acks.sent(asyncio.get_running_loop().create_future(), sent_at=horizon - 0.5)
    assert not acks.must_fence(horizon)
    assert acks.must_fence(horizon + 0.1)


async def test_a_worker_frozen_while_it_waits_for_a_description_counts_its_lease_from_the_heartbeat_it_stamped():
    """A freeze (here: the loop held for longer than lease - interval) inside the send, before the heartbeat is
    stamped, must not fence the worker: the controller counts the lease from the stamp, which is fresh."""
    import time

    from consumers.worker.heartbeats import heartbeat_loop

    settings = SimpleNamespace(lease_ms=2000, heartbeat_interval_ms=1000)  # fences 1 s after the newest stamp
    fenced = []

    class Frozen:
        worker_id, drained = "w1", True  # drained: the loop returns after one heartbeat

        def __init__(self) -> None:
            self.settings = settings
            self.last_heartbeat_ok = self.heartbeat_stamped_at = time.monotonic()

        async def send_heartbeat(self) -> asyncio.Future:
            time.sleep(1.3)  # SIGSTOPped while waiting for its description: nothing else on this loop runs
            self.heartbeat_stamped_at = time.monotonic()
            delivery = asyncio.get_running_loop().create_future()
            delivery.set_result(None)
            return delivery

        def fence_all(self) -> None:
            fenced.append(True)

    worker = Frozen()
    await heartbeat_loop(worker, SimpleNamespace(alive=True), lambda: fenced.append("fence"))
    assert fenced == []
    await asyncio.sleep(0)  # the acknowledgement's callback
    assert worker.last_heartbeat_ok == worker.heartbeat_stamped_at


def test_a_lapsed_lease_holding_nothing_is_not_reported_as_a_self_fence_but_one_holding_work_is(caplog):
    """`self-fenced` in the log means work was given up: a lease that lapses before any attempt arrived (a worker
    starting beside CPU hogs) is said apart, once per lost lease."""
    import logging

    from consumers.worker.runtime import Worker

    worker = Worker.__new__(Worker)
    worker.worker_id, worker.waiting, worker.attempts, worker.self_fenced = "w1", [], {}, {}
    worker.last_heartbeat_ok, worker._fence_said_after = 1.0, None
    with caplog.at_level(logging.WARNING, logger="consumers.worker.runtime"):
        worker.fence_all()
        worker.fence_all()  # the same lost lease: said once
    assert [r.getMessage() for r in caplog.records] == ["lease lapsed worker=w1 holding nothing"]

    caplog.clear()
    worker.waiting = [object()]  # an attempt waiting for room is given up too
    worker.fence_all()
    assert [r.getMessage() for r in caplog.records] == ["self-fenced worker=w1 attempts=0 stopped=1"]
