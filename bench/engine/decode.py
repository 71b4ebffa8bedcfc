"""Decode step time vs its matmul-only lower bound at fixed batch sizes.

For each batch size B: B requests with `context`-token prompts are prefilled,
then whole engine steps (schedule, forward, sampling, bookkeeping) that are
pure decode steps of B rows are timed. The bound is the time of the same
step's matmuls alone (every projection plus the LM head at M=B), the floor
any implementation pays on this CPU; the ratio shows what attention and
Python cost on top.
"""
from __future__ import annotations

import random
import statistics
import time
from pathlib import Path

import torch


def matmul_lower_bound_s(engine, batch: int, reps: int = 7) -> float:
    w = engine.runner.model.w
    mats = [m for layer in w.layers for m in (layer["qkv"], layer["o"], layer["gate_up"], layer["down"])]
    mats.append(w.lm_head)
    x = {m.shape[1]: torch.randn(batch, m.shape[1], dtype=m.dtype) for m in mats}
    best = float("inf")
    with torch.inference_mode():
        for _ in range(reps):
            s = time.perf_counter()
            for m in mats:
                torch.nn.functional.linear(x[m.shape[1]], m)
            best = min(best, time.perf_counter() - s)
    return best


def decode_sweep(model_dir: Path, batch_sizes=(1, 8, 32), context: int = 128, steps: int = 12) -> list[dict]:
    from engine.config import EngineConfig
    from engine.engine import Engine
    from engine.request import EngineRequest, SamplingParams

    rows = []
    for b in batch_sizes:
        engine = Engine(model_dir, EngineConfig(kv_cache_bytes=1 << 30, max_num_batched_tokens=max(b * context, 512),
                                                max_num_seqs=max(b, 1), device="cpu", dtype="float32"))
        vocab = engine.runner.model.dims.vocab_size
        rng = random.Random(b)
        for i in range(b):
            prompt = tuple(rng.randrange(100, vocab) for _ in range(context))
            engine.add_request(EngineRequest(f"d{i}", prompt, SamplingParams(max_tokens=steps + 3, ignore_eos=True)))
        while engine.stats().num_waiting:  # prefill (and the first token) outside the timing
            engine.step()
        engine.step()
        times = []
        for _ in range(steps):
            s = time.perf_counter()
            outputs = engine.step()
            times.append(time.perf_counter() - s)
            assert len(outputs) == b, "a step of this sweep must decode every request"
        step_s = statistics.median(times)
        bound = matmul_lower_bound_s(engine, b)
        rows.append({"batch": b, "context": context, "steps": steps, "step_ms_p50": round(step_s * 1e3, 2),
                     "matmul_lower_bound_ms": round(bound * 1e3, 2), "ratio_to_bound": round(step_s / bound, 2),
                     "output_tok_s": round(b / step_s, 1)})
        del engine
    return rows
