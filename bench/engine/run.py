"""`ledgerlm bench engine`: this engine vs transformers `generate` and its continuous batching.

One run, same seeded requests for every contender, greedy, EOS ignored so
each request produces exactly its `max_tokens`. All requests arrive at t=0.
Output: one JSON document (see `run_bench`).
"""
from __future__ import annotations

import gc
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from bench.engine.workload import BenchRequest, Timeline, make_workload, summarize

DEFAULT_MODEL_DIR = Path(".ledgerlm/models/small")


def log(msg: str) -> None:
    print(f"[bench engine] {msg}", file=sys.stderr, flush=True)


# -- contender (a): this engine ------------------------------------------------------
def run_engine(model_dir: Path, workload: list[BenchRequest], max_num_batched_tokens: int) -> dict:
    from engine.config import EngineConfig
    from engine.engine import Engine
    from engine.request import EngineRequest, SamplingParams

    config = EngineConfig(kv_cache_bytes=2 << 30, max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=64,
                          device="cpu", dtype="float32")
    engine = Engine(model_dir, config)
    # Warm-up outside the timed region (first-touch allocations), on a throwaway prompt.
    engine.add_request(EngineRequest("warmup", tuple(range(10, 74)), SamplingParams(max_tokens=4, ignore_eos=True)))
    while engine.has_unfinished():
        engine.step()

    times: dict[str, list[float]] = {r.request_id: [] for r in workload}
    decode_steps: list[tuple[int, float]] = []
    peak_blocks = 0
    t0 = time.perf_counter()
    for r in workload:
        engine.add_request(EngineRequest(r.request_id, r.prompt, SamplingParams(max_tokens=r.max_tokens, ignore_eos=True)))
    while engine.has_unfinished():
        s0 = time.perf_counter()
        outputs = engine.step()
        now = time.perf_counter()
        for o in outputs:
            times[o.request_id].extend([now - t0] * len(o.new_token_ids))
        stats = engine.stats()
        peak_blocks = max(peak_blocks, stats.num_blocks_used)
        if stats.num_waiting == 0 and outputs and all(o.num_output_tokens > 1 for o in outputs):
            decode_steps.append((len(outputs), now - s0))
    wall = time.perf_counter() - t0
    result = summarize(workload, Timeline(times), wall)
    stats = engine.stats()
    result.update(
        peak_blocks_used=peak_blocks,
        num_blocks_total=stats.num_blocks_total,
        prefix_hit_tokens=stats.prefix_hit_tokens,
        preemptions=stats.num_preemptions,
        max_num_batched_tokens=max_num_batched_tokens,
    )
    result["decode_step"] = decode_step_report(engine, decode_steps)
    return result


def decode_step_report(engine, decode_steps: list[tuple[int, float]]) -> dict:
    """Median pure-decode step time at the most common batch size vs the time of the
    step's matmuls alone (all projections + LM head) at that batch: the floor any
    implementation pays on this CPU, so the gap is attention + Python overhead."""
    if not decode_steps:
        return {}
    sizes = [b for b, _ in decode_steps]
    batch = max(set(sizes), key=sizes.count)
    step_s = statistics.median(t for b, t in decode_steps if b == batch)
    from bench.engine.decode import matmul_lower_bound_s

    best = matmul_lower_bound_s(engine, batch)
    return {"batch": batch, "num_steps": sizes.count(batch), "step_ms_p50": round(step_s * 1e3, 3),
            "matmul_lower_bound_ms": round(best * 1e3, 3), "ratio_to_bound": round(step_s / best, 2)}


