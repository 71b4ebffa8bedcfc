"""The worker's KV accounting: what its attempts reserve of the block pool and what a new one may take.

Reservation is worker-side accounting over the whole block pool. Optimistic
(the default): an attempt is accepted when its prompt plus a headroom fits
what is neither reserved nor in use (less a free-block watermark); its blocks
grow with its output and, when the pool runs dry, the engine preempts by
recompute (batch first, then lowest weight, newest first). Full: prompt + max
output up front, never preempted.
"""
from __future__ import annotations

from consumers.worker.attempts import blocks_for
from schemas.dispatch import StartAttempt


class KVAccounting:
    """Part of `Worker` (runtime.py): its pool (`total_blocks`, `block_size`), reservation policy (`engine`,
    `settings`), the `attempts` holding reservations and the engine thread's blocks in use."""

    @property
    def reserved_blocks(self) -> int:
        return sum(a.reserved_blocks for a in self.attempts.values())

    @property
    def watermark_blocks(self) -> int:
        return int(self.total_blocks * self.settings.worker_free_block_watermark) if self.optimistic else 0

    @property
    def optimistic(self) -> bool:
        return self.engine.config.reservation == "optimistic"

    @property
    def free_blocks(self) -> int:
        """Blocks a new attempt may reserve: neither reserved nor in use by growing sequences, less the watermark."""
        used = self._thread.stats.num_blocks_used if self._thread is not None else 0
        return max(0, self.total_blocks - self.watermark_blocks - max(self.reserved_blocks, used))

    def blocks_needed(self, order: StartAttempt) -> int:
        """What accepting `order` reserves: prompt + headroom (optimistic) or prompt + max output (full)."""
        output = order.max_output_tokens
        if self.optimistic:
            output = min(output, self.settings.worker_headroom_tokens)
        return blocks_for(len(order.input_token_ids) + output * order.sampling.n, self.block_size)
