"""The chaos report's violation listing (nearest fault, client lifetimes) and the `--repeat` summary."""
from __future__ import annotations

import asyncio

import pytest

from bench.chaos import repeat as chaos_repeat
from bench.chaos.checks import final_watermarks, find_seq_faults
from bench.chaos.clients import ClientResult
from bench.chaos.violations import nearest_fault, place
from schemas.lifecycle import Completed, Interrupted, UsageReported
from schemas.values import Usage

FAULTS = [{"fault": "worker_kill9", "began_s": 6.0, "at_s": 6.1},
          {"fault": "broker_kill9", "began_s": 12.0, "at_s": 36.0},
          {"fault": "usage_duplicates_and_late", "began_s": 60.0, "at_s": 61.0, "generation_ids": ["g-late"]}]


def make_client(generation_id: str, started: float, ended: float, **fields) -> ClientResult:
    return ClientResult(request_id=f"r-{generation_id}", generation_id=generation_id, started_at=started,
                        ended_at=ended, **fields)


def test_the_nearest_fault_is_the_one_overlapping_the_generation_else_the_closest_in_time():
    assert nearest_fault(FAULTS, 5.0, 9.0) == {"fault": "worker_kill9", "began_s": 6.0, "at_s": 6.1,
                                               "offset_s": 1.0, "gap_s": 0.0}
    assert nearest_fault(FAULTS, 40.0, 44.0)["fault"] == "broker_kill9"  # 4 s after the broker came back
    assert nearest_fault(FAULTS, 40.0, 44.0)["gap_s"] == 4.0
    assert nearest_fault(FAULTS, 50.0, 58.5) == {"fault": "usage_duplicates_and_late", "began_s": 60.0,
                                             "at_s": 61.0, "offset_s": 10.0, "gap_s": 1.5}
    assert nearest_fault([], 1.0, 2.0) is None


def test_violations_about_a_generation_carry_its_lifetime_and_nearest_fault_others_stay_as_they_are():
    origin = 1000.0
    clients = [make_client("g-1", origin + 10.0, origin + 20.0), make_client("g-late", origin + 50.0, origin + 55.0)]
    placed = place({"overbilled": [{"generation_id": "g-1", "billed_output": 9}, {"generation_id": "g-late"}],
                    "lost_events": [{"probe_partition": 0, "probe_offset": 7}]}, clients, FAULTS, origin)
    first, late = placed["overbilled"]
    assert (first["client_started_s"], first["client_ended_s"], first["usage_injected"]) == (10.0, 20.0, False)
    assert first["nearest_fault"]["fault"] == "broker_kill9" and first["nearest_fault"]["offset_s"] == 2.0
    assert first["billed_output"] == 9
    assert late["usage_injected"] is True
    assert placed["lost_events"] == [{"probe_partition": 0, "probe_offset": 7}]


def test_seq_faults_name_the_client_and_its_missing_or_repeated_seqs():
    clients = [make_client("g-hole", 0, 1, seen_seqs={1, 2, 5}, last_seq=5, final={"seq": 7}),
               make_client("g-twice", 0, 1, seen_seqs={1, 2}, last_seq=2, final={"seq": 3}, duplicated={2},
                           duplicate_seqs=1),
               make_client("g-fine", 0, 1, seen_seqs={1}, last_seq=1, final={"seq": 2})]
    assert [(v["generation_id"], v["count"], v["seqs"]) for v in find_seq_faults(clients, "missing")] == [
        ("g-hole", 3, [3, 4, 6])]
    assert [(v["generation_id"], v["count"], v["seqs"]) for v in find_seq_faults(clients, "duplicate")] == [
        ("g-twice", 1, [2])]


def test_the_final_watermark_is_the_terminal_epochs_as_of_its_first_terminal_event():
    scoped = {"tenant_id": "t", "generation_id": "g"}
    events = [UsageReported(**scoped, epoch=1, report_seq=1, usage=Usage(processed_input_tokens=5,
                                                                         generated_output_tokens=8)),
              UsageReported(**scoped, epoch=1, report_seq=2, usage=Usage(processed_input_tokens=5,
                                                                         generated_output_tokens=16)),
              Interrupted(**scoped, epoch=1, worker_id="w"),
              UsageReported(**scoped, epoch=1, report_seq=3, usage=Usage(processed_input_tokens=5,
                                                                         generated_output_tokens=24)),
              Completed(**scoped, epoch=1, finish_reason="length", usage=Usage())]
    final = final_watermarks(events)["g"]
    assert (final.terminal, final.epoch, final.processed_input_tokens, final.generated_output_tokens) == (
        "Interrupted", 1, 5, 16)


def zero_report(**counts) -> dict:
    return {**dict.fromkeys(chaos_repeat.ZERO_KEYS, 0), "generations": {"admitted": 40}, **counts}


