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


def test_the_engine_thread_warms_up_and_prices_its_steps_before_its_first_order(tiny_model_dir):
    """The first heartbeat must already carry a step's price: the warm-up runs three prompts of the step budget
    (the last two measured), in a scope of its own, and delivers nothing."""
    from consumers.worker.engine_thread import WARM_UP_SCOPE, EngineThread
    from engine.request import EngineRequest, SamplingParams
    from tests.waiting import wait_until_sync

    engine = load_engine(Settings(worker_device="cpu"), describe(tiny_model_dir, "warm@1"), str(tiny_model_dir))
    delivered: list = []
    thread = EngineThread(engine, delivered.extend, lambda rid, why: None, {})
    thread.start()
    try:
        wait_until_sync(lambda: thread.prefill_token_s is not None and not engine.has_unfinished(), 60,
                        "the warm-up's measured steps")
        assert thread.tokens_per_s > 0 and thread.step_s > 0 and delivered == []
        assert engine.num_prefill_tokens_total == 3 * min(engine.config.max_num_batched_tokens,
                                                          engine.max_model_len - 2)
        assert not engine.has_unfinished() and engine.scheduler.prefix_hit_tokens == 0
        thread.add(EngineRequest("r1", (5, 6, 7), SamplingParams(max_tokens=2), tenant_id="t", scope_key="t"), 1.0)
        wait_until_sync(lambda: any(o.finished for o in delivered), 60, "the first order's end")
        assert {o.request_id for o in delivered} == {"r1"} and WARM_UP_SCOPE not in thread.weights
        # the warm-up's prompts are counted as started, but the prefix-hit share covers only real work
        assert engine.stats().started_prompt_tokens == engine.num_prefill_tokens_total
        assert thread.prefix_hit_share == 0.0
    finally:
        thread.stop()
