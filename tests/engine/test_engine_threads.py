"""`LEDGERLM_WORKER_CPU_THREADS`: the threads the worker's engine computes with on a CPU."""
from __future__ import annotations

import torch

from consumers.worker.engine_setup import load_engine
from plumbing.settings import Settings
from producers.model_registry import describe


def test_a_set_thread_count_is_what_the_engine_computes_with_and_unset_leaves_torchs_own(tiny_model_dir):
    before = torch.get_num_threads()
    try:
        load_engine(Settings(worker_device="cpu"), describe(tiny_model_dir, "threads@1"), str(tiny_model_dir))
        assert torch.get_num_threads() == before
        load_engine(Settings(worker_device="cpu", worker_cpu_threads=1), describe(tiny_model_dir, "threads@1"),
                    str(tiny_model_dir))
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
