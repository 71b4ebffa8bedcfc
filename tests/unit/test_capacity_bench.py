"""The capacity bench's pure parts: Retry-After, chat chunks, the closed loop's retries, level and target maths."""
from __future__ import annotations

import json
import math
from pathlib import Path
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from bench.capacity.client import (CUT, MIXES, ChatAttempt, chat_body, closed_loop, finish_record,
                                   retry_after_s)
from bench.capacity.engine import ClosedLoop
from bench.capacity.metrics import (client_summary, histogram_quantiles, kv_usage, ratios, saturation,
                                    working_set)
from bench.capacity.prompts import ChatPrompt
from bench.capacity.run import QUICK, configure, engine_concurrencies, mark_working_sets
from bench.capacity.targets import check_targets
from bench.capacity.worker import heartbeat_summary, parse_worker_metrics, promise_summary, scrape_summary
from bench.serve.client import on_openai_chunk
from bench.serve.client import Target

PROMPT = ChatPrompt(({"role": "user", "content": "Question: why? Answer in one short sentence."},), tuple(range(128)))


def make_attempt(index: int, sent: float, status: int | None = 200, tokens: int = 4, ttft: float = 0.5,
                 gap: float = 0.1, error: str | None = None, code: str | None = None) -> ChatAttempt:
    record = ChatAttempt(index=index, tenant="ledgerlm", mix="a", api="chat", sent_at=sent, status=status,
                         error=error, code=code)
    if status == 200 and error is None:
        record.token_chunks = [(sent + ttft + gap * i, 1) for i in range(tokens)]
        record.output_tokens, record.prompt_tokens, record.end_reason = tokens, 128, "length"
    record.done_at = sent + ttft + gap * tokens
    return record


def test_retry_after_reads_seconds_and_dates_and_defaults_to_one_second():
    now = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
    assert retry_after_s("2", now) == 2.0 and retry_after_s("0.5", now) == 0.5 and retry_after_s("0", now) == 0.0
    assert retry_after_s(None, now) == 1.0 and retry_after_s("", now) == 1.0
    assert retry_after_s("soon", now) == 1.0 and retry_after_s("-3", now) == 1.0
    later = (now + timedelta(seconds=5)).strftime("%a, %d %b %Y %H:%M:%S GMT")
    assert retry_after_s(later, now) == 5.0
    assert retry_after_s((now - timedelta(seconds=5)).strftime("%a, %d %b %Y %H:%M:%S GMT"), now) == 0.0


def test_chat_chunks_count_content_only_and_usage_fixes_the_token_count():
    record = ChatAttempt(0, "ledgerlm", "a", "chat", sent_at=0.1, status=200)
    chunk = lambda delta, **more: json.dumps({"choices": [{"index": 0, "delta": delta, **more}]})  # noqa: E731
    on_openai_chunk(record, chunk({"role": "assistant", "content": ""}), 0.2)  # the role chunk is no token
    on_openai_chunk(record, chunk({"content": "The cap"}), 0.4)  # ledgerlm coalesces: several tokens per chunk
    on_openai_chunk(record, chunk({"content": "ital."}), 0.6)
    on_openai_chunk(record, chunk({}, finish_reason="stop"), 0.7)
    on_openai_chunk(record, json.dumps({"choices": [], "usage": {"prompt_tokens": 128, "completion_tokens": 5}}), 0.7)
    on_openai_chunk(record, "[DONE]", 0.8)
    finish_record(record)
    assert record.token_chunks == [(0.4, 3), (0.6, 2)] and record.output_tokens == 5
    assert record.end_reason == "stop" and record.prompt_tokens == 128 and record.completed
    assert record.ttft == pytest.approx(0.3) and record.itl == pytest.approx(0.05)
    bare = ChatAttempt(1, "transformers_serve", "b", "chat", sent_at=0.0, status=200)
    for at in (0.1, 0.2):
        on_openai_chunk(bare, chunk({"content": "x"}), at)
    finish_record(bare)  # no usage chunk: one token per content chunk
    assert bare.output_tokens == 2 and bare.token_chunks == [(0.1, 1), (0.2, 1)]


