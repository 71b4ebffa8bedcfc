"""The prefill section: prompt tokens per second, and a long prompt chunked in beside running decodes.

    alone        one prompt of L tokens in one step (the step budget is L), to its first token; median of reps
    interleaved  N decodes running, then one prompt of the longest L arrives; the default step budget (512
                 tokens) takes decode rows first and the prompt in chunks: the new prompt's TTFT, and the
                 running rows' inter-token latency before and while it is prefilled
"""
from __future__ import annotations

import random
import statistics
import time

from bench.device.decode import check_not_failed
from bench.device.engines import ModelSource, drain, random_prompt, release

INTERLEAVED_BUDGET = 512  # EngineConfig's default max_num_batched_tokens: what a worker runs with


def prefill_alone(ctx, source: ModelSource, lengths: tuple[int, ...], reps: int) -> dict:
    from engine.request import EngineRequest, SamplingParams

    longest = max(lengths)
    engine = source.engine(ctx, tokens=2 * longest + 64, max_num_seqs=4, max_num_batched_tokens=longest)
    vocab, device = engine.artifacts.dims.vocab_size, engine.device
    rows, rng = [], random.Random(7)
    for n, length in enumerate(sorted(lengths)):
        fits = min(length, engine.max_model_len - 1)
        times = []
        for rep in range(reps + 1):  # the first is a warm-up at this length
            engine.add_request(EngineRequest(f"p{n}-{rep}", random_prompt(rng, fits, vocab),
                                             SamplingParams(max_tokens=1, ignore_eos=True)))
            began = time.perf_counter()
            while engine.has_unfinished():
                check_not_failed(engine.step())
            times.append(time.perf_counter() - began)
        median = statistics.median(times[1:])
        rows.append({"prompt_tokens": fits, "asked": length, "reps": reps, "ttft_ms_p50": round(median * 1e3, 2),
                     "prompt_tok_s": round(fits / median, 1)})
        if ctx.remaining_s() <= 0:
            break
    del engine
    release(device)
    return {"model": source.name, "rows": rows}


def interleaved(ctx, source: ModelSource, decodes: int, length: int) -> dict:
    from engine.request import EngineRequest, SamplingParams

    decode_prompt = 32 if ctx.config.quick else 128
    engine = source.engine(ctx, tokens=decodes * (decode_prompt + 256 + 16) + length + 64, max_num_seqs=decodes + 1,
                           max_num_batched_tokens=INTERLEAVED_BUDGET)
    vocab, device = engine.artifacts.dims.vocab_size, engine.device
    length = min(length, engine.max_model_len - 1)
    rng = random.Random(11)
    ids = [f"r{i}" for i in range(decodes)]
    room = min(256, engine.max_model_len - decode_prompt)
    for request_id in ids:
        engine.add_request(EngineRequest(request_id, random_prompt(rng, decode_prompt, vocab),
                                         SamplingParams(max_tokens=room, ignore_eos=True)))
    seen: dict[str, list[float]] = {request_id: [] for request_id in ids}

    def step() -> list:
        outputs = engine.step()
        now = time.perf_counter()
        check_not_failed(outputs)
        for out in outputs:
            if out.new_token_ids and out.request_id in seen:
                seen[out.request_id].append(now)
        return outputs

    while any(not times for times in seen.values()):
        step()
    for _ in range(6):  # the running rows' pace before the prompt arrives
        step()
    arrived = time.perf_counter()
    engine.add_request(EngineRequest("long", random_prompt(rng, length, vocab),
                                     SamplingParams(max_tokens=1, ignore_eos=True)))
    steps, first = 0, None
    while first is None:
        steps += 1
        if any(o.request_id == "long" and o.new_token_ids for o in step()):
            first = time.perf_counter()
    drain(engine, ids)
    before = [b - a for times in seen.values() for a, b in zip(times, times[1:]) if b <= arrived]
    during = [b - a for times in seen.values() for a, b in zip(times, times[1:]) if arrived < b <= first]
    del engine
    release(device)

    def ms(values: list[float], q: float) -> float | None:
        return round(sorted(values)[min(len(values) - 1, int(q * len(values)))] * 1e3, 3) if values else None

    return {"model": source.name, "running_decodes": decodes, "prompt_tokens": length,
            "step_budget_tokens": INTERLEAVED_BUDGET, "steps_to_first_token": steps,
            "ttft_ms": round((first - arrived) * 1e3, 2),
            "itl_ms_before": {"p50": ms(before, 0.5), "p95": ms(before, 0.95), "n": len(before)},
            "itl_ms_during": {"p50": ms(during, 0.5), "p95": ms(during, 0.95), "max": ms(during, 1.0),
                              "n": len(during)}}


def prefill_section(ctx) -> dict:
    config = ctx.config
    reps = 2 if config.quick else 3
    out: dict = {"alone": [], "interleaved": []}
    for source in (ModelSource.real(ctx.real), ModelSource.random(ctx)):
        if ctx.remaining_s() <= 0:
            out["cut"] = "budget"
            break
        out["alone"].append(prefill_alone(ctx, source, config.prefill_lengths, reps))
        out["interleaved"].append(interleaved(ctx, source, config.interleaved_decodes, max(config.prefill_lengths)))
    return out
