"""`ledgerlm bench device`: one prepared run for the day an accelerator is lent.

    environment  device, memory, versions, dtype, measured copy bandwidth
    parity       engine vs transformers `generate`, greedy, golden prompts, float32 (and bfloat16 on CUDA)
    decode       tok/s and step time by batch, real model and a random Llama-3-8B shape, against the roofline
    prefill      tok/s by prompt length; a long prompt chunked beside running decodes (its TTFT, their ITL)
    kv           what `auto` sized the pool to, and a closed loop that fills it (peak memory, preemptions)
    platform     the whole stack with the worker on the device vs the engine alone (needs Kafka + PostgreSQL)

The JSON is written after every section, so a run cut short keeps what it measured. A section that raises is
recorded (`error`) and the run goes on; once `budget_s` is spent the sections left are `"skipped": "budget"`.
"""
from __future__ import annotations

import json
import logging
import os
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from bench.device.models import RealModel

SECTION_NAMES = ("environment", "parity", "decode", "prefill", "kv", "platform")
TARGETS = {"parity_float32": "exact", "parity_bfloat16": "exact on the golden prompts",
           "decode_batch1_roofline_ratio_8b_min": 0.6, "decode_batch128_tok_s_8b_min": 3000.0,
           "platform_tok_s_ratio_min": 0.9}


@dataclass(frozen=True)
class DeviceConfig:
    quick: bool = False
    sections: tuple[str, ...] = SECTION_NAMES
    budget_s: float | None = None  # None: 170 quick, 480 full
    device: str = "auto"
    decode_batches: tuple[int, ...] = (1, 32, 128, 256)
    decode_context: int = 512
    decode_steps: int = 16
    prefill_lengths: tuple[int, ...] = (1024, 4096)
    interleaved_decodes: int = 64
    platform_chats: int = 64
    platform_duration_s: float = 30.0

    @property
    def budget(self) -> float:
        return self.budget_s if self.budget_s is not None else (170.0 if self.quick else 480.0)


QUICK = DeviceConfig(quick=True, device="cpu", decode_batches=(1, 8), decode_context=64, decode_steps=8,
                     prefill_lengths=(128, 512), interleaved_decodes=8, platform_chats=4, platform_duration_s=10.0)


@dataclass
class Context:
    """What every section gets: the config, the models, where to work, and the clock of the budget."""

    config: DeviceConfig
    real: RealModel
    golden_file: Path | None
    workdir: Path
    began: float = field(default_factory=time.monotonic)
    environment: dict = field(default_factory=dict)  # the environment section's answer, for the rooflines

    def remaining_s(self) -> float:
        return self.config.budget - (time.monotonic() - self.began)

    def device_dtype(self):
        from engine.config import EngineConfig
        from engine.engine import resolve_device

        return resolve_device(EngineConfig(device=self.config.device))


def log(msg: str) -> None:
    print(f"[bench device] {msg}", flush=True)


def _sections() -> dict[str, Callable[[Context], dict]]:
    from bench.device.decode import decode_section
    from bench.device.environment import environment_section
    from bench.device.kv import kv_section
    from bench.device.parity import parity_section
    from bench.device.platform import platform_section
    from bench.device.prefill import prefill_section

    return {"environment": environment_section, "parity": parity_section, "decode": decode_section,
            "prefill": prefill_section, "kv": kv_section, "platform": platform_section}


# Tests replace an entry to make a section fail; None: the real sections.
SECTIONS: dict[str, Callable[[Context], dict]] | None = None


def run_section(name: str, fn: Callable[[Context], dict], ctx: Context) -> dict:
    if ctx.remaining_s() <= 0:
        return {"skipped": "budget"}
    began = time.monotonic()
    try:
        result = fn(ctx)
    except Exception as exc:  # noqa: BLE001 - one section's failure must not cost the others
        result = {"error": {"class": type(exc).__name__, "message": str(exc)[:2000],
                            "traceback": traceback.format_exc().splitlines()[-12:]}}
    result["wall_s"] = round(time.monotonic() - began, 2)
    return result


def check_targets(report: dict) -> dict[str, bool | None]:
    sections = report["sections"]
    parity = sections.get("parity", {}).get("dtypes", {})
    met: dict[str, bool | None] = {f"parity_{d}": parity[d].get("all_match") if d in parity else None
                                   for d in ("float32", "bfloat16")}
    eight = next((m for m in sections.get("decode", {}).get("models", [])
                  if m.get("shape") == "llama3-8b-shape" and m.get("attention") in (None, "auto")), None)
    rows = {row["batch"]: row for row in (eight or {}).get("rows", [])}
    ratio, tok_s = rows.get(1, {}).get("roofline_ratio"), rows.get(128, {}).get("output_tok_s")
    met["decode_batch1_roofline_ratio_8b"] = None if ratio is None else \
        ratio >= TARGETS["decode_batch1_roofline_ratio_8b_min"]
    met["decode_batch128_tok_s_8b"] = None if tok_s is None else tok_s >= TARGETS["decode_batch128_tok_s_8b_min"]
    platform_ratio = sections.get("platform", {}).get("tok_s_ratio")
    met["platform_tok_s_ratio"] = None if platform_ratio is None else \
        platform_ratio >= TARGETS["platform_tok_s_ratio_min"]
    return met


def write_report(path: Path, report: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text(json.dumps(report, indent=2, default=str) + "\n")
    tmp.replace(path)  # a reader (or a killed run) never sees half a document


def run_device_bench(config: DeviceConfig, json_path: Path, home: Path, model_dir: Path | None = None,
                     golden_file: Path | None = None) -> dict:
    """Run the chosen sections in order, writing the report to `json_path` after each."""
    from bench.device.models import resolve_real_model

    logging.getLogger("engine").setLevel(logging.WARNING)
    began = time.monotonic()
    report: dict = {"bench": "device", "quick": config.quick, "config": asdict(config), "budget_s": config.budget,
                    "targets": TARGETS, "sections": {}, "load_average_at_start": list(os.getloadavg()),
                    "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY")}
    real = resolve_real_model(home, config.quick, model_dir)
    report["real_model"] = {"dir": str(real.model_dir), "name": real.name, "note": real.note}
    ctx = Context(config, real, golden_file, home / "bench" / "device", began=began)
    sections = SECTIONS if SECTIONS is not None else _sections()
    for name in SECTION_NAMES:
        if name not in config.sections:
            continue
        log(f"{name} ({ctx.remaining_s():.0f} s of budget left)")
        report["sections"][name] = result = run_section(name, sections[name], ctx)
        if name == "environment" and "error" not in result and "skipped" not in result:
            ctx.environment = result
        report["targets_met"] = check_targets(report)
        report["wall_s"] = round(time.monotonic() - began, 2)
        write_report(json_path, report)
    report["load_average_at_end"] = list(os.getloadavg())
    report["targets_met"] = check_targets(report)
    report["wall_s"] = round(time.monotonic() - began, 2)
    write_report(json_path, report)
    return report