def test_repeat_runs_every_time_sums_the_counts_and_names_the_failed_runs(monkeypatch):
    reports = iter([zero_report(), zero_report(overbilled=2, violations={"overbilled": [{"generation_id": "g-9"}]}),
                    RuntimeError("no broker")])

    async def fake_run(config):
        report = next(reports)
        if isinstance(report, Exception):
            raise report
        return report

    monkeypatch.setattr(chaos_repeat, "run_chaos_bench", fake_run)
    result = asyncio.run(chaos_repeat.run_repeated(None, 3))
    summary = result["summary"]
    assert [r["run"] for r in result["runs"]] == [1, 2, 3]
    assert summary["failed_runs"] == [2, 3] and summary["errors"] == {3: "RuntimeError: no broker"}
    assert summary["totals"]["overbilled"] == 2 and summary["violations"] == {2: {"overbilled": ["g-9"]}}
    assert [chaos_repeat.failed(r) for r in result["runs"]] == [False, True, True]


@pytest.mark.parametrize("text", ["0", "-2"])
def test_repeat_must_be_at_least_one(text):
    import argparse

    from ledgerlm.cli.bench.chaos import positive

    with pytest.raises(argparse.ArgumentTypeError):
        positive(text)


def test_the_stream_on_the_log_counts_each_seq_of_an_epoch_once():
    from bench.chaos.checks import streamed_on_log
    from schemas.stream import TokensEmitted

    def tokens(epoch: int, seq: int, n: int) -> TokensEmitted:
        return TokensEmitted(tenant_id="t", generation_id="g", epoch=epoch, seq=seq, token_ids=(7,) * n, text_delta="x",
                             token_count=n)

    events = [tokens(1, 1, 2), tokens(1, 2, 3), tokens(1, 2, 3), tokens(2, 1, 4)]  # seq 2 written twice
    assert streamed_on_log(events) == {("g", 1): 5, ("g", 2): 4}


def test_an_export_is_a_duplicate_only_when_sent_again_after_its_acknowledgement_was_recorded():
    from bench.chaos.export import Delivery, count_exports

    sealed = {"usage:g-1:1": "g-1", "usage:g-2:1": "g-2", "usage:g-3:0": "g-3", "usage:g-4:2": "g-4"}
    acknowledged_at = {"usage:g-1:1": 10.0, "usage:g-2:1": 20.0, "usage:g-3:0": 11.0}
    deliveries = [Delivery("usage:g-1:1", "g-1", 9.5),
                  Delivery("usage:g-2:1", "g-2", 12.0),  # the batch in flight at the kill ...
                  Delivery("usage:g-2:1", "g-2", 19.9),  # ... sent again before any answer was recorded
                  Delivery("usage:g-3:0", "g-3", 10.9),
                  Delivery("usage:g-3:0", "g-3", 30.0),  # a replay sent an acknowledged seal again
                  Delivery("usage:g-9:1", "g-9", 31.0)]  # no such seal
    found = count_exports(sealed, acknowledged_at, deliveries)
    assert [(v["generation_id"], v["after_ack_s"]) for v in found["duplicates"]] == [("g-3", 19.0)]
    assert [v["generation_id"] for v in found["redelivered"]] == ["g-2"]
    assert [v["record_id"] for v in found["missing"]] == ["usage:g-4:2"]
    assert [v["generation_id"] for v in found["unknown"]] == ["g-9"]
    assert count_exports(sealed, {}, []) == {"missing": [{"generation_id": g, "record_id": r} for r, g in
                                                         sorted(sealed.items())],
                                             "duplicates": [], "unknown": [], "redelivered": []}


def test_the_chaos_meter_receiver_keeps_openmeters_contract_and_holds_a_batch_when_told():
    import threading

    import httpx

    from bench.chaos.export import MeterReceiver

    event = {"specversion": "1.0", "id": "usage:g-1:1", "source": "ledgerlm", "type": "io.ledgerlm.usage.sealed",
             "subject": "t", "data": {"generation_id": "g-1"}}
    batch = {"Content-Type": "application/cloudevents-batch+json"}
    receiver = MeterReceiver().start()
    try:
        with httpx.Client(base_url=receiver.url) as http:
            assert http.post("/api/v1/events", json=[event], headers=batch).status_code == 204
            assert http.post("/api/v1/events", json=[event]).status_code == 400  # not the batch content type
            assert http.post("/api/v1/events", json=[{**event, "subject": ""}], headers=batch).status_code == 400
            receiver.hold_next()
            answered: list[int] = []
            held = threading.Thread(target=lambda: answered.append(http.post(
                "/api/v1/events", json=[{**event, "id": "usage:g-2:1"}], headers=batch).status_code))
            held.start()
            assert receiver.held.wait(10) and receiver.held_ids == ["usage:g-2:1"] and answered == []
            receiver.release.set()
            held.join(10)
            assert answered == [204]
        assert [d.record_id for d in receiver.deliveries] == ["usage:g-1:1", "usage:g-2:1"]
        assert receiver.refused == 2 and not receiver._hold
    finally:
        receiver.stop()
