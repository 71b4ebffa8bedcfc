"""Which attempts the controller interrupts (issue 15, finding 3): a worker restarted under the same id, an
attempt its worker no longer lists, an attempt past the maximum run time. In memory, like test_decisions."""
from __future__ import annotations

from datetime import timedelta

from tests.controlplane.test_decisions import NOW, heartbeat, submit, world  # noqa: F401 -- `world` is a fixture


def at(seconds: float):
    return NOW + timedelta(seconds=seconds)


def test_a_worker_restarted_under_its_id_within_the_lease_has_its_earlier_attempts_interrupted(world):
    decider, registry, state = world
    registry.observe(heartbeat("w1", incarnation="first", attempts=()))
    gen_id = decider.submit(state, submit(), NOW).replies[0].generation_id
    registry.observe(heartbeat("w1", at=at(0.5), incarnation="first", attempts=(f"{gen_id}:1",)))
    assert not decider.expire_leases(state, at(0.6))
    # Restarted at once under the same id: the lease never lapsed, and the new process knows nothing of it.
    registry.observe(heartbeat("w1", at=at(1.0), incarnation="second", attempts=()))
    effects = decider.expire_leases(state, at(1.1))
    (interrupted,), (cancel,) = effects.generations, effects.dispatch
    assert (interrupted.type, interrupted.epoch, interrupted.worker_id, interrupted.reason) == (
        "Interrupted", 1, "w1", "worker-restarted")
    assert (cancel.reason, cancel.after_interruption) == ("worker-restarted", True)
    assert state.find("acme", gen_id).end_reason == "interrupted" and state.tenant("acme").concurrency == 0
    assert not decider.expire_leases(state, at(1.2)) and not registry.workers["w1"].lost


def test_an_attempt_its_worker_stops_listing_is_interrupted_after_a_lease_but_not_while_its_dispatch_is_in_flight(
        world):
    decider, registry, state = world
    registry.observe(heartbeat("w1", incarnation="only", attempts=()))
    gen_id = decider.submit(state, submit(), NOW).replies[0].generation_id
    held = (f"{gen_id}:1",)
    registry.observe(heartbeat("w1", at=at(1.5), incarnation="only", attempts=()))  # the order is on its way
    assert not decider.expire_leases(state, at(1.6))
    registry.observe(heartbeat("w1", at=at(1.8), incarnation="only", attempts=held))
    registry.observe(heartbeat("w1", at=at(3.0), incarnation="only", attempts=()))  # its release may be on its way
    assert not decider.expire_leases(state, at(3.1))
    registry.observe(heartbeat("w1", at=at(3.9), incarnation="only", attempts=()))  # unlisted for over a lease (2 s)
    (interrupted,) = decider.expire_leases(state, at(4.0)).generations
    assert (interrupted.epoch, interrupted.reason) == (1, "attempt-not-listed")
    assert state.tenant("acme").concurrency == 0


def test_an_attempt_whose_order_the_worker_has_not_read_yet_is_not_lost_however_late_its_heartbeat(world):
    """A frozen broker (or a starved worker) delays the order as well as the heartbeats: a heartbeat sent more
    than a lease after the dispatch but read through only to before it cannot be expected to list it."""
    decider, registry, state = world
    registry.observe(heartbeat("w1", incarnation="only", attempts=()))
    gen_id = decider.submit(state, submit(), NOW).replies[0].generation_id
    registry.observe(heartbeat("w1", at=at(3.9), incarnation="only", attempts=(), dispatch_read_through=at(-0.1)))
    assert not decider.expire_leases(state, at(4.0))
    registry.observe(heartbeat("w1", at=at(4.5), incarnation="only", attempts=(f"{gen_id}:1",),
                               dispatch_read_through=at(4.4)))  # read at last, and held
    assert not decider.expire_leases(state, at(4.6))
    registry.observe(heartbeat("w1", at=at(7.0), incarnation="only", attempts=(), dispatch_read_through=at(6.9)))
    (interrupted,) = decider.expire_leases(state, at(7.1)).generations  # read through, and unlisted for a lease
    assert (interrupted.epoch, interrupted.reason) == (1, "attempt-not-listed")