def test_chat_body_shapes_per_server_and_mix():
    ours, theirs = Target("ledgerlm", "http://x", "m@1", native=True), Target("t", "http://y", "/m", native=False)
    a, b = chat_body(ours, PROMPT, MIXES["a"]), chat_body(ours, PROMPT, MIXES["b"])
    assert a["max_tokens"] == 64 and a["ignore_eos"] is True and a["stream"] is True
    assert a["stream_options"] == {"include_usage": True} and a["messages"] == list(PROMPT.messages)
    assert "max_tokens" not in b and "ignore_eos" not in b
    ta = chat_body(theirs, PROMPT, MIXES["a"])
    assert "stream_options" not in ta and "ignore_eos" not in ta and ta["max_tokens"] == 64
    assert json.loads(ta["generation_config"]) == {"max_new_tokens": 64, "eos_token_id": -1, "do_sample": False}
    assert "generation_config" not in chat_body(theirs, PROMPT, MIXES["b"])


async def test_closed_loop_retries_a_refusal_after_retry_after_and_counts_it():
    seen: dict[str, int] = {}

    def answer(request: httpx.Request) -> httpx.Response:
        body = request.content
        seen[body] = seen.get(body, 0) + 1
        if seen[body] % 2 == 1:  # every request is refused once, then served
            return httpx.Response(503, headers={"Retry-After": "0"},
                                  json={"error": {"code": "no_capacity", "message": "full"}})
        chunks = [{"choices": [{"index": 0, "delta": {"content": "hi"}}]},
                  {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]},
                  {"choices": [], "usage": {"prompt_tokens": 128, "completion_tokens": 2}}]
        text = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        return httpx.Response(200, text=text, headers={"content-type": "text/event-stream"})

    target = Target("ledgerlm", "http://test", "m@1", keys={"chat": "k"})
    prompts = [ChatPrompt(({"role": "user", "content": f"q{i}"},), (1, 2)) for i in range(3)]
    _, records = await closed_loop(target, prompts, MIXES["a"], 2, 0.2, 5.0, transport=httpx.MockTransport(answer))
    by_request: dict[int, list[int]] = {}
    for record in records:
        by_request.setdefault(record.index, []).append(record.status)
    assert by_request and all(statuses in ([503, 200], [503]) for statuses in by_request.values())
    assert sum(statuses == [503] for statuses in by_request.values()) <= 2  # only the window's last ones
    summary = client_summary(records, 0.2)
    assert summary["refused_503"] == len(by_request)
    assert summary["refusal_codes"] == {"503 no_capacity": len(by_request)}
    assert summary["completed"] == summary["requests_completed"] == sum(s == [503, 200] for s in by_request.values())


def test_level_summary_counts_outcomes_requests_and_tokens_in_the_window():
    records = [
        make_attempt(0, 0.0),  # completed at once
        make_attempt(1, 0.0, status=503, code="no_capacity"), make_attempt(1, 1.0),  # refused, retried, completed
        make_attempt(2, 0.0, status=429), make_attempt(2, 1.0, status=429),  # abandoned while refused
        make_attempt(3, 0.5, status=500),  # other
        make_attempt(4, 0.5, status=200, error="ReadError"),  # other
        make_attempt(5, 9.0, tokens=4, ttft=0.5, gap=0.5),  # completes after the window: 2 of its 4 tokens count
    ]
    cut = make_attempt(6, 9.5, status=200, error=CUT)
    cut.token_chunks = [(9.8, 3)]
    summary = client_summary([*records, cut], window_s=10.0)
    assert (summary["completed"], summary["refused_429"], summary["refused_503"], summary["other"],
            summary[CUT]) == (3, 2, 1, 2, 1)
    assert summary["other_kinds"] == {"500": 1, "ReadError": 1}
    assert summary["refusal_codes"] == {"429 None": 2, "503 no_capacity": 1}
    assert summary["completed_fraction"] == round(3 / 8, 4)  # the cut attempt is not counted
    assert (summary["requests"], summary["requests_completed"], summary["abandoned_refused"]) == (7, 3, 1)
    assert summary["retry_wait_ms"]["p95"] == 1000.0 and summary["retry_wait_ms"]["p50"] == 0.0
    assert summary["output_tokens_in_window"] == 4 + 4 + 2 + 3 and summary["output_tok_s"] == 1.3
    assert summary["ttft_ms"]["p50"] == 500.0 and summary["itl_ms"]["p50"] == 100.0
    assert summary["output_tokens_per_request"] == {"mean": 4.0, "max": 4}


