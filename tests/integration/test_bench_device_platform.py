"""`ledgerlm bench device --quick --sections platform`: the whole stack with the worker on the device (the CPU
here) against its engine alone, on the session's Kafka and PostgreSQL (issue 29). The other sections run without
services in tests/unit/test_bench_device.py."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from plumbing.settings import REPO_ROOT


def test_platform_section_streams_chats_through_the_stack_and_compares_the_engine_alone(services, database_url,
                                                                                         topics, tmp_path):
    from engine.artifacts.demo_model import build_demo_model

    home = tmp_path / "home"
    build_demo_model(home / "models" / "device-demo-tiny", size="tiny", train_steps=0, progress=False)
    report_path = tmp_path / "device.json"
    env = {**os.environ, "LEDGERLM_HOME": str(home), "LEDGERLM_KAFKA_BOOTSTRAP": services.kafka_bootstrap,
           "LEDGERLM_DATABASE_URL": database_url, "OMP_WAIT_POLICY": "PASSIVE",
           "LEDGERLM_WORKER_CPU_KV_CAP_BYTES": str(64 << 20)}
    done = subprocess.run([sys.executable, "-m", "ledgerlm.cli.main", "bench", "device", "--quick", "--sections",
                           "platform", "--json", str(report_path)], env=env, cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(report_path.read_text())
    assert list(report["sections"]) == ["platform"]
    platform = report["sections"]["platform"]
    assert "error" not in platform, platform.get("error")
    assert platform["device"] == "cpu" and platform["concurrency"] == 4 and platform["model"] == "demo-tiny"
    ours, alone = platform["platform"], platform["engine_alone"]
    for side in (ours, alone):
        assert side["completed"] > 0 and side["output_tok_s"] > 0
        assert side["other"] == 0 and side["output_tokens_per_request"]["max"] == 64  # mix a: 64 tokens each
    assert ours["refused_429"] == 0  # the bench's tenant has budgets no level reaches
    assert platform["tok_s_ratio"] == round(ours["output_tok_s"] / alone["output_tok_s"], 3) > 0
    assert report["targets_met"]["platform_tok_s_ratio"] is (platform["tok_s_ratio"] >= 0.9)
