"""The serving bench's pure parts: workload plans, stream parsing, latency/goodput maths, report shape."""
from __future__ import annotations

import json
import random

import pytest

from bench.serve.client import on_native_event, on_openai_chunk, openai_body, spread_usage
from bench.serve.metrics import RequestRecord, Slo, capacity, ratio, summarize, summarize_group
from bench.serve.run import QUICK, TENANTS, assemble, comparison, mixed_loads
from bench.serve.workload import (INTERACTIVE, LONG_DOCUMENT, PlannedRequest, PromptSource, TenantLoad, plan,
                                  poisson_arrivals)


def make_prompts() -> PromptSource:
    # One "token" per character: prompt length in tokens == len(text).
    return PromptSource([ord(c) for c in "abcdefghij" * 50], lambda ids: "".join(map(chr, ids)))


def make_record(ttft: float = 0.2, itl: float = 0.01, tokens: int = 11, status: int = 201, tenant: str = "chat",
                mix: str = "interactive", reason: str | None = "completed") -> RequestRecord:
    record = RequestRecord(index=0, tenant=tenant, mix=mix, api="native", sent_at=1.0, status=status,
                           end_reason=reason if 200 <= status < 300 else None, output_tokens=tokens)
    if 200 <= status < 300:
        first = 1.0 + ttft
        record.token_chunks = [(first, 1), (first + itl * (tokens - 1), tokens - 1)]
        record.done_at = first + itl * (tokens - 1)
    return record


def test_poisson_arrivals_are_seeded_sorted_and_near_the_rate():
    arrivals = poisson_arrivals(20.0, 50.0, random.Random(1))
    assert arrivals == sorted(arrivals) and all(0 <= a < 50 for a in arrivals)
    assert 900 <= len(arrivals) <= 1100  # mean 1,000
    assert arrivals == poisson_arrivals(20.0, 50.0, random.Random(1))
    assert poisson_arrivals(0.0, 50.0, random.Random(1)) == []


def test_plan_merges_tenants_by_time_with_lengths_inside_each_mix():
    loads = [TenantLoad("chat", INTERACTIVE, 5.0, "native", "interactive"),
             TenantLoad("docs", LONG_DOCUMENT, 1.0, "native", "batch")]
    requests = plan(loads, 10.0, make_prompts(), seed=3)
    assert [r.at_s for r in requests] == sorted(r.at_s for r in requests)
    assert [r.index for r in requests] == list(range(len(requests)))
    for r in requests:
        mix = INTERACTIVE if r.tenant == "chat" else LONG_DOCUMENT
        assert mix.prompt_tokens[0] <= r.prompt_tokens <= mix.prompt_tokens[1]
        assert len(r.prompt) == r.prompt_tokens
        assert mix.output_tokens[0] <= r.max_output_tokens <= mix.output_tokens[1]
    assert {r.tier for r in requests if r.tenant == "docs"} == {"batch"}
    assert requests == plan(loads, 10.0, make_prompts(), seed=3)


def test_record_latencies_and_goodput_against_the_slo():
    slo = Slo(ttft_s=1.0, itl_s=0.05)
    good = make_record(ttft=0.5, itl=0.02)
    assert good.ttft == pytest.approx(0.5) and good.itl == pytest.approx(0.02) and good.is_good(slo)
    assert not make_record(ttft=1.2).is_good(slo)
    assert not make_record(itl=0.06).is_good(slo)
    assert not make_record(status=429).is_good(slo)
    assert make_record(tokens=1).itl is None


def test_group_summary_counts_rejections_goodput_and_whether_the_slo_holds():
    records = [make_record(ttft=0.1 * i) for i in range(1, 20)] + [make_record(status=429)]
    summary = summarize_group(records, window_s=10.0)
    assert summary["sent"] == 20 and summary["completed"] == 19
    assert summary["statuses"] == {"201": 19, "429": 1} and summary["rejections"] == {"429": 1}
    assert summary["good"] == 10  # ttft 0.1 .. 1.0 s
    assert summary["goodput_rps"] == 1.0 and summary["goodput_fraction"] == 0.5
    assert summary["ttft_ms"]["p50"] == 1000.0 and summary["itl_ms"]["p95"] == 10.0
    assert summary["slo_holds"] is False  # p95 ttft is 1.8 s
    fast = summarize_group([make_record() for _ in range(20)], window_s=10.0)
    assert fast["slo_holds"] is True
    cut = summarize_group([make_record() for _ in range(18)] + [make_record(status=429)] * 2, 10.0)
    assert cut["slo_holds"] is False  # only 90% completed


def test_shares_and_capacity_and_ratios():
    records = [make_record(tenant="a", tokens=30), make_record(tenant="b", tokens=10)]
    report = summarize(records, window_s=5.0)
    assert report["served_token_share"] == {"a": 0.75, "b": 0.25}
    assert set(report["by_mix"]) == {"interactive"} and set(report["by_tenant"]) == {"a", "b"}
    assert sum(sum(p["tokens"].values()) for p in report["token_share_series"]) == 40
    assert capacity([{"rate": 1, "slo_holds": True}, {"rate": 2, "slo_holds": True},
                     {"rate": 4, "slo_holds": False}]) == 2
    assert capacity([{"rate": 1, "slo_holds": False}]) == 0.0
    assert ratio(3.0, 2.0) == 1.5 and ratio(3.0, 0.0) is None and ratio(None, 1.0) is None


