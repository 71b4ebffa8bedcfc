"""Engine configuration: one frozen value passed to `Engine`."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Mapping

from engine.kv_sizing import MemoryPolicy

Reservation = Literal["optimistic", "full"]
DType = Literal["auto", "float32", "float64", "bfloat16", "float16"]
Attention = Literal["auto", "gather", "flex"]


@dataclass(frozen=True)
class EngineConfig:
    """How much memory and compute one engine may use, and how it shares them.

    * `kv_cache_bytes` sizes the KV block pool:
      num_blocks = kv_cache_bytes // (block_size * kv_bytes_per_token);
      None sizes it from the machine with `memory` (see `engine.kv_sizing`).
    * `max_num_batched_tokens` is the per-step token budget (decode tokens plus
      prefill chunk tokens); `max_num_seqs` caps sequences in one step.
    * `batch_step_tokens`: while any interactive sequence is running or waiting,
      batch sequences get at most this many of a step's tokens (their decodes
      first; a running decode is never held back), so a step beside a batch
      backlog stays short enough for the interactive first tokens and gaps.
    * `reservation="optimistic"` allocates blocks as tokens arrive and preempts
      by recompute when the pool runs dry; `"full"` reserves prompt + max
      output tokens at admission and never preempts.
    * `free_block_watermark`: under optimistic reservation, the share of the pool
      `Engine.reserve` keeps free for sequences growing past their promise.
    * `tenant_weights` weights the fair queue by tokens served (default 1.0).
    * `device`/`dtype` "auto": CUDA + bfloat16 when available, else CPU float32.
    * `attention` (engine.attention): "gather" copies each row's KV blocks out
      of the pool for dense matmuls; "flex" runs FlexAttention over the pool in
      place (compiled on CUDA, where it needs a power-of-two block size >= 16);
      "auto" is gather on a CPU (measured faster there) and, on CUDA, flex unless
      a decode step timed at engine start is faster on gather
      (engine.attention_choice).
    * `expected_checksums`: the registered model version's file checksums; the
      directory's manifest must agree with them exactly.
    * `max_model_len`: defaults to the model's max_position_embeddings (or its
      sliding window, whichever is smaller).
    """

    kv_cache_bytes: int | None = 256 * 1024 * 1024
    block_size: int = 16
    max_num_batched_tokens: int = 512
    max_num_seqs: int = 64
    batch_step_tokens: int = 128
    max_model_len: int | None = None
    reservation: Reservation = "optimistic"
    enable_prefix_cache: bool = True
    free_block_watermark: float = 0.0
    tenant_weights: Mapping[str, float] = field(default_factory=dict)
    device: str = "auto"
    dtype: DType = "auto"
    attention: Attention = "auto"
    expected_checksums: Mapping[str, str] | None = None
    memory: MemoryPolicy = field(default_factory=MemoryPolicy)

    def __post_init__(self) -> None:
        if self.block_size <= 0:
            raise ValueError("block_size must be positive")
        if self.max_num_batched_tokens <= 0 or self.max_num_seqs <= 0:
            raise ValueError("max_num_batched_tokens and max_num_seqs must be positive")
        if self.batch_step_tokens < 0:
            raise ValueError("batch_step_tokens must not be negative")
        if self.reservation not in ("optimistic", "full"):
            raise ValueError(f"unknown reservation policy {self.reservation!r}")
        if self.attention not in ("auto", "gather", "flex"):
            raise ValueError(f"unknown attention path {self.attention!r}: choose auto, gather or flex")
        if not 0 <= self.free_block_watermark < 1:
            raise ValueError("free_block_watermark must be in [0, 1)")
        if any(w <= 0 for w in self.tenant_weights.values()):
            raise ValueError("tenant weights must be positive")

    def weight_of(self, tenant_id: str) -> float:
        return float(self.tenant_weights.get(tenant_id, 1.0))