def test_kv_histogram_and_working_set_maths():
    samples = [{"used": 10, "free": 80, "reserved": 20}, {"used": 30, "free": 60, "reserved": 40}]
    kv = kv_usage(samples)
    assert (kv["pool_blocks"], kv["kv_blocks_used_peak"], kv["kv_blocks_used_mean"]) == (90, 30, 20.0)
    assert kv["kv_used_peak_fraction"] == 0.333 and kv["kv_used_mean_fraction"] == 0.222
    assert kv["kv_blocks_reserved_peak"] == 40 and kv_usage([])["pool_blocks"] is None
    first = {0.05: 2.0, 0.1: 2.0, 1.0: 2.0, math.inf: 2.0}
    last = {0.05: 12.0, 0.1: 20.0, 1.0: 21.0, math.inf: 22.0}  # gained: 10 <= 50 ms, 8 <= 100 ms, 1 <= 1 s, 1 more
    assert histogram_quantiles(first, last, total_s=2.0, count=20.0) == {
        "n": 20, "p50_le_ms": 50.0, "p95_le_ms": 1000.0, "mean_ms": 100.0}
    assert histogram_quantiles(last, last, 0.0, 0.0)["n"] == 0
    assert working_set(4, 128, 64, 91) == {"working_set_blocks": 48, "pool_holds_working_set": True}
    assert working_set(8, 128, 64, 91)["pool_holds_working_set"] is False
    assert working_set(8, 128, None, 91)["working_set_blocks"] is None


def test_worker_metrics_parse_from_the_real_exposition():
    from engine.request import EngineStats
    from plumbing.telemetry.metrics import WorkerMetrics, exposition

    stats = EngineStats(num_blocks_total=91, num_blocks_used=40, num_blocks_free=51, num_blocks_cached_free=3,
                        num_running=4, num_waiting=2, prefix_hit_tokens=0, num_preemptions=3, kv_bytes_per_token=1,
                        num_recomputed_tokens=70)
    metrics = WorkerMetrics(lambda: stats, lambda: 48)
    for seconds in (0.01, 0.02, 0.3):
        metrics.queue_time.observe(seconds)
    for ratio in (0.8, 1.05, 1.2, 4.0):
        metrics.wait_promise_ratio.labels(tier="interactive").observe(ratio)
    metrics.wait_promise_ratio.labels(tier="batch").observe(9.0)  # batch waits promise nothing: left out
    metrics.ttft_promise_ratio.labels(tier="interactive").observe(0.95)
    sample = parse_worker_metrics(exposition(metrics.registry).decode())
    assert promise_summary({}, sample) == {"n": 4, "p50_le": 1.1, "p95_le": 5.0}
    assert promise_summary({}, sample, "ttft_promise_buckets") == {"n": 1, "p50_le": 1.0, "p95_le": 1.0}
    assert (sample["used"], sample["free"], sample["reserved"], sample["running"], sample["waiting"]) == (
        40, 51, 48, 4, 2)
    assert sample["counters"] == {"preemptions_total": 3.0, "recomputed_tokens_total": 70.0}
    assert sample["queue_buckets"][0.01] == 1.0 and sample["queue_buckets"][math.inf] == 3.0
    assert sample["queue_count"] == 3.0


