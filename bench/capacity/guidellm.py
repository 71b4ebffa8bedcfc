"""`bench capacity --client guidellm`: the vLLM project's benchmark client, unmodified, drives the levels.

    per level   guidellm run --backend kind=openai_http,target=<gateway>,model=<version>,api_key=<tenant key>
                             --profile kind=concurrent,streams=N --constraint kind=max_duration,seconds=D
                             --data kind=synthetic_text,prompt_tokens=128,output_tokens=64
                             --tokenizer kind=hf_auto,model=<model dir> --output kind=json,path=<level>.json
    read back   its own report: successful / errored / incomplete requests, output tok/s, TTFT and ITL
                (median, p95) of the successful ones, and the HTTP status of each error
    client_cpu  the CPU guidellm and its worker processes spent (from start-up to exit), in seconds and in
                cores over its wall time: on a 2-core machine the client competes with the platform it measures

guidellm runs as a subprocess with nothing but its command line, as a user would start it; the model name it
sends is the registered version and its tokenizer is read from the model directory (the hub is not reachable).
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import resource
import shutil
import sys
import time
from collections import Counter
from pathlib import Path

from bench.serve.client import Target

PROMPT_TOKENS = 128
OUTPUT_TOKENS = 64


class GuidellmFailed(RuntimeError):
    """guidellm exited without a report: its exit status and the tail of what it printed."""


def executable() -> str:
    beside = Path(sys.executable).with_name("guidellm")
    found = str(beside) if beside.exists() else shutil.which("guidellm")
    if found is None:
        raise GuidellmFailed("guidellm is not installed: `pip install -e .[bench]` brings it")
    return found


def command(target: Target, tenant: str, model_dir: Path, streams: int, duration_s: float, out: Path) -> list[str]:
    backend = f"kind=openai_http,target={target.base_url},model={target.model},api_key={target.keys[tenant]}"
    return [executable(), "run", "--backend", backend,
            "--profile", f"kind=concurrent,streams={streams}",
            "--constraint", f"kind=max_duration,seconds={duration_s:g}",
            "--data", f"kind=synthetic_text,prompt_tokens={PROMPT_TOKENS},output_tokens={OUTPUT_TOKENS}",
            "--tokenizer", f"kind=hf_auto,model={model_dir}",
            "--output", f"kind=json,path={out}", "--disable-console-interactive"]


async def run_level(target: Target, tenant: str, model_dir: Path, streams: int, duration_s: float,
                    workdir: Path) -> dict:
    workdir.mkdir(parents=True, exist_ok=True)
    out = workdir / f"guidellm-{streams}.json"
    out.unlink(missing_ok=True)
    argv = command(target, tenant, model_dir, streams, duration_s, out)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    began, cpu_before = time.monotonic(), children_cpu_s()
    proc = await asyncio.create_subprocess_exec(*argv, env=env, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.STDOUT)
    printed, _ = await proc.communicate()
    client_cpu_s, wall_s = children_cpu_s() - cpu_before, time.monotonic() - began
    if proc.returncode != 0 or not out.exists():
        tail = printed.decode(errors="replace")[-1500:]
        raise GuidellmFailed(f"guidellm exited {proc.returncode} at {streams} streams: {redact(tail, target)}")
    return {"concurrency": streams, "client": "guidellm", **summarize(json.loads(out.read_text())),
            "client_cpu": {"s": round(client_cpu_s, 2), "cores": round(client_cpu_s / wall_s, 3) if wall_s else None,
                           "wall_s": round(wall_s, 2)},
            "report": str(out)}


def children_cpu_s() -> float:
    """CPU seconds of the reaped children of this process: guidellm and every process it started and reaped,
    counted once guidellm has exited (the platform's roles are children too, but live until the sweep ends)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def redact(text: str, target: Target) -> str:
    for key in target.keys.values():
        text = text.replace(key, "<api key>")
    return text


def summarize(report: dict) -> dict:
    """The one benchmark of a one-level run, in the capacity bench's own terms: output_tok_s is the completed
    requests' output tokens over the benchmark's duration (guidellm's own mean rate is kept beside it)."""
    benchmark = report["benchmarks"][-1]
    metrics, requests = benchmark["metrics"], benchmark.get("requests", {})
    totals = metrics["request_totals"]
    errors = Counter(error_class(r) for r in requests.get("errored") or [])
    duration = benchmark.get("duration") or (metrics.get("request_end_time", 0) - metrics.get("request_start_time", 0))
    tokens = stat(metrics["output_token_count"], "total_sum") or 0
    # Every token streamed to the client within the window, the requests cut at its end included (guidellm's
    # "total"): what the engine alone's output_tok_s counts too, without the quantization of whole requests (at
    # 4 streams and 40 s, one request more or less per stream is a quarter of the tokens).
    delivered = ((metrics["output_token_count"] or {}).get("total") or {}).get("total_sum") or tokens
    completed, errored = totals.get("successful", 0), totals.get("errored", 0)
    refused = {code: errors.get(f"HTTP {code}", 0) for code in (429, 503)}
    return {"completed": completed, "errored": errored, "incomplete": totals.get("incomplete", 0),
            "error_kinds": dict(sorted(errors.items())),
            # the builtin client's terms, so that the capacity targets read either kind of level
            "refused_429": refused[429], "refused_503": refused[503], "other": errored - sum(refused.values()),
            "completed_fraction": round(completed / (completed + errored), 4) if completed + errored else None,
            "duration_s": round(duration, 2),
            "output_tok_s": round(tokens / duration, 2) if duration > 0 else None,
            "delivered_output_tok_s": round(delivered / duration, 2) if duration > 0 else None,
            "guidellm_output_tok_s_mean": rounded(stat(metrics["output_tokens_per_second"], "mean")),
            "ttft_ms": percentiles(metrics["time_to_first_token_ms"]),
            "itl_ms": percentiles(metrics["inter_token_latency_ms"]),
            "output_tokens_per_request": {"mean": rounded(stat(metrics["output_token_count"], "mean"))},
            # what its synthetic 128-token text rendered to on the server (chat template and its prefix
            # included): the length the engine alone is given at this level
            "prompt_tokens_per_request": {"mean": rounded(stat(metrics.get("prompt_token_count"), "mean"))}}


def stat(summary: dict, name: str) -> float | None:
    """A successful-requests statistic of a guidellm StatusDistributionSummary."""
    successful = (summary or {}).get("successful") or {}
    if name in ("p50", "p95"):
        return (successful.get("percentiles") or {}).get(name)
    return successful.get(name)


def percentiles(summary: dict) -> dict:
    return {"p50": rounded(stat(summary, "p50")), "p95": rounded(stat(summary, "p95")),
            "mean": rounded(stat(summary, "mean"))}


def rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def error_class(request: dict) -> str:
    """`HTTP 503` where the error names a status, else the error's first words."""
    error = str((request.get("info") or {}).get("error") or request.get("error") or "unknown")
    status = re.search(r"\b([45]\d\d)\b", error)
    return f"HTTP {status.group(1)}" if status else error.split(":")[0][:60]


def sent_prompts(report: dict) -> list[tuple[dict, ...]]:
    """The chat messages guidellm sent in its one benchmark, in the order it sent them (completed, cut and
    refused alike), as the gateway reads them (`ChatMessage.native`: content parts joined into text): what the
    engine alone replays, prompt for prompt, so that it gets the same prefix-cache hits (guidellm's synthetic
    data repeats its prompts from one level to the next: 144 of their 158 tokens were cached at 2 streams and
    beyond)."""
    from producers.gateway.openai.requests import ChatMessage

    requests = report["benchmarks"][-1].get("requests", {})
    sent = [r for kind in ("successful", "incomplete", "errored") for r in requests.get(kind) or []
            if r.get("request_args")]
    sent.sort(key=lambda r: (r.get("info") or {}).get("timings", {}).get("request_start") or 0.0)
    messages = ([ChatMessage.model_validate(m).native() for m in json.loads(r["request_args"])["body"]["messages"]]
                for r in sent)
    return [tuple({"role": m.role, "content": m.content} for m in sent_messages) for sent_messages in messages]
