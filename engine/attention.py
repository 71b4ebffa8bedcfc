"""Attention over the paged KV pool, two ways (`EngineConfig.attention`).

A step's rows are its decodes first (one token each, longest context first), then its prefill chunks. A path
turns the step's block tables into a plan once per forward (`plan`), which every layer then attends with
(`attend`):

* `GatherAttention` (here): index_select the blocks of each decode group into contiguous keys and values for
  two batched matmuls; a chunk continuing earlier context gathers its blocks for SDPA with an additive mask.
* `FlexAttention` (engine.flex_attention): FlexAttention reads the pool in place through a BlockMask built
  from the block tables.

On both, a chunk with no earlier context (pos0 == 0) attends over its own keys with causal SDPA, which needs
no pool read at all. The choice between them is engine.attention_choice.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

# A decode row joins the current group while its context is at least this
# fraction of the group's longest: bounds padding waste per row at 50%.
_GROUP_FILL = 0.5
# ...and while the group's padded context stays under this many tokens: the
# gathered keys/values of one group then stay in the CPU cache between the
# gather and the two matmuls that read them, instead of going through DRAM.
GROUP_MAX_TOKENS = 4096


@dataclass(frozen=True)
class AttentionShape:
    """The numbers attention needs: heads, KV heads, head dim and the pool's block size."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    block_size: int

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def scale(self) -> float:
        return self.head_dim**-0.5


@dataclass(frozen=True)
class DecodeRow:
    """A one-token decode at position `context - 1`; `table` lists its blocks (at least ceil(context / bs))."""

    table: Sequence[int]
    context: int


@dataclass(frozen=True)
class ChunkRows:
    """Rows [start, start+length) of the batch: positions [pos0, pos0+length) of one sequence, whose blocks
    through position pos0 + length - 1 are `table`."""

    start: int
    length: int
    pos0: int
    table: Sequence[int]


class AttentionPath(Protocol):
    name: str

    def plan(self, decodes: Sequence[DecodeRow], chunks: Sequence[ChunkRows]) -> object:
        """Tensors for one step, built once and read by every layer."""

    def attend(self, plan, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_pool: torch.Tensor,
               v_pool: torch.Tensor) -> torch.Tensor:
        """[T, H*D] from q [T, H, D], this step's k/v [T, KVH, D] and a layer's pool [KVH, slots, D], which
        already holds this step's keys and values."""


def causal_self_attention(shape: AttentionShape, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          rows: slice) -> torch.Tensor:
    """A chunk that starts its sequence: its own keys are the whole context, already contiguous."""
    qp, kp, vp = (t[rows].transpose(0, 1).unsqueeze(0) for t in (q, k, v))  # [1, heads, n, D]
    out = F.scaled_dot_product_attention(qp, kp, vp, is_causal=True, scale=shape.scale, enable_gqa=True)
    return out[0].transpose(0, 1).reshape(-1, shape.q_size)


@dataclass(frozen=True)
class DecodeGroup:
    """Rows [start, start+count) are one-token decodes with similar context lengths.

    `block_tables` [count, W] lists each row's blocks (padded with block 0);
    `bias` [count, W * block_size] is 0 for real positions and -inf for
    padding. Rows are grouped by length so short contexts are not padded to
    the longest one in the step.
    """

    start: int
    count: int
    block_tables: torch.Tensor
    bias: torch.Tensor


@dataclass(frozen=True)
class GatherChunk:
    """A prefill chunk; `context_blocks` holds positions [0, pos0+length), None when pos0 == 0."""

    start: int
    length: int
    pos0: int
    context_blocks: torch.Tensor | None


@dataclass(frozen=True)
class GatherPlan:
    groups: tuple[DecodeGroup, ...]
    chunks: tuple[GatherChunk, ...]