def test_scrape_and_heartbeat_summaries_over_a_level():
    def scrape(t, used, preempted, count):
        return {"t": t, "used": used, "free": 91 - used, "reserved": used, "counters": {"preemptions_total": preempted},
                "queue_buckets": {0.05: count, math.inf: count}, "queue_sum": 0.01 * count, "queue_count": count}

    samples = [scrape(0.5, 0, 2.0, 1.0), scrape(1.5, 40, 2.0, 3.0), scrape(2.5, 80, 5.0, 6.0), scrape(9.0, 0, 9, 9)]
    summary = scrape_summary(samples, 1.0, 3.0)
    assert summary["kv_blocks_used_peak"] == 80 and summary["pool_blocks"] == 91
    assert summary["preemptions"] == 3.0 and summary["queue_time"]["n"] == 5
    assert scrape_summary(samples, 20.0, 30.0)["worker_metrics_note"] == "no /metrics scrape during the level"
    no_counter = [{**s, "counters": {}} for s in samples]
    assert scrape_summary(no_counter, 1.0, 3.0)["preemptions"] is None
    beats = heartbeat_summary([{"queued_tokens": 100, "running": 2}, {"queued_tokens": 300, "running": 5}])
    assert beats == {"heartbeats": 2, "queued_tokens_peak": 300, "queued_tokens_mean": 200.0, "running_peak": 5,
                     "full_step_ms": None}
    priced = heartbeat_summary([
        {"queued_tokens": 0, "running": 8, "decode_step_ms": 100.0, "prefill_token_ms": 2.0, "max_batched_tokens": 512},
        {"queued_tokens": 0, "running": 8, "decode_step_ms": 120.0, "prefill_token_ms": 3.0, "max_batched_tokens": 512},
        {"queued_tokens": 0, "running": 1, "decode_step_ms": None, "prefill_token_ms": None, "max_batched_tokens": 512}])
    assert priced["full_step_ms"] == {"p50": (1124.0 + 1656.0) / 2, "max": 1656.0}


def make_level(c: int, tok_s: float, **more) -> dict:
    return {"concurrency": c, "output_tok_s": tok_s, "refused_429": 0, "refused_503": 0, "other": 0,
            "completed_fraction": 1.0, "completed": 10, "output_tokens_per_request": {"mean": 64.0},
            "pool_blocks": 91, **more}


def test_saturation_ratios_and_targets():
    ours = [make_level(1, 10.0), make_level(4, 40.0), make_level(16, 40.0)]
    assert saturation(ours) == 4 and saturation([make_level(1, 0.0)]) is None and saturation([]) is None
    kv = {"kv_used_mean_fraction": 0.9, "kv_used_peak_fraction": 0.95, "kv_blocks_used_mean": 82}
    runs = {"ledgerlm": {"a": {"levels": ours, "saturation": 4},
                         "b": {"levels": [make_level(8, 30.0, **kv)], "saturation": 8}},
            "transformers_serve": {"a": {"levels": [make_level(16, 20.0)], "saturation": 16},
                                   "b": {"levels": [make_level(8, 10.0)], "saturation": 8}},
            "engine": {"a": {"levels": [make_level(4, 45.0)], "saturation": 4},
                       "b": {"levels": [make_level(8, 30.0)], "saturation": 8}}}
    at = ratios(runs)
    assert at["a"]["platform_vs_transformers_serve"] == 2.0 and at["a"]["platform_vs_engine"] == 0.889
    assert at["b"]["platform_vs_transformers_serve"] == 3.0 and at["b"]["platform_vs_engine"] == 1.0
    where = mark_working_sets(runs, QUICK)
    assert where == {"a": [1, 4], "b": []}  # 16 x 12 blocks > 91; b: 8 x ceil((128 + 64) / 16) = 96 > 91
    met, notes = check_targets(runs, at)
    assert all(met.values()) and notes == {}

    ours[1]["refused_503"], ours[0]["completed_fraction"] = 3, 0.9
    runs["ledgerlm"]["b"]["levels"][0]["kv_used_mean_fraction"] = 0.5
    runs["engine"]["a"]["levels"][0]["output_tok_s"] = 80.0
    met, notes = check_targets(runs, ratios(runs))
    assert met == {"no_503_where_pool_holds_working_set": False, "completed_fraction_min_at_concurrency_le_16": False,
                   "kv_used_mean_fraction_at_saturation_mix_b_min": False, "ratio_vs_transformers_serve_min": True,
                   "ratio_vs_engine_same_concurrency_min": False}
    assert "mix a at 4: 3 x 503" in notes["no_503_where_pool_holds_working_set"]
    assert notes["ratio_vs_engine_same_concurrency_min"] == "mix a: 0.5"
    assert check_targets({}, {})[0] == {name: None for name in met}


