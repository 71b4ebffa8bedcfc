"""Room in the KV pool as the engine counts it: reservations against the larger of promised and used blocks, a
watermark kept free under optimistic reservation, and no over-commit when threads race for the last blocks."""
from __future__ import annotations

import sys
import threading

import pytest

from engine.reservations import KVReservations, Reservation
from engine_factories import BLOCK, make_request, run_engine


def test_a_reservation_is_granted_while_room_is_free_and_given_back_on_release():
    room = KVReservations(num_blocks=10, block_size=4, keep_free_blocks=1)
    assert room.reserve("a", 13) == Reservation("a", 4)
    assert room.reserve("b", 20) == Reservation("b", 5)
    assert (room.reserved_blocks, room.free_blocks) == (9, 0)
    assert room.reserve("c", 1) is None and room.reserved_blocks == 9  # refused: nothing changes
    assert room.fits(36) and not room.fits(37)  # 9 blocks once the pool is empty, 10 never
    room.release("a")
    room.release("a")  # twice is nothing
    assert (room.reserved_blocks, room.free_blocks) == (5, 4)
    with pytest.raises(ValueError, match="'b' already holds a reservation"):
        room.reserve("b", 4)


def test_blocks_growing_past_their_promise_leave_less_room():
    room = KVReservations(num_blocks=10, block_size=4)
    room.reserve("a", 8)
    room.note_used(7)  # sequences grew to 7 blocks: the larger count is what is gone
    assert room.free_blocks == 3 and room.reserve("b", 16) is None and room.reserve("b", 12) is not None


def test_the_engine_counts_its_used_blocks_at_each_step_boundary(make_engine):
    engine = make_engine(reservation="optimistic", free_block_watermark=0.25)
    total = engine.stats().num_blocks_total
    assert engine.room.keep_free_blocks == total // 4 and engine.room.free_blocks == total - total // 4
    assert engine.reserve("r", 2 * BLOCK) == Reservation("r", 2)
    engine.add_request(make_request("r", [7] * (3 * BLOCK + 1), max_tokens=BLOCK))
    engine.step()
    used = engine.stats().num_blocks_used
    assert used == 4 and engine.room.free_blocks == total - total // 4 - used  # used outgrew the promise
    run_engine(engine)
    engine.release("r")
    assert engine.room.free_blocks == total - total // 4


def test_threads_racing_for_the_last_blocks_never_get_more_than_the_pool():
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: a check-then-take race would show
    try:
        for _ in range(20):
            room = KVReservations(num_blocks=50, block_size=1)
            granted: list[Reservation] = []
            start = threading.Barrier(8)

            def take(worker: int) -> None:
                start.wait()
                for i in range(40):
                    if (reservation := room.reserve(f"{worker}-{i}", 1)) is not None:
                        granted.append(reservation)
                    room.note_used(0)

            threads = [threading.Thread(target=take, args=(w,)) for w in range(8)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            assert len(granted) == 50 and room.reserved_blocks == 50 and room.free_blocks == 0
    finally:
        sys.setswitchinterval(interval)
