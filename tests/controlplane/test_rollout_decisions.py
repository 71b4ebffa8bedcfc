"""The controller's rollout rules in memory: alias draws pinned at admission, retries, the quality gate."""
from __future__ import annotations

import random
from collections import Counter
from datetime import UTC, datetime

import pytest

from consumers.controller.decisions import Decider
from consumers.controller.registry import WorkerRegistry
from consumers.controller.state import PartitionState
from plumbing.settings import Settings
from schemas.commands import SubmitGeneration
from schemas.model_book import ModelBook
from schemas.model_rollout import ModelAliasSet, ModelQualified
from schemas.registry_events import WorkerHeartbeat
from schemas.values import TenantLimits
from tests.factories import make_event

NOW = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
STABLE, CANARY, OTHER = "chat@1", "chat@2", "chat@3"


def make_version(name: str, content: str = "c1"):
    return make_event("ModelVersionRegistered").model_copy(update={"model_version": name,
                                                                   "content_sha256": content * 32})


def make_alias(weights: dict[str, int], name: str = "chat") -> ModelAliasSet:
    return ModelAliasSet(alias=name, weights=weights, set_at=NOW)


def make_qualified(version: str, passed: bool = True, content: str = "c1") -> ModelQualified:
    return ModelQualified(model_version=version, passed=passed, prompts=2, failures=() if passed else ("capital",),
                          content_sha256=content * 32, qualified_at=NOW)


def heartbeat(worker_id: str, version: str) -> WorkerHeartbeat:
    return WorkerHeartbeat(worker_id=worker_id, model_versions=(version,), total_blocks=10**6, free_blocks=10**6,
                           block_size=16, running=0, queued_tokens=0, lease_ms=2000, occurred_at=NOW,
                           tokens_per_s=1e6)  # fast enough that hundreds of dispatched prompts still fit the allowance


def submit(request_id: str, model: str = "chat", payload_hash: str = "ab" * 32) -> SubmitGeneration:
    return SubmitGeneration(tenant_id="acme", request_id=request_id, gateway_id="gw", correlation_id=request_id,
                            model_version=model, input_token_ids=(1, 2, 3, 4), max_output_tokens=4,
                            payload_hash=payload_hash, occurred_at=NOW)


def make_world(require_qualified: bool = False, workers: tuple[str, ...] = (STABLE, CANARY, OTHER)):
    book = ModelBook()
    for version in (STABLE, CANARY, OTHER):
        book.observe(make_version(version))
    registry = WorkerRegistry()
    for version in workers:
        registry.observe(heartbeat(f"w-{version}", version))
    limits = {"acme": TenantLimits(max_concurrency=10_000, max_tokens_in_flight=10**9, tokens_per_minute=10**9)}
    settings = Settings(retry_after_ms=1000, require_qualified=require_qualified)
    return Decider(settings, registry, limits, book, random.Random(11)), book, PartitionState(0)


def test_alias_weights_100_0_pin_every_admission_to_one_version_and_record_it():
    decider, book, state = make_world()
    book.observe(make_alias({STABLE: 100, CANARY: 0}))
    for i in range(20):
        effects = decider.submit(state, submit(f"r{i}"), NOW)
        (reply,), (admitted,), (start,) = effects.replies, effects.generations, effects.dispatch
        identity = effects.changelog[0]
        assert (reply.http_status, reply.model_version) == (201, STABLE)
        assert (admitted.model_version, admitted.alias, start.model_version, start.worker_id) == (
            STABLE, "chat", STABLE, f"w-{STABLE}")
        assert identity.model_version == STABLE


def test_alias_draws_follow_the_weights_and_a_direct_version_has_no_alias():
    decider, book, state = make_world()
    book.observe(make_alias({STABLE: 3, CANARY: 1}))
    drawn = Counter(decider.submit(state, submit(f"r{i}"), NOW).replies[0].model_version for i in range(400))
    assert set(drawn) == {STABLE, CANARY} and 250 < drawn[STABLE] < 350
    direct = decider.submit(state, submit("direct", model=OTHER), NOW).generations[0]
    assert (direct.model_version, direct.alias) == (OTHER, None)