def test_configure_and_where_the_engine_alone_runs():
    config = configure(False, "1,2,8", 5.0, "ledgerlm,transformers", "b", None)
    assert config.levels == (1, 2, 8) and config.duration_s == 5.0 and config.mixes == ("b",)
    assert config.servers == ("ledgerlm", "transformers_serve") and not config.quick
    assert configure(True, None, None, None, None, None) == QUICK
    for bad in ({"levels": "1,x"}, {"servers": "vllm"}, {"mixes": "c"}, {"engine_levels": "some"}):
        args = {"quick": False, "levels": None, "duration_s": None, "servers": None, "mixes": None,
                "engine_levels": None, **bad}
        with pytest.raises(ValueError):
            configure(**args)
    ledgerlm = {"a": {"saturation": 4}, "b": {"saturation": None}}
    full = configure(False, "1,4,16", None, None, "a,b", None)
    assert engine_concurrencies(full, ledgerlm) == {"a": [4], "b": [16]}
    assert engine_concurrencies(configure(False, "1,4", None, None, "a", "all"), ledgerlm) == {"a": [1, 4]}


class FakeEngine:
    """Every step emits one token per request; a request ends at its max_tokens; time moves 0.1 s a step."""

    max_model_len = 1024

    def __init__(self) -> None:
        self.time, self.requests, self.aborted, self.params = 0.0, {}, [], []

    def clock(self) -> float:
        return self.time

    def add_request(self, request) -> None:
        from engine.errors import RequestError

        if request.params.max_tokens > 500:
            raise RequestError("needs more KV blocks than the pool has (91)")
        self.requests[request.request_id] = [request.params.max_tokens, 0]
        self.params.append(request.params)

    def step(self):
        from engine.request import FinishReason, RequestOutput

        self.time += 0.1
        outputs = []
        for request_id, state in list(self.requests.items()):
            state[1] += 1
            done = state[1] >= state[0] or request_id in self.aborted
            if done:
                del self.requests[request_id]
            outputs.append(RequestOutput(request_id, (7,), "x", FinishReason.LENGTH if done else None, 128, state[1],
                                         0, 0.0 if state[1] == 1 else None))
        return outputs

    def abort(self, request_id: str) -> bool:
        self.aborted.append(request_id)
        return True

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    def stats(self):
        from types import SimpleNamespace

        return SimpleNamespace(num_blocks_used=4 * len(self.requests), num_blocks_total=91, num_preemptions=0)


def test_engine_closed_loop_keeps_n_requests_running_and_cuts_at_the_end():
    engine = FakeEngine()
    loop = ClosedLoop(engine, [PROMPT], MIXES["a"], 2, clock=engine.clock)
    loop.run(duration_s=20.0, drain_s=1.0)  # 64 tokens = 6.4 s each: 2 clients x 3 full requests, then cut ones
    completed = [r for r in loop.records if r.completed]
    assert len(completed) == 6 and all(r.output_tokens == 64 for r in completed)
    assert [r.error for r in loop.records if not r.completed] == [CUT, CUT]
    assert engine.aborted == ["alone-6", "alone-7"] and not engine.has_unfinished()
    assert {p.temperature for p in engine.params} == {0.0}  # the bench's own clients ask for greedy
    refused = ClosedLoop(FakeEngine(), [PROMPT], MIXES["b"], 3)  # no max_tokens: the rest of the context
    refused.run(1.0, 1.0)
    assert [r.error for r in refused.records] == ["engine_refused"] * 3 and "pool" in refused.refusal


def test_plots_write_one_png_per_mix(tmp_path):
    from bench.capacity.plots import write_plots

    levels = [make_level(1, 10.0, ttft_ms={"p95": 300.0}), make_level(4, 30.0, ttft_ms={"p95": None})]
    runs = {"ledgerlm": {"a": {"levels": levels}, "b": {"levels": levels[:1]}}, "engine": {"a": {"levels": levels}}}
    paths = write_plots(runs, tmp_path)
    assert [p.rsplit("/", 1)[1] for p in paths] == ["capacity_mix_a.png", "capacity_mix_b.png"]
    assert all((tmp_path / p.rsplit("/", 1)[1]).read_bytes().startswith(b"\x89PNG") for p in paths)
    promised = [{**lv, "interactive_ttft_promise_ratio": {"n": 4, "p50_le": 1.1, "p95_le": 3.0}} for lv in levels]
    paths = write_plots({"ledgerlm": {"a": {"levels": promised}}}, tmp_path)  # where the promise was measured
    assert [p.rsplit("/", 1)[1] for p in paths] == ["capacity_mix_a.png", "capacity_promise_mix_a.png"]


