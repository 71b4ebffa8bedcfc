"""The engine alone: the worker's engine (as `load_engine` builds it from the default Settings) in this process,
closed-loop at one concurrency on the same prompt token ids and output lengths as the HTTP clients.

No Kafka, HTTP or tokenizer on the path: what the platform adds on top of it is the gap to this. Each request is
a `RequestRecord` like an HTTP attempt (status 200; a request the engine can never hold is status None with
error `engine_refused`, and its client stops), token chunks stamped when the step that made them returned.
"""
from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from bench.capacity.client import CUT, Mix
from bench.capacity.metrics import kv_usage
from bench.capacity.prompts import ChatPrompt
from bench.serve.metrics import RequestRecord, distribution


def load_engine_alone(model_dir: Path, device: str = "cpu"):
    """The engine a worker started with default settings would run (on `device`, as the harness sets it)."""
    from consumers.worker.runtime import load_engine
    from plumbing.settings import Settings
    from producers.model_registry import describe

    from engine.request import EngineRequest, SamplingParams

    engine = load_engine(Settings(worker_device=device), describe(model_dir, "engine-alone@1"), str(model_dir))
    # The first step pays first-touch allocations (seconds on CPU): not measured, as the HTTP servers' warm-up.
    engine.add_request(EngineRequest("warm-up", tuple(range(10, 138)), SamplingParams(max_tokens=4, ignore_eos=True)))
    while engine.has_unfinished():
        engine.step()
    return engine


class ClosedLoop:
    """`concurrency` virtual clients on one engine: a finished request is replaced by the next until `stop_at`."""

    def __init__(self, engine, prompts: Sequence[ChatPrompt], mix: Mix, concurrency: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.engine, self.prompts, self.mix, self.clock = engine, prompts, mix, clock
        self.concurrency = concurrency
        self.numbers = itertools.count()
        self.records: list[RequestRecord] = []
        self.active: dict[str, RequestRecord] = {}
        self.queue_times: list[float] = []
        self.kv_samples: list[dict] = []
        self.refusal: str | None = None
        self.preemptions = 0
        self.t0 = clock()

    def now(self) -> float:
        return self.clock() - self.t0

    def submit(self) -> None:
        from engine.errors import RequestError
        from engine.request import EngineRequest, SamplingParams

        index = next(self.numbers)
        prompt = self.prompts[index % len(self.prompts)]
        room = self.engine.max_model_len - len(prompt.token_ids)
        params = SamplingParams(max_tokens=self.mix.max_tokens or room, ignore_eos=self.mix.ignore_eos,
                                temperature=self.mix.temperature)
        record = RequestRecord(index=index, tenant="engine", mix=self.mix.name, api="engine", sent_at=self.now(),
                               status=200, prompt_tokens=len(prompt.token_ids))
        self.records.append(record)
        try:
            self.engine.add_request(EngineRequest(f"alone-{index}", prompt.token_ids, params))
        except RequestError as exc:
            record.status, record.error, record.done_at = None, "engine_refused", self.now()
            self.refusal = str(exc)
            return
        self.active[f"alone-{index}"] = record

    def observe(self, outputs) -> int:
        """Apply one step's outputs; returns how many requests finished (each client then sends its next)."""
        now, finished = self.now(), 0
        for out in outputs:
            record = self.active[out.request_id]
            if out.new_token_ids:
                record.token_chunks.append((now, len(out.new_token_ids)))
            record.output_tokens = out.num_output_tokens
            if out.queue_time_s is not None and len(record.token_chunks) == 1 and out.new_token_ids:
                self.queue_times.append(out.queue_time_s)
            if out.finished:
                record.end_reason, record.done_at = out.finish_reason.value, now
                del self.active[out.request_id]
                finished += 1
        stats = self.engine.stats()
        self.kv_samples.append({"t": now, "used": stats.num_blocks_used,
                                "free": stats.num_blocks_total - stats.num_blocks_used})
        return finished

    def run(self, duration_s: float, drain_s: float) -> None:
        preempted = self.engine.stats().num_preemptions
        self.t0 = self.clock()
        for _ in range(self.concurrency):
            self.submit()
        while self.engine.has_unfinished() and self.now() < duration_s + drain_s:
            finished = self.observe(self.engine.step())
            for _ in range(finished if self.now() < duration_s else 0):
                self.submit()
        for request_id, record in list(self.active.items()):
            self.engine.abort(request_id)
            record.error, record.done_at = CUT, self.now()
        while self.engine.has_unfinished():
            self.engine.step()
        self.preemptions = self.engine.stats().num_preemptions - preempted


def engine_level(engine, prompts: Sequence[ChatPrompt], mix: Mix, concurrency: int, duration_s: float,
                 drain_s: float) -> tuple[list[RequestRecord], dict]:
    """One level: its records, and the engine's KV use, preemptions and queue time over the window."""
    loop = ClosedLoop(engine, prompts, mix, concurrency)
    loop.run(duration_s, drain_s)
    window = [s for s in loop.kv_samples if s["t"] <= duration_s]
    queue = distribution(loop.queue_times)
    observed = {**kv_usage(window), "preemptions": loop.preemptions,
                "queue_time": {"n": queue["n"], "p50_ms": queue["p50"], "p95_ms": queue["p95"],
                               "source": "the engine's RequestOutput.queue_time_s"}}
    if loop.refusal:
        observed["engine_refused"] = loop.refusal
    return loop.records, observed
