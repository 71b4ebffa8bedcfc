"""Room in the KV pool promised to requests: the one ledger a caller admits work by.

A caller (the worker) asks for room before it hands a request over, `Engine.reserve(id, tokens)`, and gets a
`Reservation` or None; it gives the room back with `Engine.release(id)` once the request has left. What is
free for a new reservation is the pool less the larger of what is promised and what the sequences use (a
sequence grows past its promise under optimistic reservation; the scheduler then preempts), less a watermark
kept free under optimistic reservation. The scheduler itself allocates blocks as it always did: a reservation
is a promise of room, never a set of block ids, so prefix-cache hits and preemption stay the scheduler's.

Thread safety: reservations are taken and released on the caller's thread while the engine steps on its own.
One lock guards the ledger's counters, held for a few additions and never around another lock or engine call.
The blocks in use are published by the engine at each step boundary (`note_used`), not read live: mid-step a
preemption has freed blocks that the same step takes again, and that count means nothing to a caller.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass


@dataclass(frozen=True)
class Reservation:
    """`num_blocks` blocks of the pool promised to request `request_id`."""

    request_id: str
    num_blocks: int


class KVReservations:
    def __init__(self, num_blocks: int, block_size: int, keep_free_blocks: int = 0) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.keep_free_blocks = keep_free_blocks
        self._lock = threading.Lock()
        self._held: dict[str, int] = {}
        self._reserved = 0
        self._used = 0  # blocks the sequences used at the last step boundary

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def fits(self, num_tokens: int) -> bool:
        """Whether room for `num_tokens` could ever be reserved: in a pool with nothing else in it."""
        return self.blocks_for(num_tokens) <= self.num_blocks - self.keep_free_blocks

    def reserve(self, request_id: str, num_tokens: int) -> Reservation | None:
        """Room for `num_tokens` promised to `request_id`, or None (nothing changes) when it is not free now."""
        need = self.blocks_for(num_tokens)
        with self._lock:
            if request_id in self._held:
                raise ValueError(f"request {request_id!r} already holds a reservation")
            if need > self._free():
                return None
            self._held[request_id] = need
            self._reserved += need
        return Reservation(request_id, need)

    def release(self, request_id: str) -> None:
        """Give back the room of `request_id` (nothing when it holds none)."""
        with self._lock:
            self._reserved -= self._held.pop(request_id, 0)

    def note_used(self, num_used: int) -> None:
        """The engine, at a step boundary: how many blocks its sequences use now."""
        with self._lock:
            self._used = num_used

    @property
    def free_blocks(self) -> int:
        """Blocks a new reservation may take now."""
        with self._lock:
            return self._free()

    @property
    def reserved_blocks(self) -> int:
        with self._lock:
            return self._reserved

    def _free(self) -> int:
        return max(0, self.num_blocks - self.keep_free_blocks - max(self._reserved, self._used))
