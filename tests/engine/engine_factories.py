"""Factories and checks shared by the engine tests."""
from __future__ import annotations

import random
from typing import Iterable

from engine.engine import Engine
from engine.request import EngineRequest, FinishReason, RequestOutput, SamplingParams

BLOCK = 16


def kv_bytes_per_token_f32(artifacts) -> int:
    """The bytes-per-token formula of docs/design-rules.md, written out independently of engine.kv_cache."""
    d = artifacts.dims
    return 2 * d.num_layers * d.num_kv_heads * d.head_dim * 4


def make_request(
    request_id: str, prompt: Iterable[int], max_tokens: int = 8, tenant: str = "t1", scope: str = "s1", **params
) -> EngineRequest:
    return EngineRequest(
        request_id=request_id,
        prompt_token_ids=tuple(prompt),
        params=SamplingParams(max_tokens=max_tokens, **params),
        tenant_id=tenant,
        scope_key=scope,
    )


def random_prompt(rng: random.Random, length: int) -> list[int]:
    # Ids >= 6 avoid the special tokens (pad, bos, eos, role markers).
    return [rng.randrange(6, 512) for _ in range(length)]


def check_blocks(engine: Engine) -> None:
    s = engine.stats()
    assert s.num_blocks_free + s.num_blocks_used + s.num_blocks_cached_free == s.num_blocks_total
    engine.blocks.check_invariants()
    if not engine.has_unfinished():
        assert s.num_blocks_used == 0
        assert all(r == 0 for r in engine.blocks.ref_counts)


def run_engine(engine: Engine, on_step=None, max_steps: int = 10_000) -> dict[str, list[RequestOutput]]:
    """Step until idle, checking block accounting after every step; outputs grouped by request."""
    outputs: dict[str, list[RequestOutput]] = {}
    for step in range(max_steps):
        if not engine.has_unfinished():
            break
        for out in engine.step():
            outputs.setdefault(out.request_id, []).append(out)
        check_blocks(engine)
        if on_step is not None:
            on_step(step, engine)
    else:
        raise AssertionError("engine did not finish")
    check_blocks(engine)
    return outputs


def tokens_of(outputs: list[RequestOutput]) -> list[int]:
    return [t for o in outputs for t in o.new_token_ids]


def finish_of(outputs: list[RequestOutput]) -> FinishReason | None:
    return outputs[-1].finish_reason


def record_schedules(engine: Engine) -> list:
    """Wrap the engine's scheduler so every `SchedulerOutput` is kept for assertions."""
    seen = []
    schedule = engine.scheduler.schedule

    def spy(now):
        out = schedule(now)
        seen.append(out)
        return out

    engine.scheduler.schedule = spy
    return seen


def make_running(scheduler, bm, rid: str, weight: float, arrival: int, batch: bool = False):
    """A running sequence of 4 computed prompt tokens plus one sampled token: a decode is due, needing a
    second block (block size 4)."""
    from engine.sequence import Sequence, SequenceStatus

    seq = Sequence.from_request(EngineRequest(rid, (1,) * 4, batch=batch), arrival, weight)
    assert bm.allocate(seq, 4) is not None
    seq.num_computed_tokens = 4
    seq.token_ids.append(2)
    seq.status = SequenceStatus.RUNNING
    seq.started = True
    scheduler.running.append(seq)
    scheduler.requests[rid] = seq
    return seq
