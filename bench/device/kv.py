"""The KV sizing section: what `auto` chose, and whether a full pool runs without running out of memory.

    chosen  the worker's engine settings (`engine_config(Settings(worker_device=...))`, pool `auto`) for the real
            model and the random Llama-3-8B shape: blocks, tokens, bytes, the share of device memory, `how`
    fill    a closed loop of long sequences (prompt P, output O, all at once, more than the pool holds) on the
            8B shape with a pool sized by `auto` (quick: a 96-block pool, so a CPU fills it in seconds),
            until all end or the time cap: peak blocks used, preemptions, failed steps (an out-of-memory inside
            a forward fails that step's batch, and the engine logs its error class), peak memory
"""
from __future__ import annotations

import dataclasses
import logging
import random
import time

from bench.device.engines import ModelSource, peak_memory, random_prompt, release

QUICK_FILL_BLOCKS = 96


class StepFailures(logging.Handler):
    """Error classes of the engine's failed steps (`engine step failed error=...`)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.errors: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("engine step failed"):
            self.errors.append(record.getMessage().split("error=")[1].split()[0])


def worker_config(device: str, **changes):
    from consumers.worker.engine_setup import engine_config
    from plumbing.settings import Settings

    return dataclasses.replace(engine_config(Settings(worker_device=device, worker_kv_cache_bytes="auto")),
                               **changes)


def chosen(ctx, source: ModelSource, total_bytes: int | None) -> dict:
    from engine.engine import Engine

    device, dtype = ctx.device_dtype()
    config = worker_config(str(device))
    engine = Engine(source.model_dir or "", config, artifacts=source.artifacts(dtype, device))
    spec = engine.kv_spec
    out = {"model": source.name, "how": engine.kv_size.how, "blocks": spec.num_blocks,
           "tokens": spec.num_slots, "bytes": spec.num_slots * spec.bytes_per_token,
           "bytes_per_token": spec.bytes_per_token, "max_model_len": engine.max_model_len,
           "max_num_batched_tokens": config.max_num_batched_tokens, "max_num_seqs": config.max_num_seqs,
           "share_of_device_memory": round(spec.num_slots * spec.bytes_per_token / total_bytes, 4)
           if total_bytes else None}
    del engine
    release(device)
    return out


def fill(ctx, source: ModelSource, cap_s: float) -> dict:
    import torch

    from engine.engine import Engine
    from engine.request import EngineRequest, FinishReason, SamplingParams

    device, dtype = ctx.device_dtype()
    quick = ctx.config.quick
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    config = worker_config(str(device), max_num_seqs=256 if quick else 1024,
                           max_num_batched_tokens=2048 if quick else 8192, enable_prefix_cache=False)
    if quick:
        config = dataclasses.replace(config, kv_cache_bytes=QUICK_FILL_BLOCKS * config.block_size *
                                     source.bytes_per_token(dtype, device))
    engine = Engine(source.model_dir or "", config, artifacts=source.artifacts(dtype, device))
    spec, vocab = engine.kv_spec, engine.artifacts.dims.vocab_size
    prompt_len = min(256 if quick else 4096, engine.max_model_len // 2)
    output_len = min(64 if quick else 128, engine.max_model_len - prompt_len)
    count = min(config.max_num_seqs, -(-int(1.3 * spec.num_slots) // (prompt_len + output_len)))
    rng = random.Random(3)
    failures = StepFailures()
    logging.getLogger("engine.engine").addHandler(failures)
    began, peak_used, failed, finished, steps = time.monotonic(), 0, 0, 0, 0
    try:
        for i in range(count):
            engine.add_request(EngineRequest(f"f{i}", random_prompt(rng, prompt_len, vocab),
                                             SamplingParams(max_tokens=output_len, ignore_eos=True)))
        while engine.has_unfinished() and time.monotonic() - began < cap_s:
            for out in engine.step():
                finished += out.finished
                failed += out.finish_reason is FinishReason.FAILED
            steps += 1
            peak_used = max(peak_used, engine.stats().num_blocks_used)
    finally:
        logging.getLogger("engine.engine").removeHandler(failures)
    stats = engine.stats()
    out = {"model": source.name, "pool": "explicit (quick)" if quick else "auto", "how": engine.kv_size.how,
           "blocks": spec.num_blocks, "tokens": spec.num_slots, "sequences": count, "prompt_tokens": prompt_len,
           "output_tokens": output_len, "demand_tokens": count * (prompt_len + output_len), "steps": steps,
           "seconds": round(time.monotonic() - began, 2), "finished": finished, "failed": failed,
           "all_finished": finished == count, "cut_at_cap": engine.has_unfinished(), "cap_s": round(cap_s, 1),
           "peak_blocks_used": peak_used, "peak_used_share": round(peak_used / spec.num_blocks, 4),
           "filled": peak_used >= spec.num_blocks - 1 or stats.num_preemptions > 0,
           "preemptions": stats.num_preemptions, "recomputed_tokens": stats.num_recomputed_tokens,
           "step_errors": sorted(set(failures.errors)),
           "oom": any("OutOfMemory" in e for e in failures.errors), "peak_memory": peak_memory(device)}
    del engine
    release(device)
    return out


def kv_section(ctx) -> dict:
    device, _ = ctx.device_dtype()
    total = ctx.environment.get("total_bytes")
    real, shaped = ModelSource.real(ctx.real), ModelSource.random(ctx)
    out: dict = {"chosen": [chosen(ctx, real, total), chosen(ctx, shaped, total)]}
    cap = max(5.0, min(ctx.remaining_s() - 5, 20.0 if ctx.config.quick else 120.0))
    try:
        out["fill"] = fill(ctx, shaped, cap)
    except Exception as exc:
        import torch

        if not isinstance(exc, torch.OutOfMemoryError):
            raise
        out["fill"] = {"model": shaped.name, "oom": True, "error": {"class": type(exc).__name__,
                                                                    "message": str(exc)[:1000]}}
        release(device)
    out["oom"] = bool(out["fill"].get("oom"))
    return out
