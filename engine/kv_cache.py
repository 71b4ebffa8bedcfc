"""The paged KV pool: one preallocated tensor holding every block of every layer.

Layout, chosen so a gather by slot index yields [kv_heads, batch, context, head_dim]
whose two batch dimensions are already contiguous for a batched matmul:

    pool[layer, 0=key|1=value, kv_head, slot, head_dim]     slot = block * block_size + offset
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    """docs/design-rules.md (Words): 2 (key and value) x layers x kv_heads x head_dim x bytes per element."""
    return 2 * num_layers * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


@dataclass(frozen=True)
class KVCacheSpec:
    """Shape of the pool, derived from the model and the byte budget."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    block_size: int
    num_blocks: int

    @classmethod
    def from_budget(
        cls, num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype, block_size: int, kv_cache_bytes: int
    ) -> "KVCacheSpec":
        per_block = block_size * kv_bytes_per_token(num_layers, num_kv_heads, head_dim, dtype)
        return cls(num_layers, num_kv_heads, head_dim, dtype, block_size, kv_cache_bytes // per_block)

    @property
    def bytes_per_token(self) -> int:
        return kv_bytes_per_token(self.num_layers, self.num_kv_heads, self.head_dim, self.dtype)

    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.block_size

    def allocate(self, device: torch.device) -> torch.Tensor:
        return torch.zeros(
            (self.num_layers, 2, self.num_kv_heads, self.num_slots, self.head_dim), dtype=self.dtype, device=device
        )