def test_an_attempt_running_past_the_maximum_run_time_is_interrupted_while_its_worker_lists_it(world):
    decider, registry, state = world
    decider.settings = decider.settings.model_copy(update={"max_attempt_s": 60.0})
    registry.observe(heartbeat("w1", incarnation="only", attempts=()))
    gen_id = decider.submit(state, submit(), NOW).replies[0].generation_id
    registry.observe(heartbeat("w1", at=at(59), incarnation="only", attempts=(f"{gen_id}:1",)))
    assert not decider.expire_leases(state, at(59.5))
    registry.observe(heartbeat("w1", at=at(60.5), incarnation="only", attempts=(f"{gen_id}:1",)))
    effects = decider.expire_leases(state, at(60.6))
    (interrupted,), (cancel,) = effects.generations, effects.dispatch
    assert (interrupted.reason, cancel.reason, cancel.worker_id) == ("max-attempt-time", "max-attempt-time", "w1")
    assert state.tenant("acme").tokens_in_flight == 0


def test_an_attempt_unlisted_after_its_release_is_not_lost_while_the_release_waits_in_the_commands_partition(world):
    """A controller that took the partition over (its owner was killed) judges `attempt-not-listed` only up to
    where it has read the partition's commands: the worker's release sent before it stopped listing the attempt
    waits there, and reading it ends the attempt completed, not interrupted."""
    decider, registry, state = world
    registry.observe(heartbeat("w1", incarnation="only", attempts=()))
    gen_id = decider.submit(state, submit(), NOW).replies[0].generation_id
    registry.observe(heartbeat("w1", at=at(0.5), incarnation="only", attempts=(f"{gen_id}:1",)))
    registry.observe(heartbeat("w1", at=at(9.0), incarnation="only", attempts=()))  # released at 0.6, unlisted since
    assert not decider.expire_leases(state, at(9.1), commands_read_through=float("-inf"))  # not read since taking over
    assert not decider.expire_leases(state, at(9.1), commands_read_through=NOW.timestamp() + 0.4)
    (interrupted,) = decider.expire_leases(state, at(9.1), commands_read_through=NOW.timestamp() + 8.0).generations
    assert interrupted.reason == "attempt-not-listed"  # read far past the release point: the attempt is lost


def test_a_description_older_than_its_heartbeat_judges_the_listing_as_of_when_it_was_described(world):
    """A starved worker's heartbeat thread keeps sending the description its loop last gave (heartbeat_thread.py):
    it cannot list an order the loop had not seen, and the dispatches it does not count stay pending."""
    decider, registry, state = world
    registry.observe(heartbeat("w1", incarnation="only", attempts=()))
    gen_id = decider.submit(state, submit(), NOW).replies[0].generation_id
    assert registry.workers["w1"].pending
    for second in (1.0, 2.0, 3.0, 3.9):  # the loop is stuck: every heartbeat re-sends a description of -0.2 s
        registry.observe(heartbeat("w1", at=at(second), incarnation="only", attempts=(), described_at=at(-0.2)))
        assert not decider.expire_leases(state, at(second + 0.1)) and registry.workers["w1"].pending
    registry.observe(heartbeat("w1", at=at(4.5), incarnation="only", attempts=(f"{gen_id}:1",),
                               described_at=at(4.4)))  # the loop is back, and holds it
    assert not registry.workers["w1"].pending
    registry.observe(heartbeat("w1", at=at(7.0), incarnation="only", attempts=(), described_at=at(6.9)))
    (interrupted,) = decider.expire_leases(state, at(7.1)).generations
    assert (interrupted.epoch, interrupted.reason) == (1, "attempt-not-listed")
