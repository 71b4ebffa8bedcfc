"""The garbage collector's pauses: a collection holds the interpreter lock, so while it runs every thread of the
process stops, the heartbeat thread too (consumers/worker/heartbeat_thread.py).

`bench intake` with six CPU-bound processes beside the stack saw the worker's heartbeats stop for 7-9 s three
times, about 175 s apart, with its event loop and its heartbeat thread both silent: the pattern of full
collections over a heap that holds the KV pool's half a million block objects (a full collection of the freshly
built worker takes 0.2 s on an idle core; a starved process gets a fraction of one). `freeze_startup_objects`
moves what a role built at its start (model, pool, tokenizer: 354,326 objects) out of the collector's sight; the
same bench then interrupted nothing and the longest gap between heartbeats was 1.65 s. `log_slow_collections`
says in the log when a collection still takes long.
"""
from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

SLOW_COLLECTION_S = 0.5


def freeze_startup_objects() -> int:
    """Collect once, then keep every object alive now out of later collections; returns how many were frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def log_slow_collections(slow_s: float = SLOW_COLLECTION_S) -> Callable[[str, dict], None]:
    """A warning with the generation, the seconds and the objects collected for every collection of `slow_s`
    or more; returns the callback (`gc.callbacks.remove` it to stop)."""
    started: list[float] = []

    def timed(phase: str, info: dict) -> None:
        if phase == "start":
            started[:] = [time.perf_counter()]
        elif started:
            took = time.perf_counter() - started.pop()
            if took >= slow_s:
                log.warning("slow garbage collection generation=%d seconds=%.2f collected=%d",
                            info["generation"], took, info["collected"])

    gc.callbacks.append(timed)
    return timed
