"""The environment section: what the device is, and how fast its memory moves bytes.

Bandwidth is a big tensor copied onto another, timed with a synchronize on each side, counted as bytes read plus
bytes written (2 x the tensor): the traffic a decode step's reads are measured against (bench/device/decode.py).
On a CPU the same copy is a multi-threaded memcpy.
"""
from __future__ import annotations

import os
import platform
import subprocess
import time


def synchronize(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_bandwidth(device, num_bytes: int | None = None, reps: int = 10) -> dict:
    """Copy bandwidth (read + write bytes per second), best of `reps` after one warm copy."""
    import torch

    num_bytes = num_bytes or ((2 << 30) if device.type == "cuda" else (256 << 20))
    src = torch.empty(num_bytes // 4, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    dst.copy_(src)
    synchronize(device)
    best = float("inf")
    for _ in range(reps):
        began = time.perf_counter()
        dst.copy_(src)
        synchronize(device)
        best = min(best, time.perf_counter() - began)
    del src, dst
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {"bytes_copied": num_bytes, "best_s": round(best, 6), "gb_s": round(2 * num_bytes / best / 1e9, 2),
            "counted": "read + write (2 x bytes copied) per second"}


def driver_version() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment_section(ctx) -> dict:
    import torch

    from engine.kv_sizing import mem_available_bytes

    device, dtype = ctx.device_dtype()
    out: dict = {"device": str(device), "dtype": str(dtype).removeprefix("torch."), "torch": torch.__version__,
                 "cuda_runtime": torch.version.cuda, "cuda_available": torch.cuda.is_available(),
                 "cpus": os.cpu_count(), "cpu": cpu_name(), "torch_threads": torch.get_num_threads(),
                 "python": platform.python_version()}
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        props = torch.cuda.get_device_properties(device)
        out.update(device_name=torch.cuda.get_device_name(device), total_bytes=total, free_bytes=free,
                   compute_capability=f"{props.major}.{props.minor}", multiprocessors=props.multi_processor_count,
                   driver=driver_version(), cudnn=torch.backends.cudnn.version())
    else:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        out.update(device_name=out["cpu"], total_bytes=total, free_bytes=mem_available_bytes(), driver=None)
    out["bandwidth"] = measure_bandwidth(device)
    return out
