"""The platform section: the whole stack with its worker on the device, against that worker's engine alone.

The efficiency bench's parts, not new ones: `ledgerlm_platform` starts controller, worker, gateway and projector
with default settings on the running broker and database (`make services`), setting only the worker's device
and metrics port; `closed_loop` is the streamed-chat client (mix a: 128-token prompts, 64 output tokens,
ignore_eos); the engine alone (`load_engine_alone`, the worker's own settings on the same device) runs the same
prompt token ids at the same concurrency in this process. One tenant with budgets no level reaches, so the
comparison is of serving, not of admission limits.
"""
from __future__ import annotations

import asyncio
import time

MIX = "a"


async def platform_level(model_dir, device: str, prompts, concurrency: int, duration_s: float, drain_s: float,
                         workdir) -> dict:
    from bench.capacity.client import MIXES, closed_loop
    from bench.capacity.metrics import client_summary
    from bench.capacity.run import warm
    from bench.common import free_port
    from bench.serve.targets import TenantSpec, ledgerlm_platform

    settings = {"LEDGERLM_WORKER_DEVICE": device, "LEDGERLM_WORKER_METRICS_PORT": str(free_port())}
    async with ledgerlm_platform(model_dir, [TenantSpec("chat", 1.0)], workdir, settings=settings,
                                 bench="device") as platform:
        await warm(platform.target, prompts(MIX, 0))
        began = time.monotonic()
        _, records = await closed_loop(platform.target, prompts(MIX, concurrency), MIXES[MIX], concurrency,
                                       duration_s, drain_s)
        return {"wall_s": round(time.monotonic() - began, 2), **client_summary(records, duration_s)}


def engine_level(model_dir, device: str, prompts, concurrency: int, duration_s: float, drain_s: float) -> dict:
    from bench.capacity.client import MIXES
    from bench.capacity.engine import engine_level as closed_loop_on_engine, load_engine_alone
    from bench.capacity.metrics import client_summary

    engine = load_engine_alone(model_dir, device)
    records, observed = closed_loop_on_engine(engine, prompts(MIX, concurrency), MIXES[MIX], concurrency,
                                              duration_s, drain_s)
    summary = {"kv_pool_blocks": engine.kv_spec.num_blocks, "max_num_seqs": engine.config.max_num_seqs,
               **client_summary(records, duration_s), **observed}
    del engine
    return summary


def platform_section(ctx) -> dict:
    from bench.capacity.run import CapacityConfig, Prompts
    from bench.device.engines import release

    config = ctx.config
    device, _ = ctx.device_dtype()
    concurrency, duration_s, drain_s = config.platform_chats, config.platform_duration_s, 60.0
    capacity = CapacityConfig(levels=(concurrency,), duration_s=duration_s, drain_s=drain_s, mixes=(MIX,),
                              servers=("ledgerlm", "engine"), prompts_per_level=max(64, 4 * concurrency))
    prompts = Prompts(ctx.real.model_dir, capacity)
    ours = asyncio.run(platform_level(ctx.real.model_dir, str(device), prompts, concurrency, duration_s, drain_s,
                                      ctx.workdir / "platform"))
    alone = engine_level(ctx.real.model_dir, str(device), prompts, concurrency, duration_s, drain_s)
    release(device)
    ratio = None
    if ours.get("output_tok_s") and alone.get("output_tok_s"):
        ratio = round(ours["output_tok_s"] / alone["output_tok_s"], 3)
    return {"model": ctx.real.name, "device": str(device), "concurrency": concurrency, "mix": MIX,
            "duration_s": duration_s, "platform": ours, "engine_alone": alone, "tok_s_ratio": ratio}
