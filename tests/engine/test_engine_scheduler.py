"""Weighted fair queueing, deadlines, preemption victims."""
from __future__ import annotations

import pytest

from engine.block_manager import BlockManager
from engine.config import EngineConfig
from engine.request import EngineRequest, FinishReason, SamplingParams
from engine.scheduler import Scheduler
from engine.prefix_hash import extend_block_hashes
from engine.sequence import Sequence, SequenceStatus
from engine.step_values import SampledToken, ScheduledChunk, SequenceUpdate, StepResult
from engine_factories import finish_of, make_request, make_running, run_engine, tokens_of


def decode_shares(make_engine, weights: dict[str, float], counts: dict[str, int]) -> dict[str, int]:
    """Generated tokens per tenant over the steps where every tenant still had queued work."""
    engine = make_engine(max_num_seqs=8, tenant_weights=weights)
    for tenant, n in counts.items():  # the flooding tenant submits everything first
        for i in range(n):
            engine.add_request(make_request(f"{tenant}{i}", [10 + i % 50] * 8, max_tokens=12, tenant=tenant))
    served = {t: 0 for t in counts}
    while all(engine.scheduler.waiting.get(t) for t in counts):
        for out in engine.step():
            served[out.request_id.rstrip("0123456789")] += len(out.new_token_ids)
    return served


def test_equal_weights_share_half_against_a_flood(make_engine):
    served = decode_shares(make_engine, {"flood": 1.0, "calm": 1.0}, {"flood": 60, "calm": 20})
    share = served["calm"] / (served["calm"] + served["flood"])
    assert served["calm"] >= 80
    assert 0.45 <= share <= 0.55, served


def test_weights_3_to_1_give_3_to_1_shares(make_engine):
    served = decode_shares(make_engine, {"gold": 3.0, "basic": 1.0}, {"gold": 60, "basic": 20})
    ratio = served["gold"] / served["basic"]
    assert served["basic"] >= 40
    assert 2.7 <= ratio <= 3.3, served


def test_deadline_passing_in_queue_expires_without_starting(make_engine):
    now = [0.0]
    engine = make_engine(max_num_seqs=1, clock=lambda: now[0])
    engine.add_request(make_request("long", [5] * 10, max_tokens=6))
    late = EngineRequest("late", (7,) * 10, SamplingParams(max_tokens=4), deadline=1.0)
    ok = EngineRequest("ok", (8,) * 10, SamplingParams(max_tokens=4), deadline=100.0)
    engine.add_request(late)
    engine.add_request(ok)
    outputs = {}
    for out in engine.step():  # t=0: only "long" fits
        outputs.setdefault(out.request_id, []).append(out)
    assert "late" not in outputs
    now[0] = 2.0
    for rid, outs in run_engine(engine).items():
        outputs.setdefault(rid, []).extend(outs)
    assert [(o.finish_reason, o.new_token_ids, o.num_output_tokens) for o in outputs["late"]] == [
        (FinishReason.EXPIRED, (), 0)
    ]
    assert finish_of(outputs["ok"]) is FinishReason.LENGTH and len(tokens_of(outputs["ok"])) == 4
    assert len(tokens_of(outputs["long"])) == 6


def test_preemption_picks_lowest_weight_then_newest():
    bm = BlockManager(num_blocks=5, block_size=4)
    sched = Scheduler(EngineConfig(max_num_seqs=8), bm, max_model_len=64)
    heavy_new = make_running(sched, bm, "heavy_new", 2.0, arrival=3)
    light_old = make_running(sched, bm, "light_old", 1.0, arrival=1)
    light_new = make_running(sched, bm, "light_new", 1.0, arrival=2)
    heavy_old = make_running(sched, bm, "heavy_old", 2.0, arrival=0)
    out = sched.schedule(now=0.0)
    # One free block, four decodes that each need a new one. heavy_old takes
    # it; heavy_new gets light_new's block; light_old is then the least
    # important running sequence itself and yields.
    assert out.preempted == ("light_new", "light_old")
    assert [(c.request_id, c.start, c.num_tokens, c.samples) for c in out.decodes] == [
        ("heavy_old", 4, 1, True), ("heavy_new", 4, 1, True)]
    assert sched.running == [heavy_old, heavy_new]
    assert light_new.status is SequenceStatus.WAITING and light_new.num_computed_tokens == 0
    assert light_new.block_table == [] and light_old.block_table == []
    assert list(sched.waiting["default"]) == [light_old, light_new]
    assert sched.num_preemptions == 2
    bm.check_invariants()


