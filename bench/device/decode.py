"""The decode section: output tok/s and step time at fixed batch sizes, against the memory-bandwidth roofline.

For each model (the real one, the random Llama-3-8B shape) and each attention path, one engine; for each batch B,
B requests with `context`-token random prompts are prefilled outside the timing, then whole engine steps that
are pure decode steps of B rows are timed. A decode step must read every weight once and every live KV entry
once, so its floor is

    roofline_s = (weight bytes + sum of the rows' contexts x KV bytes per token) / measured copy bandwidth

and `roofline_ratio` = roofline_s / step_s (1.0: the step runs at memory speed).
"""
from __future__ import annotations

import random
import statistics
import time

from bench.device.engines import ModelSource, attention_values, drain, random_prompt, release
from bench.device.environment import measure_bandwidth, synchronize
from bench.device.models import weight_bytes_read_per_step


def bandwidth_gb_s(ctx, device) -> tuple[float, str]:
    measured = ctx.environment.get("bandwidth", {}).get("gb_s")
    if measured:
        return measured, "environment section"
    return measure_bandwidth(device)["gb_s"], "measured by the decode section"


def check_not_failed(outputs) -> None:
    """A failed step (its error class is in the engine's log) ends the row: its requests never decode."""
    from engine.request import FinishReason

    failed = [o.request_id for o in outputs if o.finish_reason is FinishReason.FAILED]
    if failed:
        raise RuntimeError(f"{len(failed)} requests failed in an engine step (see the engine's log for the error)")


def warm_up(engine) -> None:
    """First-touch allocations and kernel selection, not measured."""
    from engine.request import EngineRequest, SamplingParams

    prompt = random_prompt(random.Random(0), 32, engine.artifacts.dims.vocab_size)
    engine.add_request(EngineRequest("warm", prompt, SamplingParams(max_tokens=4, ignore_eos=True)))
    while engine.has_unfinished():
        check_not_failed(engine.step())


def decode_row(engine, batch: int, context: int, steps: int, seed: int, bandwidth: float) -> dict:
    from engine.request import EngineRequest, SamplingParams

    device = engine.device
    vocab = engine.artifacts.dims.vocab_size
    rng = random.Random(seed)
    ids = [f"d{seed}-{i}" for i in range(batch)]
    for request_id in ids:
        engine.add_request(EngineRequest(request_id, random_prompt(rng, context, vocab),
                                         SamplingParams(max_tokens=steps + 4, ignore_eos=True)))
    prefill_began = time.perf_counter()
    started: set[str] = set()
    while len(started) < batch:  # every prompt prefilled and its first token out: each row decodes from here on
        outputs = engine.step()
        started.update(o.request_id for o in outputs if o.new_token_ids)
        check_not_failed(outputs)
    prefill_s = time.perf_counter() - prefill_began
    per_token = engine.kv_spec.bytes_per_token
    weights = weight_bytes_read_per_step(engine)
    times, kv_read, short = [], [], 0
    for _ in range(steps):
        kv_read.append(sum(seq.num_tokens for seq in engine.scheduler.running) * per_token)
        synchronize(device)
        began = time.perf_counter()
        outputs = engine.step()
        synchronize(device)
        times.append(time.perf_counter() - began)
        short += len(outputs) != batch
    drain(engine, ids)
    step_s = statistics.median(times)
    roofline_s = (weights + statistics.median(kv_read)) / (bandwidth * 1e9)
    return {"batch": batch, "context": context, "steps": steps, "step_ms_p50": round(step_s * 1e3, 3),
            "step_ms_min": round(min(times) * 1e3, 3), "output_tok_s": round(batch / step_s, 1),
            "weight_bytes": weights, "kv_bytes_read": int(statistics.median(kv_read)),
            "roofline_ms": round(roofline_s * 1e3, 3), "roofline_tok_s": round(batch / roofline_s, 1),
            "roofline_ratio": round(roofline_s / step_s, 4), "steps_not_all_rows": short,
            "prefill_s": round(prefill_s, 3)}


def decode_model(ctx, source: ModelSource, attention: str | None, bandwidth: float) -> dict:
    config = ctx.config
    batches = config.decode_batches
    out: dict = {"model": source.name, "shape": None if source.shape is None else source.shape.name,
                 "attention": attention, "rows": []}
    try:
        probe = source.engine(ctx, tokens=16 * 16, max_num_seqs=1, max_num_batched_tokens=16, attention=attention)
    except (ValueError, TypeError) as exc:  # an attention path this build of the engine does not offer
        return {**out, "unavailable": f"{type(exc).__name__}: {exc}"}
    max_len = probe.max_model_len
    device = probe.device
    del probe
    release(device)
    context = min(config.decode_context, max_len - config.decode_steps - 8)
    tokens = max(batches) * (context + config.decode_steps + 8 + 16)
    engine = source.engine(ctx, tokens=tokens, max_num_seqs=max(batches),
                           max_num_batched_tokens=2048 if config.quick else 8192, attention=attention)
    out.update(dtype=str(engine.dtype).removeprefix("torch."), kv_bytes_per_token=engine.kv_spec.bytes_per_token,
               weight_bytes=weight_bytes_read_per_step(engine))
    warm_up(engine)
    for i, batch in enumerate(batches):
        if ctx.remaining_s() <= 0:
            out["cut"] = "budget"
            break
        out["rows"].append(decode_row(engine, batch, context, config.decode_steps, i + 1, bandwidth))
    del engine
    release(device)
    return out


def decode_section(ctx) -> dict:
    device, _ = ctx.device_dtype()
    bandwidth, source_of = bandwidth_gb_s(ctx, device)
    out: dict = {"bandwidth_gb_s": bandwidth, "bandwidth_from": source_of, "attention_values": attention_values(),
                 "models": []}
    for source in (ModelSource.real(ctx.real), ModelSource.random(ctx)):
        for attention in attention_values():
            if ctx.remaining_s() <= 0:
                out.setdefault("cut", "budget")
                break
            try:
                out["models"].append(decode_model(ctx, source, attention, bandwidth))
            except Exception as exc:  # noqa: BLE001 - one model's failure (e.g. out of memory) keeps the others
                out["models"].append({"model": source.name, "attention": attention,
                                      "error": {"class": type(exc).__name__, "message": str(exc)[:1000]}})
                release(device)
    return out