class GatherAttention:
    """Copies each row's blocks out of the pool, then dense matmuls (decodes) or SDPA (chunks)."""

    name = "gather"

    def __init__(self, shape: AttentionShape, device: torch.device, dtype: torch.dtype) -> None:
        self.shape = shape
        self.device = device
        self.dtype = dtype

    def plan(self, decodes: Sequence[DecodeRow], chunks: Sequence[ChunkRows]) -> GatherPlan:
        groups = []
        start = 0
        while start < len(decodes):
            longest = decodes[start].context
            end = start + 1
            cap = max(1, GROUP_MAX_TOKENS // longest)
            while end < len(decodes) and end - start < cap and decodes[end].context >= _GROUP_FILL * longest:
                end += 1
            groups.append(self._group(decodes, start, end, longest))
            start = end
        bs = self.shape.block_size
        planned = tuple(
            GatherChunk(c.start, c.length, c.pos0,
                        self._tensor(c.table[: -(-(c.pos0 + c.length) // bs)]) if c.pos0 > 0 else None)
            for c in chunks
        )
        return GatherPlan(tuple(groups), planned)

    def _group(self, decodes: Sequence[DecodeRow], start: int, end: int, longest: int) -> DecodeGroup:
        bs = self.shape.block_size
        width = -(-longest // bs)
        # Padding entries point at block 0 (any valid block) and are masked to -inf.
        tables = [list(d.table[:width]) + [0] * (width - min(len(d.table), width)) for d in decodes[start:end]]
        contexts = torch.tensor([d.context for d in decodes[start:end]], device=self.device)
        valid = torch.arange(width * bs, device=self.device)[None, :] < contexts[:, None]
        bias = torch.zeros(valid.shape, dtype=self.dtype, device=self.device)
        bias.masked_fill_(~valid, float("-inf"))
        return DecodeGroup(start, end - start, self._tensor(tables), bias)

    def _tensor(self, values) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=self.device)

    def attend(self, plan: GatherPlan, q, k, v, k_pool, v_pool) -> torch.Tensor:
        s = self.shape
        group = s.num_heads // s.num_kv_heads
        kvh, hd, bs = s.num_kv_heads, s.head_dim, s.block_size
        # Block-granular view of the pool: gathering whole blocks (bs*D values
        # each) copies far fewer, larger pieces than gathering single slots.
        k_blocks = k_pool.view(kvh, -1, bs * hd)
        v_blocks = v_pool.view(kvh, -1, bs * hd)
        parts = []
        for g in plan.groups:
            n, width = g.block_tables.shape
            flat = g.block_tables.view(-1)
            # [KVH, n, group, D] @ [KVH, n, D, C]: one batched matmul per group.
            # The scale is folded into q (n*H*D values) rather than the scores.
            qd = (q[g.start : g.start + n] * s.scale).view(n, kvh, group, hd).transpose(0, 1)
            kd = k_blocks.index_select(1, flat).view(kvh, n, width * bs, hd)
            scores = torch.matmul(qd, kd.transpose(-1, -2))
            scores += g.bias[None, :, None, :]
            probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
            vd = v_blocks.index_select(1, flat).view(kvh, n, width * bs, hd)
            out = torch.matmul(probs, vd)  # [KVH, n, group, D]
            parts.append(out.transpose(0, 1).reshape(n, s.q_size))
        for chunk in plan.chunks:
            rows = slice(chunk.start, chunk.start + chunk.length)
            if chunk.context_blocks is None:
                parts.append(causal_self_attention(s, q, k, v, rows))
                continue
            qp = q[rows].transpose(0, 1).unsqueeze(0)  # [1, H, n, D]
            ctx = chunk.pos0 + chunk.length
            kp = k_blocks[:, chunk.context_blocks].view(1, kvh, -1, hd)[:, :, :ctx]
            vp = v_blocks[:, chunk.context_blocks].view(1, kvh, -1, hd)[:, :, :ctx]
            # An additive float mask measured ~25% faster than a boolean one on CPU.
            qpos = torch.arange(chunk.pos0, ctx, device=q.device)
            hidden = torch.arange(ctx, device=q.device)[None, :] > qpos[:, None]
            mask = torch.zeros(hidden.shape, dtype=q.dtype, device=q.device).masked_fill_(hidden, float("-inf"))
            out = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask, scale=s.scale, enable_gqa=True)
            parts.append(out[0].transpose(0, 1).reshape(chunk.length, s.q_size))
        return parts[0] if len(parts) == 1 else torch.cat(parts)