def test_abort_of_waiting_request_cancels_without_tokens(make_engine):
    engine = make_engine(max_num_seqs=1)
    engine.add_request(make_request("running", [5] * 10, max_tokens=5))
    engine.add_request(make_request("queued", [6] * 10, max_tokens=5))
    first = engine.step()
    assert [o.request_id for o in first] == ["running"]
    assert engine.abort("queued")
    outputs = run_engine(engine)
    assert [(o.finish_reason, o.new_token_ids) for o in outputs["queued"]] == [(FinishReason.CANCELLED, ())]
    assert len(first[0].new_token_ids + tuple(tokens_of(outputs["running"]))) == 5
    assert engine.stats().num_waiting == 0 and engine.stats().num_running == 0


def test_queue_time_is_arrival_to_first_scheduling_on_the_engine_clock(make_engine):
    now = [10.0]
    engine = make_engine(max_num_seqs=1, clock=lambda: now[0])
    engine.add_request(make_request("first", [5] * 10, max_tokens=3))
    engine.add_request(make_request("second", [6] * 10, max_tokens=2))
    outputs: dict[str, list] = {}
    while engine.has_unfinished():
        now[0] += 0.5  # every step takes half a second of engine time
        for out in engine.step():
            outputs.setdefault(out.request_id, []).append(out)
    # "first" ran at the first step (t=10.5); "second" waited for its slot until "first" ended at t=11.5.
    assert {o.queue_time_s for o in outputs["first"]} == {0.5}
    assert {o.queue_time_s for o in outputs["second"]} == {2.0}


def test_the_plan_is_a_snapshot_and_only_update_from_output_moves_sequences():
    bm = BlockManager(num_blocks=8, block_size=4)
    sched = Scheduler(EngineConfig(max_num_seqs=8), bm, max_model_len=64)
    seq = make_running(sched, bm, "a", 1.0, arrival=0)
    out = sched.schedule(now=0.0)
    assert out.decodes == (ScheduledChunk("a", 4, 1, True),) and out.prefills == ()
    assert seq.num_computed_tokens == 4  # planned, not yet computed
    stops = []
    updates = sched.update_from_output(out, StepResult((SampledToken("a", 9),)),
                                       lambda s, token: stops.append((s.request_id, token)))
    assert updates == [SequenceUpdate("a", 9, None, None)] and stops == [("a", 9)]
    assert (seq.num_computed_tokens, seq.token_ids[-2:]) == (5, [2, 9])
    assert out.decodes == (ScheduledChunk("a", 4, 1, True),)  # the step's plan stays what was planned
    ended = sched.update_from_output(sched.schedule(now=0.0), StepResult((SampledToken("a", 3),)),
                                     lambda s, token: FinishReason.LENGTH)
    assert ended == [SequenceUpdate("a", 3, None, FinishReason.LENGTH)]
    assert (seq.status, seq.block_table, sched.running, sched.requests) == (SequenceStatus.FINISHED, [], [], {})
    bm.check_invariants()


def test_a_prefix_hit_starts_the_chunk_past_it_and_counts_as_computed_only_after_the_step():
    bm = BlockManager(num_blocks=8, block_size=4)
    sched = Scheduler(EngineConfig(max_num_seqs=8), bm, max_model_len=64, compat_key=b"k")
    first = Sequence.from_request(EngineRequest("first", tuple(range(10, 19))), 0, 1.0)
    extend_block_hashes(first.block_hashes, first.token_ids, 4, b"k", "")
    sched.add(first)
    sched.update_from_output(sched.schedule(now=0.0), StepResult((SampledToken("first", 5),)), lambda s, t: None)
    again = Sequence.from_request(EngineRequest("again", tuple(range(10, 20))), 1, 1.0)
    extend_block_hashes(again.block_hashes, again.token_ids, 4, b"k", "")
    sched.add(again)
    out = sched.schedule(now=0.0)
    assert ScheduledChunk("again", 8, 2, True) in out.prefills  # two cached blocks, two tokens to compute
    assert (again.num_computed_tokens, again.num_cached_tokens, again.block_table[:2]) == (0, 8, first.block_table[:2])


def test_a_finished_sequence_never_runs_again():
    bm = BlockManager(num_blocks=8, block_size=4)
    sched = Scheduler(EngineConfig(max_num_seqs=8), bm, max_model_len=64)
    seq = make_running(sched, bm, "a", 1.0, arrival=0)
    sched.finish(seq, FinishReason.CANCELLED)
    assert (seq.status, seq.finish_reason) == (SequenceStatus.FINISHED, FinishReason.CANCELLED)
    with pytest.raises(RuntimeError, match="'a' cannot go from finished to running"):
        Scheduler._move(seq, SequenceStatus.RUNNING)