def test_transformers_serve_gets_a_view_naming_the_architecture_a_gguf_import_lacks(tmp_path):
    from bench.serve.targets import with_architectures

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": None}))
    (model / "model.safetensors").write_bytes(b"weights")
    view = with_architectures(model, tmp_path / "view")
    assert json.loads((view / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    assert (view / "model.safetensors").resolve() == (model / "model.safetensors").resolve()
    assert json.loads((model / "config.json").read_text())["architectures"] is None  # the model is untouched
    assert with_architectures(view, tmp_path / "again") == view


def guidellm_level(c: int, tok_s: float, errored: int = 0, ttft_p95: float = 900.0, promise: float | None = 1.1,
                   delivered: float | None = None):
    return {"concurrency": c, "completed": 20, "errored": errored, "output_tok_s": tok_s, "error_kinds": {},
            "delivered_output_tok_s": delivered or tok_s,
            "ttft_ms": {"p95": ttft_p95}, "itl_ms": {"p95": 150.0},
            "interactive_ttft_promise_ratio": {"n": 10 if promise else 0, "p50_le": promise},
            "interactive_wait_promise_ratio": {"n": 10, "p50_le": 0.25},  # the TTFT's is the promise judged
            "client_cpu": {"s": 12.0, "cores": 0.3 * c ** 0.5, "wall_s": 40.0}}


def test_guidellm_targets_judge_errors_and_tok_s_only_where_the_engine_keeps_the_allowance():
    from bench.capacity.guidellm_targets import check_guidellm

    ours = [guidellm_level(1, 6.0), guidellm_level(8, 20.0, errored=3, promise=2.0, delivered=24.0),
            guidellm_level(16, 18.0, errored=40, ttft_p95=2500.0)]
    engine = [{"concurrency": 1, "output_tok_s": 6.5, "ttft_ms": {"p95": 300.0}},
              # every token delivered in the window is compared with the engine's every token (24 / 28), and
              # completed requests only with the engine's completed ones (20 / 25) beside it
              {"concurrency": 8, "output_tok_s": 28.0, "completed_output_tok_s": 25.0, "ttft_ms": {"p95": 1500.0}},
              {"concurrency": 16, "output_tok_s": 30.0, "ttft_ms": {"p95": 4000.0}}]  # the engine misses at 16
    report = check_guidellm({"ledgerlm": {"a": {"levels": ours}}, "engine": {"a": {"levels": engine}}}, 2000)
    targets = report["targets"]
    assert targets["ttft_p95_within_allowance"] == {"met": False, "misses": ["16: 2500.0 ms"]}
    assert targets["errors_max_where_engine_keeps"] == {"met": False, "misses": ["8: 0.1304"]}  # 16 not judged
    assert targets["tok_s_vs_engine_min"] == {"met": False, "misses": ["8: 0.857"]}
    assert [row["completed_vs_engine"] for row in report["levels"]][1] == 0.8
    assert targets["overload_not_below_8"] == {"met": False, "misses": ["16: 18.0 < 8: 20.0"]}
    assert targets["promise_median_within_25pct"] == {"met": False, "misses": ["8: 2.0"]}
    assert [row["engine_keeps_allowance"] for row in report["levels"]] == [True, True, False]
    assert [row["client_cores"] for row in report["levels"]] == [0.3, 0.3 * 8 ** 0.5, 1.2]
    kept = check_guidellm({"ledgerlm": {"a": {"levels": ours[:1]}}, "engine": {"a": {"levels": engine}}}, 2000)
    assert all(t["met"] for name, t in kept["targets"].items() if name != "overload_not_below_8")
    assert kept["targets"]["overload_not_below_8"]["met"] is None  # no level 16 (or 8): not measured


def test_the_client_cpu_counts_a_reaped_child_and_its_own_children():
    import subprocess
    import sys

    from bench.capacity.guidellm import children_cpu_s

    before = children_cpu_s()
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass"
    spawn = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {burn!r}], check=True)"
    subprocess.run([sys.executable, "-c", spawn], check=True)  # the grandchild's CPU reaches us through its parent
    assert children_cpu_s() - before >= 0.3