def test_a_retry_keeps_its_first_version_after_the_weights_change():
    decider, book, state = make_world()
    book.observe(make_alias({STABLE: 100, CANARY: 0}))
    first = decider.submit(state, submit("r1"), NOW).replies[0]
    book.observe(make_alias({STABLE: 0, CANARY: 100}))  # rolled forward: the latest record wins
    retry = decider.submit(state, submit("r1"), NOW)
    assert (retry.replies[0].http_status, retry.replies[0].generation_id, retry.replies[0].model_version) == (
        200, first.generation_id, STABLE)
    assert not (retry.generations or retry.dispatch or retry.changelog)
    assert decider.submit(state, submit("r2"), NOW).replies[0].model_version == CANARY


def test_a_drawn_version_without_a_worker_falls_back_to_another_positive_member_before_503():
    decider, book, state = make_world(workers=(CANARY,))
    book.observe(make_alias({STABLE: 1000, CANARY: 1}))
    assert {decider.submit(state, submit(f"r{i}"), NOW).replies[0].model_version for i in range(10)} == {CANARY}
    book.observe(make_alias({STABLE: 1, CANARY: 0}))  # a weight-0 member is never a fallback
    refused = decider.submit(state, submit("none"), NOW).replies[0]
    assert (refused.http_status, refused.error_code) == (503, "no_capacity")
    assert f"chat ({STABLE})" in refused.reason


def test_unknown_names_and_aliases_without_registered_members_are_404():
    decider, book, state = make_world()
    book.observe(make_alias({"ghost@1": 5}, name="ghostly"))
    for name in ("nothing", "ghostly"):
        reply = decider.submit(state, submit(f"r-{name}", model=name), NOW).replies[0]
        assert (reply.http_status, reply.error_code) == (404, "unknown_model")


@pytest.mark.parametrize(("qualification", "fragment"), [
    (None, "has not been qualified"),
    (make_qualified(STABLE, passed=False), "failed qualification"),
    (make_qualified(STABLE, content="c2"), "was qualified on other content"),
])
def test_require_qualified_refuses_a_version_without_a_passing_qualification_with_503(qualification, fragment):
    decider, book, state = make_world(require_qualified=True)
    if qualification is not None:
        book.observe(qualification)
    reply = decider.submit(state, submit("r1", model=STABLE), NOW).replies[0]
    assert (reply.http_status, reply.error_code) == (503, "model_not_qualified")
    assert fragment in reply.reason and f"ledgerlm models qualify {STABLE}" in reply.reason
    assert 1000 <= reply.retry_after_ms <= 1500 and not state.tenant("acme").generations


def test_require_qualified_routes_a_qualified_version_and_the_latest_qualification_wins():
    decider, book, state = make_world(require_qualified=True)
    book.observe(make_qualified(STABLE, passed=False))
    book.observe(make_qualified(STABLE))  # re-qualified after a fix
    assert decider.submit(state, submit("r1", model=STABLE), NOW).replies[0].http_status == 201
    book.observe(make_qualified(STABLE, passed=False))
    assert decider.submit(state, submit("r2", model=STABLE), NOW).replies[0].error_code == "model_not_qualified"


def test_require_qualified_alias_draws_skip_unqualified_members():
    decider, book, state = make_world(require_qualified=True)
    book.observe(make_alias({STABLE: 1, CANARY: 1000}))
    refused = decider.submit(state, submit("r0"), NOW).replies[0]
    assert (refused.http_status, refused.error_code) == (503, "model_not_qualified")
    assert refused.reason == f"no version of alias chat ({STABLE}, {CANARY}) has passed qualification"
    book.observe(make_qualified(STABLE))
    assert {decider.submit(state, submit(f"r{i}"), NOW).replies[0].model_version for i in range(1, 11)} == {STABLE}


def test_without_the_gate_an_unqualified_version_is_routed():
    decider, _book, state = make_world(require_qualified=False)
    assert decider.submit(state, submit("r1", model=STABLE), NOW).replies[0].http_status == 201
