"""`ledgerlm bench device --quick` on the CPU, every section that needs no services (the platform section has its
own test under tests/integration): the report's structure and values, the budget and a failing section."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from plumbing.compute_threads import passive_compute_threads

passive_compute_threads()

SERVICE_FREE = "environment,parity,decode,prefill,kv"


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    """A home whose models folder holds the quick run's demo model (built here, as the bench would)."""
    from engine.artifacts.demo_model import build_demo_model

    home = tmp_path_factory.mktemp("home")
    build_demo_model(home / "models" / "device-demo-tiny", size="tiny", train_steps=5, progress=False)
    return home


def bench_device(home: Path, json_path: Path, *options: str, monkeypatch) -> dict:
    from ledgerlm.cli.main import main

    monkeypatch.setenv("LEDGERLM_HOME", str(home))
    # `auto` on a CPU takes min(25% of MemAvailable, this cap): keep the sizing section's pools small here.
    monkeypatch.setenv("LEDGERLM_WORKER_CPU_KV_CAP_BYTES", str(64 << 20))
    assert main(["bench", "device", "--quick", "--json", str(json_path), *options]) == 0
    return json.loads(json_path.read_text())


@pytest.fixture(scope="module")
def report(home, tmp_path_factory) -> dict:
    with pytest.MonkeyPatch.context() as monkeypatch:
        return bench_device(home, tmp_path_factory.mktemp("out") / "device.json", "--sections", SERVICE_FREE,
                            monkeypatch=monkeypatch)


def test_quick_run_reports_each_service_free_section_with_its_wall_time(report):
    assert list(report["sections"]) == SERVICE_FREE.split(",")
    for name, section in report["sections"].items():
        assert "error" not in section and "skipped" not in section, (name, section)
        assert section["wall_s"] > 0
    assert report["real_model"]["name"] == "demo-tiny"
    assert report["quick"] is True and report["budget_s"] == 170.0
    env = report["sections"]["environment"]
    assert env["device"] == "cpu" and env["dtype"] == "float32"
    assert env["total_bytes"] >= env["free_bytes"] > 0
    assert env["bandwidth"]["gb_s"] > 0


def test_parity_matches_transformers_on_the_demo_model(report):
    parity = report["sections"]["parity"]
    assert list(parity["dtypes"]) == ["float32"]  # bfloat16 only on CUDA
    f32 = parity["dtypes"]["float32"]
    assert parity["prompts"] == 4 and len(f32["prompts"]) == 4
    assert f32["all_match"] is True and all(p["match"] and p["tokens"] > 0 for p in f32["prompts"])
    assert 0 <= f32["max_abs_logprob_delta"] < 1e-3
    assert report["targets_met"]["parity_float32"] is True


def test_decode_rows_measure_tok_s_against_a_roofline_for_both_models(report):
    decode = report["sections"]["decode"]
    models = {m["model"]: m for m in decode["models"]}
    assert set(models) == {"demo-tiny", "llama3-8b-shape/8"}
    assert models["llama3-8b-shape/8"]["shape"] == "llama3-8b-shape/8"
    for model in models.values():
        assert [row["batch"] for row in model["rows"]] == [1, 8]
        for row in model["rows"]:
            assert row["output_tok_s"] > 0 and row["steps_not_all_rows"] == 0
            assert 0 < row["roofline_ratio"] <= 1.5
            expected = (row["weight_bytes"] + row["kv_bytes_read"]) / (decode["bandwidth_gb_s"] * 1e9) * 1e3
            assert row["roofline_ms"] == pytest.approx(expected, abs=2e-3)
    # 4 layers of hidden 512, GQA 4:1 with head_dim 128, float32: 2 x 4 x 1 x 128 x 4 bytes per token.
    assert models["llama3-8b-shape/8"]["kv_bytes_per_token"] == 4096