def test_a_guidellm_report_reads_as_a_capacity_level_and_its_command_names_the_tenant_key():
    import json
    from pathlib import Path

    from bench.capacity.guidellm import command, redact, summarize
    from bench.serve.client import Target

    report = json.loads((Path(__file__).parent / "fixtures" / "guidellm-0.8.1-report.json").read_text())
    level = summarize(report)
    assert (level["completed"], level["errored"], level["incomplete"]) == (2, 1, 2)
    assert level["error_kinds"] == {"HTTP 503": 1}
    assert level["output_tok_s"] == 12.8 and level["output_tokens_per_request"] == {"mean": 64.0}
    # the two requests cut at the window's end streamed tokens too: delivered counts them
    assert level["delivered_output_tok_s"] > level["output_tok_s"]
    assert level["ttft_ms"]["p50"] <= level["ttft_ms"]["p95"] and level["itl_ms"]["p95"] > 0
    assert level["prompt_tokens_per_request"] == {"mean": None}  # this report predates the field's reading
    target = Target("ledgerlm", "http://127.0.0.1:8080", "m@1", {"chat": "llm_secret"})
    argv = command(target, "chat", Path("/models/m"), 8, 45, Path("/tmp/out.json"))
    assert "kind=openai_http,target=http://127.0.0.1:8080,model=m@1,api_key=llm_secret" in argv
    assert "kind=concurrent,streams=8" in argv and "kind=max_duration,seconds=45" in argv
    assert redact("key llm_secret leaked", target) == "key <api key> leaked"


def test_the_engine_alone_gets_guidellm_shaped_requests_in_a_guidellm_sweep():
    """As long as guidellm's requests rendered on the platform at each level, and sampled as the platform
    samples a request that names no temperature."""
    from bench.capacity.guidellm import summarize
    from bench.capacity.run import GUIDELLM_MIXES, rendered_lengths

    report = json.loads((Path(__file__).parent / "fixtures" / "guidellm-0.8.1-report.json").read_text())
    report["benchmarks"][-1]["metrics"]["prompt_token_count"] = {"successful": {"mean": 157.6}}
    level = {"concurrency": 8, **summarize(report)}
    assert level["prompt_tokens_per_request"] == {"mean": 157.6}
    assert rendered_lengths([level, {"concurrency": 16, "prompt_tokens_per_request": {"mean": None}}]) == {8: 158}
    engine = FakeEngine()
    ClosedLoop(engine, [PROMPT], GUIDELLM_MIXES["a"], 2, clock=engine.clock).run(duration_s=1.0, drain_s=1.0)
    assert engine.params and {(p.temperature, p.max_tokens, p.ignore_eos) for p in engine.params} == {(1.0, 64, True)}


def test_the_engine_alone_replays_the_prompts_guidellm_sent_in_its_order():
    from bench.capacity.guidellm import sent_prompts

    def request(start: float, text, role: str = "user") -> dict:
        body = {"model": "m@1", "stream": True, "messages": [{"role": role, "content": text}]}
        return {"request_args": json.dumps({"method": None, "body": body}), "info": {"timings": {"request_start": start}}}

    report = {"benchmarks": [{"requests": {
        "successful": [request(3.0, [{"type": "text", "text": "third"}]), request(1.0, [{"type": "text", "text": "first"},
                                                                                       {"type": "text", "text": "part"}])],
        "incomplete": [request(4.0, "fourth, as a plain string")],
        "errored": [request(2.0, [{"type": "text", "text": "second, refused"}]), {"request_id": "no args kept"}]}}]}
    # content parts joined as the gateway joins them (`ChatMessage.native`), so the replay renders what it rendered
    assert [m[0]["content"] for m in sent_prompts(report)] == ["first\npart", "second, refused", "third",
                                                              "fourth, as a plain string"]
    assert sent_prompts(report)[0] == ({"role": "user", "content": "first\npart"},)
