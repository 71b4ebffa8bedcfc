"""Which attention path an engine runs (`EngineConfig.attention`), and the micro-benchmark behind `auto`.

`auto` on a CPU is the gather path, by measurement (docs/engine.md, "Attention paths"): eager FlexAttention
scores every slot of the pool and was 17-211x slower there. On CUDA it is flex, unless `time_paths` run once
at engine start finds a decode step faster on the gather path, or flex fails there (a compile error).
"""
from __future__ import annotations

import logging
import statistics
import time

import torch

from engine.attention import AttentionPath, AttentionShape, DecodeRow, GatherAttention
from engine.errors import EngineError
from engine.flex_attention import FlexAttention, flex_block_size_ok

log = logging.getLogger(__name__)

ATTENTION_PATHS = ("auto", "gather", "flex")
# The engine-start measurement on CUDA: one mid-sized decode step, a few repetitions. Its first flex call
# compiles the kernel, which the first flex step would otherwise pay.
_PROBE_BATCH, _PROBE_CONTEXT, _PROBE_REPS = 16, 1024, 5


def make_path(name: str, shape: AttentionShape, num_blocks: int, device: torch.device,
              dtype: torch.dtype) -> AttentionPath:
    if name == "gather":
        return GatherAttention(shape, device, dtype)
    if name == "flex":
        return FlexAttention(shape, num_blocks, device)
    raise ValueError(f"unknown attention path {name!r}: choose one of {', '.join(ATTENTION_PATHS)}")


def choose_attention(name: str, shape: AttentionShape, num_layers: int, num_blocks: int, device: torch.device,
                     dtype: torch.dtype) -> AttentionPath:
    """The configured path; for `auto`, the one this device runs faster."""
    compiled_flex_ok = device.type != "cuda" or flex_block_size_ok(shape.block_size)
    if name == "flex" and not compiled_flex_ok:
        raise EngineError(f"attention 'flex' on CUDA needs a block size that is a power of two >= 16, "
                          f"not {shape.block_size}")
    if name != "auto":
        return make_path(name, shape, num_blocks, device, dtype)
    if device.type != "cuda" or not compiled_flex_ok:
        return GatherAttention(shape, device, dtype)
    try:
        times = time_paths(shape, _PROBE_BATCH, _PROBE_CONTEXT, device, dtype, num_layers, _PROBE_REPS)
    except Exception as exc:  # a compile failure must cost the engine its fast path, not its start
        log.warning("flex attention failed its start-up measurement error=%s; using gather", type(exc).__name__)
        return GatherAttention(shape, device, dtype)
    chosen = "flex" if times["flex_step_ms"] <= times["gather_step_ms"] else "gather"
    log.info("attention path=%s flex_step_ms=%.3f gather_step_ms=%.3f batch=%d context=%d", chosen,
             times["flex_step_ms"], times["gather_step_ms"], _PROBE_BATCH, _PROBE_CONTEXT)
    return make_path(chosen, shape, num_blocks, device, dtype)


def time_paths(shape: AttentionShape, batch: int, context: int, device: torch.device, dtype: torch.dtype,
               num_layers: int = 1, reps: int = 10, paths: tuple[str, ...] = ("gather", "flex")) -> dict:
    """Median times of one decode step's attention on each path: `batch` rows of `context` tokens each, their
    blocks scattered over a pool that holds just them. Per path: `plan_ms` (once per step), `attend_ms` (per
    layer) and `step_ms` = plan + num_layers x attend; `max_abs_diff` between the paths' outputs."""
    device = torch.device(device)
    bs = shape.block_size
    per_row = -(-context // bs)
    num_blocks = batch * per_row
    gen = torch.Generator().manual_seed(0)
    # A pool that has turned over holds a sequence's blocks anywhere, not side by side.
    order = torch.randperm(num_blocks, generator=gen).tolist()
    decodes = [DecodeRow(order[r * per_row : (r + 1) * per_row], context) for r in range(batch)]

    def randn(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=gen).to(device=device, dtype=dtype)

    k_pool, v_pool = (randn(shape.num_kv_heads, num_blocks * bs, shape.head_dim) for _ in range(2))
    q = randn(batch, shape.num_heads, shape.head_dim)
    unused = q.new_empty(0)  # this step's own keys are read only by chunks that start a sequence
    result: dict = {"device": device.type, "dtype": str(dtype).removeprefix("torch."), "batch": batch,
                    "context": context, "num_heads": shape.num_heads, "num_kv_heads": shape.num_kv_heads,
                    "head_dim": shape.head_dim, "block_size": bs, "num_layers": num_layers}
    outputs = []
    with torch.inference_mode():
        for name in paths:
            path = make_path(name, shape, num_blocks, device, dtype)
            plan = path.plan(decodes, [])
            for _ in range(2):  # warm-up: caches, allocator, and on CUDA the flex compile
                outputs.append(path.attend(plan, q, unused, unused, k_pool, v_pool))
            plan_s = _median_s(lambda: path.plan(decodes, []), reps, device)
            attend_s = _median_s(lambda: path.attend(plan, q, unused, unused, k_pool, v_pool), reps, device)
            result[f"{name}_plan_ms"] = round(plan_s * 1e3, 4)
            result[f"{name}_attend_ms"] = round(attend_s * 1e3, 4)
            result[f"{name}_step_ms"] = round((plan_s + num_layers * attend_s) * 1e3, 4)
    if len(paths) == 2:
        result["max_abs_diff"] = (outputs[0].float() - outputs[-1].float()).abs().max().item()
    return result


def _median_s(fn, reps: int, device: torch.device) -> float:
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)
