"""The worker's share of KV admission: how much room an order asks the engine for. The engine is the one
authority on what is free (engine.reservations): the worker asks `engine.reserve` and gets room or None.

Optimistic (the default): an attempt asks for its prompt plus a headroom of output; its blocks grow with its
output and, when the pool runs dry, the engine preempts by recompute (batch first, then lowest weight, newest
first). Full: prompt + max output up front, never preempted.
"""
from __future__ import annotations

from engine.reservations import Reservation
from schemas.dispatch import StartAttempt


def attempt_id(order: StartAttempt) -> str:
    """The engine request id of an order's attempt: generation and epoch, so a later epoch never collides."""
    return f"{order.generation_id}#{order.epoch}"


class KVAccounting:
    """Part of `Worker` (runtime.py): its `engine` (which holds the reservations) and `settings` (headroom)."""

    @property
    def reserved_blocks(self) -> int:
        return self.engine.room.reserved_blocks

    @property
    def free_blocks(self) -> int:
        """Blocks a new attempt may reserve now, as the engine counts them."""
        return self.engine.room.free_blocks

    @property
    def optimistic(self) -> bool:
        return self.engine.config.reservation == "optimistic"

    def tokens_to_reserve(self, order: StartAttempt) -> int:
        """What accepting `order` reserves: prompt + headroom (optimistic) or prompt + max output (full)."""
        output = order.max_output_tokens
        if self.optimistic:
            output = min(output, self.settings.worker_headroom_tokens)
        return len(order.input_token_ids) + output * order.sampling.n

    def blocks_needed(self, order: StartAttempt) -> int:
        return self.engine.room.blocks_for(self.tokens_to_reserve(order))

    def reserve(self, order: StartAttempt) -> Reservation | None:
        """Room for `order` from the engine, or None when it has none free now."""
        return self.engine.reserve(attempt_id(order), self.tokens_to_reserve(order))

    def could_ever_fit(self, order: StartAttempt) -> bool:
        """Whether the pool could hold `order` once running work has freed it: worth waiting for."""
        return self.engine.room.fits(self.tokens_to_reserve(order))