def test_prefill_reports_tok_s_and_a_chunked_prompt_beside_running_decodes(report):
    prefill = report["sections"]["prefill"]
    assert [row["prompt_tokens"] for row in prefill["alone"][1]["rows"]] == [128, 512]
    assert all(row["prompt_tok_s"] > 0 for entry in prefill["alone"] for row in entry["rows"])
    for entry in prefill["interleaved"]:
        assert entry["running_decodes"] == 8 and entry["steps_to_first_token"] >= 2  # 512 tokens beside 8 rows
        assert entry["ttft_ms"] > 0 and entry["itl_ms_during"]["n"] > 0 and entry["itl_ms_before"]["n"] > 0


def test_kv_reports_what_auto_chose_and_fills_a_pool_without_oom(report):
    kv = report["sections"]["kv"]
    for chosen in kv["chosen"]:
        assert chosen["bytes"] <= 64 << 20 and chosen["blocks"] > 0 and "cap" in chosen["how"]
        assert 0 < chosen["share_of_device_memory"] < 1
    fill = kv["fill"]
    assert kv["oom"] is False and fill["oom"] is False and fill["failed"] == 0 and fill["step_errors"] == []
    assert fill["demand_tokens"] > fill["tokens"] and fill["all_finished"] is True
    assert fill["filled"] is True and fill["peak_used_share"] >= 0.95 and fill["preemptions"] > 0


def test_a_spent_budget_skips_the_sections_left_and_each_section_writes_the_json(home, tmp_path, monkeypatch):
    import bench.device.run as run

    path, seen = tmp_path / "cut.json", []

    def slow_parity(ctx):
        seen.append(json.loads(path.read_text())["sections"])  # what the run had written when this began
        ctx.began -= 10_000  # this section spends the whole budget (as the clock sees it: no sleep, no race)
        return {"dtypes": {}}

    def decode(ctx):
        raise AssertionError("decode must be skipped")

    monkeypatch.setattr(run, "SECTIONS", {**run._sections(), "parity": slow_parity, "decode": decode})
    report = bench_device(home, path, "--sections", "environment,parity,decode,kv", "--budget-s", "600",
                          monkeypatch=monkeypatch)
    assert list(seen[0]) == ["environment"] and seen[0]["environment"]["bandwidth"]["gb_s"] > 0
    assert report["sections"]["parity"]["dtypes"] == {} and report["sections"]["parity"]["wall_s"] >= 0
    assert report["sections"]["decode"] == {"skipped": "budget"}
    assert report["sections"]["kv"] == {"skipped": "budget"}
    assert json.loads(path.read_text()) == report


def test_a_section_that_raises_is_recorded_and_the_run_goes_on(home, tmp_path, monkeypatch):
    import bench.device.run as run

    def broken(ctx):
        raise RuntimeError("no such kernel")

    monkeypatch.setattr(run, "SECTIONS", {**run._sections(), "environment": broken})
    report = bench_device(home, tmp_path / "broken.json", "--sections", "environment,parity",
                          monkeypatch=monkeypatch)
    error = report["sections"]["environment"]["error"]
    assert error["class"] == "RuntimeError" and error["message"] == "no such kernel"
    assert any("no such kernel" in line for line in error["traceback"])
    assert report["sections"]["parity"]["dtypes"]["float32"]["all_match"] is True


def test_unknown_sections_are_refused(home, tmp_path, monkeypatch):
    from ledgerlm.cli.errors import CliError
    from ledgerlm.cli.bench.device import config_of

    class Args:
        quick, budget_s, device, sections = True, None, None, "decode,gpu"

    with pytest.raises(CliError, match="unknown gpu"):
        config_of(Args())


def test_every_attention_path_the_engine_offers_is_measured_and_none_when_it_offers_no_choice(monkeypatch):
    import dataclasses

    import engine.config
    from bench.device.engines import attention_values
    from engine.attention_choice import ATTENTION_PATHS

    assert attention_values() == ("gather", "flex") and set(attention_values()) < set(ATTENTION_PATHS)

    @dataclasses.dataclass(frozen=True)
    class WithoutAttention:
        block_size: int = 16

    monkeypatch.setattr(engine.config, "EngineConfig", WithoutAttention)
    assert attention_values() == (None,)