def test_stream_parsers_read_native_events_and_openai_chunks():
    native = RequestRecord(0, "chat", "interactive", "native", sent_at=0.0, status=201)
    on_native_event(native, "generation", json.dumps({"status": "admitted"}), 0.1)
    on_native_event(native, "token", json.dumps({"seq": 1, "tokenCount": 2}), 0.3)
    on_native_event(native, "token", json.dumps({"seq": 2, "tokenCount": 3}), 0.4)
    on_native_event(native, "final", json.dumps({"reason": "output-limit", "usage": {
        "inputTokens": 70, "cachedInputTokens": 0, "outputTokens": 5}}), 0.5)
    assert native.token_chunks == [(0.3, 2), (0.4, 3)] and native.output_tokens == 5
    assert native.end_reason == "output-limit" and native.prompt_tokens == 70 and native.ttft == 0.3

    chat = RequestRecord(1, "api", "interactive", "openai", sent_at=0.0, status=200)
    for at, text in ((0.2, "a"), (0.3, ""), (0.4, "b")):
        on_openai_chunk(chat, json.dumps({"choices": [{"index": 0, "text": text}]}), at)
    on_openai_chunk(chat, json.dumps({"choices": [{"index": 0, "text": "", "finish_reason": "length"}],
                                      "usage": {"prompt_tokens": 9, "completion_tokens": 5}}), 0.5)
    on_openai_chunk(chat, "[DONE]", 0.6)
    spread_usage(chat)
    assert chat.token_chunks == [(0.2, 3), (0.4, 2)] and chat.output_tokens == 5 and chat.end_reason == "length"


def test_openai_body_sends_ledgerlm_only_fields_to_ledgerlm():
    request = PlannedRequest(0, 0.0, "docs", "long_document", "openai", "batch", "text", 4, 8)
    ours, theirs = openai_body(request, "m", ledgerlm=True), openai_body(request, "m", ledgerlm=False)
    assert ours["service_tier"] == "flex" and ours["stream_options"] == {"include_usage": True}
    assert "service_tier" not in theirs and "stream_options" not in theirs and theirs["max_tokens"] == 8


def test_report_shape_and_ratios(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 512,
                                                      "max_position_embeddings": 8192}))
    side = {"slo_tenants_interactive": {"goodput_rps": 2.0, "good": 6}, "capacity_rps": 4.0}
    targets = {"ledgerlm": {**side}, "transformers_serve": {"slo_tenants_interactive": {"goodput_rps": 1.0, "good": 3},
                                                             "capacity_rps": 2.0}}
    mixed = plan(mixed_loads(QUICK), 2.0, make_prompts(), seed=0)
    report = assemble(QUICK, True, tmp_path, mixed, targets, 8192, [0.1, 0.2, 0.3])
    assert report["goodput_ratio_vs_transformers_serve"] == 2.0
    assert report["capacity_ratio_vs_transformers_serve"] == 2.0 and report["goodput_ratio_lower_bound"] == 2.0
    none_good = comparison({"ledgerlm": side, "transformers_serve": {"slo_tenants_interactive": {
        "goodput_rps": 0.0, "good": 0}, "capacity_rps": 0.0}})
    assert none_good["goodput_ratio_vs_transformers_serve"] is None and none_good["goodput_ratio_lower_bound"] == 6.0
    assert "goodput is 0" in none_good["ratio_note"]
    assert report["model"]["max_context"] == 8192 and report["slo"] == {"ttft_s": 1.0, "itl_s": 0.05}
    assert {t["name"] for t in report["tenants"]} == {t.name for t in TENANTS}
    assert "good_request" in report["definitions"]
    json.dumps(report)  # JSON-ready
    down = comparison({"ledgerlm": side, "transformers_serve": {"unavailable": "no accelerate"}})
    assert down["goodput_ratio_vs_transformers_serve"] is None and "no accelerate" in down["ratio_note"]


def test_plots_write_one_png_per_mix_plus_kv_and_shares(tmp_path):
    from bench.serve.plots import write_plots

    records = [make_record(), make_record(mix="long_document", tenant="docs")]
    samples = [{"t": 0.5, "used_blocks": 3, "free_blocks": 5, "total_blocks": 8, "running": 1, "queued_tokens": 4}]
    paths = write_plots({"ledgerlm": records, "transformers_serve": records[:1]}, samples, 1.0, tmp_path)
    assert sorted(p.rsplit("/", 1)[1] for p in paths) == [
        "kv_blocks_queue_depth.png", "latency_cdf_interactive.png", "latency_cdf_long_document.png",
        "tenant_token_share.png"]
    assert all((tmp_path / p.rsplit("/", 1)[1]).read_bytes().startswith(b"\x89PNG") for p in paths)


async def test_sweep_interleaves_servers_and_stops_each_at_its_first_miss(monkeypatch):
    from bench.serve.client import Target
    import bench.serve.run as serve_bench

    capacity_of = {"ledgerlm": 4.0, "transformers_serve": 1.0}
    calls = []

    async def fake_point(target, rate, config, prompts):
        calls.append((target.name, rate))
        return {"rate": rate, "slo_holds": rate <= capacity_of[target.name]}

    monkeypatch.setattr(serve_bench, "sweep_point", fake_point)
    servers = {name: Target(name, "http://x", "m") for name in capacity_of}
    points = await serve_bench.sweep(servers, QUICK, make_prompts())
    assert calls == [("ledgerlm", 1.0), ("transformers_serve", 1.0), ("transformers_serve", 2.0),
                     ("ledgerlm", 2.0), ("ledgerlm", 4.0)]
    assert [capacity(points[name]) for name in servers] == [4.0, 1.0]
    assert points["ledgerlm"][-1]["slo_holds"] and not points["transformers_serve"][-1]["slo_holds"]
