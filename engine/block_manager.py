"""`BlockManager`: ref-counted KV blocks, block tables and the prefix-cache index.

Every block is in exactly one of three states, so
free + cached_free + used == total at all times:

    free         ref 0, no hash          deque, handed out first
    cached_free  ref 0, hash registered  LRU OrderedDict, evicted oldest first
    used         ref > 0                 referenced by one or more sequences

Only full, computed blocks are hashed, so a shared block is never written
again (no copy-on-write needed). The engine steps synchronously and applies
frees only at step boundaries, so a block that reaches ref 0 is referenced by
no sequence and no in-flight step when it is handed out again.
"""
from __future__ import annotations

from collections import OrderedDict, deque

from engine.sequence import Sequence


class BlockManager:
    """Owns block ids [0, num_blocks); decides nothing about preemption."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_cache: bool = True) -> None:
        if num_blocks <= 0:
            raise ValueError("num_blocks must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_cache = enable_prefix_cache
        self.ref_counts = [0] * num_blocks
        self.block_hash: list[bytes | None] = [None] * num_blocks
        self.hash_to_block: dict[bytes, int] = {}
        self.free: deque[int] = deque(range(num_blocks))
        self.cached_free: OrderedDict[int, None] = OrderedDict()
        self.num_used = 0

    # -- counts -------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self.free)

    @property
    def num_cached_free(self) -> int:
        return len(self.cached_free)

    @property
    def num_available(self) -> int:
        """Blocks that can be handed out now (free plus evictable cached)."""
        return len(self.free) + len(self.cached_free)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # -- prefix cache -------------------------------------------------------
    def find_cached_prefix(self, seq: Sequence) -> list[int]:
        """Block ids holding the longest cached prefix of `seq` (no refs taken).

        At least one token is always left uncached so the step that computes
        it produces the logits for the next token.
        """
        if not self.enable_prefix_cache:
            return []
        max_blocks = (seq.num_tokens - 1) // self.block_size
        hits: list[int] = []
        for h in seq.block_hashes[:max_blocks]:
            block = self.hash_to_block.get(h)
            if block is None:
                break
            hits.append(block)
        return hits

    def commit_full_blocks(self, seq: Sequence) -> None:
        """Register newly completed, computed full blocks of `seq` in the prefix cache."""
        if not self.enable_prefix_cache:
            return
        num_full = min(seq.num_computed_tokens // self.block_size, len(seq.block_hashes))
        for i in range(seq.num_committed_blocks, num_full):
            h = seq.block_hashes[i]
            block = seq.block_table[i]
            # Another sequence may have computed the same content first; the
            # first copy stays canonical and this one is freed as plain.
            if h not in self.hash_to_block and self.block_hash[block] is None:
                self.hash_to_block[h] = block
                self.block_hash[block] = h
        seq.num_committed_blocks = max(seq.num_committed_blocks, num_full)

    # -- allocation ---------------------------------------------------------
    def allocate(self, seq: Sequence, num_new_tokens: int,
                 cached_blocks: list[int] | None = None) -> list[int] | None:
        """Make `seq.block_table` cover its computed tokens, `cached_blocks` and `num_new_tokens` more.

        Returns the blocks appended to the table (the cached hits first, then fresh ones; empty when it already
        covered them), or None, changing nothing, when the pool cannot supply them: the scheduler decides what
        to do then. An empty list is a success, so callers test `is None`, never truthiness.
        """
        cached_blocks = cached_blocks or []
        assert not cached_blocks or not seq.block_table, "prefix hits only for a fresh block table"
        covered = seq.num_computed_tokens + len(cached_blocks) * self.block_size + num_new_tokens
        num_new_blocks = max(self.blocks_needed(covered) - len(seq.block_table) - len(cached_blocks), 0)
        # Hits sitting in cached_free stop being available once we reference them.
        num_hits_idle = sum(1 for b in cached_blocks if self.ref_counts[b] == 0)
        if num_new_blocks > self.num_available - num_hits_idle:
            return None
        for b in cached_blocks:
            self._take(b)
        added = [*cached_blocks, *(self._pop_free() for _ in range(num_new_blocks))]
        seq.block_table.extend(added)
        return added

    def free_sequence(self, seq: Sequence) -> None:
        """Drop every reference `seq` holds. Tail blocks are released first so
        that LRU eviction removes a prompt's suffix before its shared prefix."""
        for b in reversed(seq.block_table):
            self.ref_counts[b] -= 1
            assert self.ref_counts[b] >= 0
            if self.ref_counts[b] == 0:
                self.num_used -= 1
                if self.block_hash[b] is not None:
                    self.cached_free[b] = None
                else:
                    self.free.append(b)
        seq.block_table = []
        seq.num_committed_blocks = 0

    def check_invariants(self) -> None:
        """Assert the three-state partition; cheap enough for tests after each step."""
        used = sum(1 for r in self.ref_counts if r > 0)
        assert used == self.num_used, (used, self.num_used)
        assert self.num_free + self.num_cached_free + self.num_used == self.num_blocks
        assert all(self.ref_counts[b] == 0 and self.block_hash[b] is None for b in self.free)
        assert all(self.ref_counts[b] == 0 and self.block_hash[b] is not None for b in self.cached_free)
        for h, b in self.hash_to_block.items():
            assert self.block_hash[b] == h

    # -- internals ----------------------------------------------------------
    def _take(self, block: int) -> None:
        if self.ref_counts[block] == 0:
            del self.cached_free[block]
            self.num_used += 1
        self.ref_counts[block] += 1

    def _pop_free(self) -> int:
        if self.free:
            block = self.free.popleft()
        else:
            block, _ = self.cached_free.popitem(last=False)
            h = self.block_hash[block]
            del self.hash_to_block[h]
            self.block_hash[block] = None
        self.ref_counts[block] = 1
        self.num_used += 1
        return block
