"""The flex path: PyTorch's FlexAttention reading the KV pool in place, steered by a BlockMask.

As in PyTorch's paged-attention recipe, a layer's keys and values are the whole pool seen as one sequence
of slots, [1, KVH, slots, D], broadcast over the query batch, and the BlockMask is in *physical* block ids
(its KV block size is the engine's block size). For query row b and query block i it lists

    full blocks    every slot visible: the kernel skips mask_mod there
    partial blocks the block holding the query position (and, for a chunk, those the causal edge crosses)

A decode step is one call with a batch of one-token rows; a chunk continuing earlier context is one call of
its own. The recipe maps a physical block back to its logical index with a [batch, num_blocks] table; one
[num_blocks] table serves every row here, because a block shared through the prefix cache is keyed by its
whole prefix and so sits at the same index in every table holding it. mask_mod is exact by itself, since
eager FlexAttention (the CPU path) ignores the block lists and evaluates it on every slot of the pool.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from engine.attention import AttentionShape, ChunkRows, DecodeRow, causal_self_attention

# Query rows per BlockMask row tile: a multiple of every Triton tile height (BLOCK_M), so the compiled kernel
# accepts it for any head grouping; a decode's single query row fills one tile.
Q_BLOCK = 128


def flex_block_size_ok(block_size: int) -> bool:
    """Whether the compiled kernel can take pages of this size: its KV tile shrinks to a power of two >= 16."""
    return block_size >= 16 and block_size & (block_size - 1) == 0


@dataclass(frozen=True)
class FlexChunk:
    start: int
    length: int
    mask: BlockMask | None  # None when pos0 == 0: causal SDPA over the chunk's own keys


@dataclass(frozen=True)
class FlexPlan:
    num_decodes: int
    decode_mask: BlockMask | None
    chunks: tuple[FlexChunk, ...]


class FlexAttention:
    """FlexAttention over the pool; compiled on CUDA (eager materialises scores over every slot of the pool,
    which is only good for checking it)."""

    name = "flex"

    def __init__(self, shape: AttentionShape, num_blocks: int, device: torch.device) -> None:
        self.shape = shape
        self.num_blocks = num_blocks
        self.device = device
        self._flex = torch.compile(flex_attention) if device.type == "cuda" else flex_attention

    def plan(self, decodes: Sequence[DecodeRow], chunks: Sequence[ChunkRows]) -> FlexPlan:
        bs = self.shape.block_size
        tables = [list(d.table[: -(-d.context // bs)]) for d in decodes]
        tables += [list(c.table[: -(-(c.pos0 + c.length) // bs)]) for c in chunks if c.pos0 > 0]
        block_pos = self._block_positions(tables)
        decode_mask = None
        if decodes:
            decode_mask = self._mask(tables[: len(decodes)], [d.context - 1 for d in decodes], 1, block_pos)
        planned, i = [], len(decodes)
        for c in chunks:
            mask = None
            if c.pos0 > 0:
                mask = self._mask(tables[i : i + 1], [c.pos0], c.length, block_pos)
                i += 1
            planned.append(FlexChunk(c.start, c.length, mask))
        return FlexPlan(len(decodes), decode_mask, tuple(planned))

    def _block_positions(self, tables: list[list[int]]) -> torch.Tensor:
        """[num_blocks]: the logical index of each block in the tables that hold it, -1 for blocks none holds."""
        block_pos = torch.full((self.num_blocks,), -1, dtype=torch.long, device=self.device)
        if tables:
            ids = torch.tensor([b for t in tables for b in t], dtype=torch.long, device=self.device)
            index = torch.tensor([j for t in tables for j in range(len(t))], dtype=torch.long, device=self.device)
            block_pos[ids] = index
        return block_pos

    def _mask(self, tables: list[list[int]], q_pos0: list[int], q_len: int, block_pos: torch.Tensor) -> BlockMask:
        """Rows b = 0..B-1 of `q_len` queries at positions q_pos0[b] + q, reading the blocks of tables[b]."""
        bs, dev = self.shape.block_size, self.device
        width = max(len(t) for t in tables)
        table = torch.tensor([t + [-1] * (width - len(t)) for t in tables], dtype=torch.long, device=dev)
        pos0 = torch.tensor(q_pos0, dtype=torch.long, device=dev)
        starts = torch.arange(0, q_len, Q_BLOCK, device=dev)
        q_first = pos0[:, None] + starts  # [B, row tiles]: first and last query position of each tile
        q_last = pos0[:, None] + (starts + Q_BLOCK).clamp(max=q_len) - 1
        kv_first = torch.arange(width, device=dev) * bs
        real = (table >= 0)[:, None, :]
        full = real & (kv_first + bs - 1 <= q_first[..., None])
        partial = real & (kv_first <= q_last[..., None]) & ~full

        def lists(wanted: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            # Wanted blocks first, in table order; entries past the count are never read.
            order = torch.argsort((~wanted).to(torch.int8), dim=-1, stable=True)
            ids = table[:, None, :].expand_as(wanted).gather(-1, order).clamp(min=0)
            return wanted.sum(-1, dtype=torch.int32)[:, None], ids.to(torch.int32)[:, None]

        def mask_mod(b, h, q_idx, kv_idx):
            block = kv_idx // bs
            logical = block_pos[block]
            # The width is read off the tensor, not closed over as an int, so that a compiled kernel does not
            # specialise on (and recompile for) each step's widest table.
            held = (logical >= 0) & (table[b, logical.clamp(0, table.shape[-1] - 1)] == block)
            return held & (logical * bs + kv_idx % bs <= pos0[b] + q_idx)

        num, ids = lists(partial)
        full_num, full_ids = lists(full)
        # Backward-only q-major lists are skipped: they would be dense over every block of the pool.
        return BlockMask.from_kv_blocks(num, ids, full_num, full_ids, BLOCK_SIZE=(Q_BLOCK, bs), mask_mod=mask_mod,
                                        seq_lengths=(q_len, self.num_blocks * bs), compute_q_blocks=False)

    def attend(self, plan: FlexPlan, q, k, v, k_pool, v_pool) -> torch.Tensor:
        s = self.shape
        kp, vp = k_pool.unsqueeze(0), v_pool.unsqueeze(0)  # [1, KVH, slots, D], broadcast over the rows
        parts = []
        if plan.num_decodes:
            n = plan.num_decodes
            out = self._flex(q[:n].unsqueeze(2), kp, vp, block_mask=plan.decode_mask, scale=s.scale,
                             enable_gqa=True)  # [n, H, 1, D]
            parts.append(out.reshape(n, s.q_size))
        for chunk in plan.chunks:
            rows = slice(chunk.start, chunk.start + chunk.length)
            if chunk.mask is None:
                parts.append(causal_self_attention(s, q, k, v, rows))
                continue
            qp = q[rows].transpose(0, 1).unsqueeze(0)  # [1, H, n, D]
            out = self._flex(qp, kp, vp, block_mask=chunk.mask, scale=s.scale, enable_gqa=True)
            parts.append(out[0].transpose(0, 1).reshape(chunk.length, s.q_size))
        return parts[0] if len(parts) == 1 else torch.cat(parts)
