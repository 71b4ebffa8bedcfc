"""bench capacity reads the controller's refusal lines back: the format the role logs is the format it parses."""
from __future__ import annotations

import logging
import random
import time
from datetime import UTC, datetime

from bench.capacity.refusals import refusal_terms
from consumers.controller.decisions import Decider
from consumers.controller.registry import WorkerRegistry
from consumers.controller.state import PartitionState
from ledgerlm.cli.roles import log_format
from plumbing.settings import Settings
from schemas.commands import SubmitGeneration
from schemas.model_book import ModelBook
from schemas.registry_events import WorkerHeartbeat
from schemas.values import TenantLimits
from tests.factories import make_event

VERSION = "demo-tiny@1"


def refuse(queued_tokens: int, wait_error_ms: float, request_id: str) -> None:
    now = datetime.now(UTC)
    registry = WorkerRegistry()
    registry.observe(WorkerHeartbeat(worker_id="w1", model_versions=(VERSION,), total_blocks=64, free_blocks=64,
                                     block_size=16, running=0, queued_tokens=queued_tokens, lease_ms=2000,
                                     prefill_step_ms=400.0, max_batched_tokens=512, tokens_per_s=50.0,
                                     wait_error_ms=wait_error_ms, occurred_at=now))
    decider = Decider(Settings(), registry, {"acme": TenantLimits()},
                      ModelBook(versions={VERSION: make_event("ModelVersionRegistered")}), random.Random(1))
    reply = decider.submit(PartitionState(0), SubmitGeneration(
        tenant_id="acme", request_id=request_id, gateway_id="gw", correlation_id=request_id, model_version=VERSION,
        input_token_ids=tuple(range(1, 129)), max_output_tokens=64, payload_hash="ab" * 32, occurred_at=now),
        now).replies[0]
    assert reply.http_status == 503


def test_the_refusals_of_a_window_are_counted_with_the_terms_of_their_predicted_waits(tmp_path):
    log = tmp_path / "controller.log"
    handler = logging.FileHandler(log)
    handler.setFormatter(logging.Formatter(log_format("controller")))  # as the controller role logs
    logger = logging.getLogger("consumers.controller.decisions")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        t0 = time.time() - 1
        # 5 whole steps of 400 ms before its prefill (2.0 s), its first token a step later: 2.4 s
        refuse(queued_tokens=2600, wait_error_ms=0.0, request_id="queue")
        refuse(queued_tokens=0, wait_error_ms=2000.0, request_id="error")  # nothing queued, measured 2 s late
        t1 = time.time() + 1
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        handler.close()
    terms = refusal_terms(log, t0, t1)
    assert terms["n"] == 2
    assert (terms["wait_ms_max"], terms["model_ms_max"], terms["error_ms_max"]) == (2000, 2000, 2000)
    assert (terms["queued_tokens_max"], terms["pending_max"]) == (2600, 0)
    # the TTFT judged: the queue's 2.4 s; the error's 0.4 s of its own step plus the 2 s measured
    assert (terms["ttft_ms_max"], terms["model_ttft_ms_max"], terms["ttft_ms_p50"]) == (2400, 2400, 2400)
    assert refusal_terms(log, t1, t1 + 10) == {"n": 0}  # outside the window
    assert refusal_terms(tmp_path / "absent.log", t0, t1) == {"n": 0}