# -- contender (b): transformers generate, static padded batches -----------------------
class _StepClock:
    """A generate() streamer that only records when each decoding step finished."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._seen_prompt = False

    def put(self, value) -> None:
        if not self._seen_prompt:  # generate() first streams the prompt itself
            self._seen_prompt = True
            return
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def load_hf(model_dir: Path, attn: str = "sdpa"):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation=attn).eval()
    # EOS off: every contender produces exactly max_tokens per request.
    model.generation_config.eos_token_id = None
    return model


def run_hf_generate(model_dir: Path, workload: list[BenchRequest], batch_size: int) -> dict:
    model = load_hf(model_dir)
    pad = model.config.pad_token_id or 0
    with torch.inference_mode():
        model.generate(torch.tensor([[10] * 16]), max_new_tokens=4, do_sample=False, pad_token_id=pad)  # warm-up
    times: dict[str, list[float]] = {}
    t0 = time.perf_counter()
    for start in range(0, len(workload), batch_size):
        group = workload[start : start + batch_size]
        width = max(len(r.prompt) for r in group)
        ids = torch.full((len(group), width), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, r in enumerate(group):  # left padding
            ids[row, width - len(r.prompt) :] = torch.tensor(r.prompt)
            mask[row, width - len(r.prompt) :] = 1
        new = max(r.max_tokens for r in group)
        clock = _StepClock()
        with torch.inference_mode():
            model.generate(ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                           pad_token_id=pad, streamer=clock)
        for r in group:
            times[r.request_id] = [t - t0 for t in clock.times[: r.max_tokens]]
    wall = time.perf_counter() - t0
    result = summarize(workload, Timeline(times), wall)
    result["batch_size"] = batch_size
    del model
    gc.collect()
    return result


# -- contender (c): transformers continuous batching -------------------------------------
def run_hf_continuous(model_dir: Path, workload: list[BenchRequest], max_batch_tokens: int) -> dict:
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig
    from transformers.generation.continuous_batching.utils import WorkloadHints

    model = load_hf(model_dir)
    gen = GenerationConfig(do_sample=False, max_new_tokens=max(r.max_tokens for r in workload), eos_token_id=-1)
    total = sum(len(r.prompt) + r.max_tokens for r in workload)
    page = 256
    cb = ContinuousBatchingConfig(page_size=page, num_blocks=total // page + 2 * len(workload),
                                  max_batch_tokens=max_batch_tokens, max_requests_per_batch=64,
                                  allow_block_sharing=False, use_cuda_graph=False)
    hints = WorkloadHints(max_prompt_length=max(len(r.prompt) for r in workload),
                          max_generated_length=gen.max_new_tokens, num_requests=len(workload))
    ids = {}
    results = {}
    with torch.inference_mode(), model.continuous_batching_context_manager(
            generation_config=gen, continuous_batching_config=cb, block=True, timeout=30, warmup=True,
            workload_hints=hints) as manager:
        t0_wall = time.perf_counter()
        for r in workload:
            ids[manager.add_request(list(r.prompt), request_id=r.request_id, max_new_tokens=r.max_tokens,
                                    record_timestamps=True)] = r
        while len(results) < len(workload):
            res = manager.get_result(timeout=1)
            if res is not None and res.is_finished():
                results[res.request_id] = res
            elif res is None and not manager.is_running():
                raise RuntimeError("transformers continuous batching thread stopped")
        wall = time.perf_counter() - t0_wall
    times = {}
    for r in workload:
        res = results[r.request_id]
        if res.error:
            raise RuntimeError(f"transformers continuous batching failed {r.request_id}: {res.error}")
        # Timestamps are perf_counter values; the shared start is when the first request was added.
        times[r.request_id] = [t - t0_wall for t in (res.timestamps or [])][: r.max_tokens]
    result = summarize(workload, Timeline(times), wall)
    result.update(attn_implementation=model.config._attn_implementation, page_size=page,
                  max_batch_tokens=max_batch_tokens)
    del model
    gc.collect()
    return result


# -- driver ---------------------------------------------------------------------------------
def ensure_model(model_dir: Path) -> Path:
    if (model_dir / "manifest.json").is_file():
        return model_dir
    from engine.artifacts.demo_model import build_demo_model

    log(f"building the small demo model into {model_dir} (once)")
    return build_demo_model(model_dir, size="small", progress=sys.stderr.isatty(), log=log)


def run_bench(model_dir: Path = DEFAULT_MODEL_DIR, quick: bool = False, contenders: tuple[str, ...] = (
        "engine", "hf_generate", "hf_continuous"), seed: int = 0, max_num_batched_tokens: int = 2048,
        targets: dict | None = None) -> dict:
    """Run every contender on the same workload and return the JSON-able report."""
    from transformers import AutoConfig

    model_dir = ensure_model(Path(model_dir))
    vocab = AutoConfig.from_pretrained(model_dir).vocab_size
    num = 16 if quick else 64
    workload = make_workload(num, seed, vocab,
                             prompt_range=(16, 512) if quick else (16, 1024),
                             output_range=(16, 64) if quick else (16, 256))
    report: dict = {
        "benchmark": "engine",
        "quick": quick,
        "model_dir": str(model_dir),
        "seed": seed,
        "num_requests": num,
        "prompt_tokens_range": [min(len(r.prompt) for r in workload), max(len(r.prompt) for r in workload)],
        "output_tokens_range": [min(r.max_tokens for r in workload), max(r.max_tokens for r in workload)],
        "greedy": True,
        "dtype": "float32",
        "device": "cpu",
        "torch_threads": torch.get_num_threads(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default"),
        "machine": platform.machine(),
        # Other processes on a 2-core machine distort every number: record it.
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "contenders": {},
    }
    runners = {
        "engine": lambda: run_engine(model_dir, workload, max_num_batched_tokens),
        "hf_generate": lambda: run_hf_generate(model_dir, workload, batch_size=16),
        "hf_continuous": lambda: run_hf_continuous(model_dir, workload, max_batch_tokens=max_num_batched_tokens),
    }
    for name in contenders:
        log(f"running {name} on {num} requests")
        try:
            report["contenders"][name] = runners[name]()
        except Exception as exc:  # a contender that cannot run is reported, not fatal
            report["contenders"][name] = {"error": f"{type(exc).__name__}: {exc}"}
        log(f"{name}: {json.dumps(report['contenders'][name])}")
    ours = report["contenders"].get("engine", {}).get("output_tok_s")
    for key, name in (("ratio_vs_hf_generate", "hf_generate"), ("ratio_vs_hf_continuous", "hf_continuous")):
        theirs = report["contenders"].get(name, {}).get("output_tok_s")
        report[key] = round(ours / theirs, 2) if ours and theirs else None
    if "engine" in contenders:
        from bench.engine.decode import decode_sweep

        log("decode step vs its matmul-only bound at batch 1, 8, 32")
        report["decode_sweep"] = decode_sweep(model_dir, steps=6 if quick else 12)
        at8 = [r["ratio_to_bound"] for r in report["decode_sweep"] if r["batch"] == 8]
        report["decode_step_ratio_to_bound_batch8"] = at8[0] if at8 else None
    report["targets"] = targets or {"ratio_vs_hf_generate": 3.0, "ratio_vs_hf_continuous": 1.5}
    report["targets_met"] = {k: report.get(k) is not None and (
        report[k] <= v if k.startswith("decode_step") else report[k] >= v) for k, v in report["targets"].items()}
    report["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    return report
