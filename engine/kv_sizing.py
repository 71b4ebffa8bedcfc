"""How many bytes the KV pool gets when it is sized from the machine (`kv_cache_bytes="auto"`).

    GPU:  fraction x total memory - memory in use (the weights) - activation peak (estimated)
          (vLLM's gpu_memory_utilization idea)
    CPU:  min(cpu_share x MemAvailable, cpu_cap_bytes)          (the rest of RAM stays with the OS,
                                                                 the broker, PostgreSQL and the roles)

A pool that cannot hold one request of `max_model_len` tokens is refused: a
worker that could never run a request the gateway admits is worse than one
that does not start.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from engine.errors import EngineError


@dataclass(frozen=True)
class MemoryPolicy:
    """The shares `auto` may take (see the module docstring)."""

    gpu_fraction: float = 0.9
    cpu_share: float = 0.25
    cpu_cap_bytes: int = 4 << 30


@dataclass(frozen=True)
class KVPoolSize:
    """The chosen pool and why: `how` is a short, loggable explanation."""

    num_bytes: int
    how: str


def mem_available_bytes(meminfo: Path = Path("/proc/meminfo")) -> int:
    """The kernel's estimate of memory available to new work (MemAvailable)."""
    for line in meminfo.read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise EngineError(f"{meminfo} has no MemAvailable line")


def cpu_pool_bytes(mem_available: int, policy: MemoryPolicy) -> KVPoolSize:
    share = int(mem_available * policy.cpu_share)
    if share <= policy.cpu_cap_bytes:
        return KVPoolSize(share, f"{policy.cpu_share:.0%} of MemAvailable {mem_available / 2**30:.1f} GiB")
    return KVPoolSize(policy.cpu_cap_bytes, f"cap {policy.cpu_cap_bytes / 2**30:.1f} GiB "
                                            f"(MemAvailable {mem_available / 2**30:.1f} GiB)")


def gpu_pool_bytes(total: int, in_use: int, activation_peak: int, policy: MemoryPolicy) -> KVPoolSize:
    budget = int(total * policy.gpu_fraction) - in_use - activation_peak
    return KVPoolSize(max(budget, 0), f"{policy.gpu_fraction:.0%} of {total / 2**30:.1f} GiB minus "
                                      f"{in_use / 2**30:.2f} GiB in use (weights) and "
                                      f"{activation_peak / 2**30:.2f} GiB of activations")


def check_holds_one_request(num_blocks: int, block_size: int, max_model_len: int, how: str) -> None:
    if num_blocks * block_size < max_model_len:
        raise EngineError(f"the KV pool ({how}) holds {num_blocks} blocks = {num_blocks * block_size} tokens, "
                          f"less than one request of max_model_len {max_model_len}: give it more memory "
                          f"(LEDGERLM_WORKER_KV_CACHE_BYTES) or lower LEDGERLM_WORKER_MAX_MODEL_LEN")
