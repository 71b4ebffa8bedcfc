"""The tenant usage API, line items and statements through the gateway, and `ledgerlm billing` (issue 28).

Exact figures come from synthetic generations of the session's `main` tenant sealed in an old month of
this module's own (no other test seals there); one real generation runs on the served worker. The
projections are applied to the session database with the projector itself, as the gateway reads them.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sys
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from plumbing.kafka.clients import publish
from plumbing.settings import Settings
from producers.gateway.native.usage_models import LineItem, StatementAnswer, UsageAnswer
from projections.periods import Period
from projections.registry import all_projections
from projections.runtime import Projector
from schemas.stream import StreamFinished, TokensEmitted
from schemas.topics import GENERATIONS, TOKENS
from tests.controlplane.conftest import body
from tests.factories import old_period
from tests.projections.conftest import Gen

PERIOD = old_period()  # this module's own month
HOUR = PERIOD.start.replace(day=15, hour=10)


async def project_all(bootstrap: str, database_url: str) -> None:
    projector = Projector(bootstrap, database_url, all_projections(Settings()))
    try:
        await projector.catch_up()
    finally:
        projector.close()


async def emit(producer, *events) -> None:
    for event in events:
        await publish(producer, TOKENS if isinstance(event, (TokensEmitted, StreamFinished)) else GENERATIONS, event)


def gen(tenant_id: str, at: datetime, model: str = "usage-a@1") -> tuple[Gen, list]:
    g = Gen(tenant_id, f"gen-{uuid.uuid4().hex[:12]}", clock=at)
    return g, [g.admitted().model_copy(update={"model_version": model})]


def completed(tenant_id: str, at: datetime, output: int, model: str = "usage-a@1") -> list:
    g, events = gen(tenant_id, at, model)
    tokens = [g.tokens(seq, seq) for seq in range(1, output + 1)]
    return events + [g.started(), *tokens, g.report(1, output), g.completed(output), g.finished(output + 1)]


def interrupted_twice(tenant_id: str, at: datetime) -> tuple[Gen, list]:
    """Epoch 1 handed back after 2 recorded tokens; epoch 2 streams 9, records 6 (recompute 5), is lost."""
    g, events = gen(tenant_id, at, "usage-b@2")
    events += [g.started(1), g.report(1, 2, epoch=1), g.started(2, worker="worker-b"),
               *[g.tokens(seq, seq, epoch=2) for seq in range(1, 10)], g.report(1, 6, epoch=2, recompute=5),
               g.interrupted(epoch=2)]
    return g, events


@pytest.fixture(scope="module")
async def billed(bootstrap, database_url, tenants, topics):
    """This module's synthetic workload, projected: two completions and a twice-tried interrupted one."""
    from plumbing.kafka.clients import make_producer

    producer = make_producer(bootstrap)
    await producer.start()
    main = tenants["main"].tenant_id
    lost, lost_events = interrupted_twice(main, HOUR + timedelta(minutes=20))
    try:
        await emit(producer, *completed(main, HOUR, 5), *completed(main, HOUR + timedelta(minutes=5), 3),
                   *lost_events, *completed(main, HOUR + timedelta(days=1), 4))
    finally:
        await producer.stop()
    await project_all(bootstrap, database_url)
    return {"lost": lost.generation_id}


def window(start: datetime, end: datetime, **query) -> str:
    q = "&".join(f"{k}={v}" for k, v in {"from": start.isoformat(), "to": end.isoformat(), **query}.items())
    return "/v1/usage?" + q.replace("+", "%2B")


async def test_usage_per_model_version_says_what_was_processed_delivered_billed_and_left_unbilled(
        gateway, tenants, billed):
    answer = await gateway.get(window(HOUR, HOUR + timedelta(hours=1)), headers=tenants["main"].headers)
    assert answer.status_code == 200, answer.text
    doc = UsageAnswer.model_validate(answer.json()).model_dump(by_alias=True)
    assert doc["totals"] == {"generations": 3, "inputTokens": 120, "cachedInputTokens": 48, "outputTokens": 14}
    assert [m["model"] for m in doc["models"]] == ["usage-a@1", "usage-b@2"]
    assert doc["models"][1] == {
        "model": "usage-b@2", "generations": 1, "processedInputTokens": 80, "cachedInputTokens": 32,
        "generatedOutputTokens": 11, "deliveredOutputTokens": 9, "billedInputTokens": 40,
        "billedCachedInputTokens": 16, "billedOutputTokens": 6, "recomputeTokens": 5, "unbilledTailTokens": 3,
        "interrupted": {"generations": 1, "inputTokens": 40, "cachedInputTokens": 16, "outputTokens": 6}}
    a = doc["models"][0]
    assert (a["generations"], a["billedOutputTokens"], a["deliveredOutputTokens"], a["generatedOutputTokens"],
            a["interrupted"]["generations"]) == (2, 8, 8, 8, 0)
    assert [h["hour"] for h in doc["hours"]] == [HOUR.isoformat()] and doc["days"] is None


async def test_usage_by_day_and_by_model_name_or_version(gateway, tenants, billed):
    headers = tenants["main"].headers
    days = (await gateway.get(window(HOUR, HOUR + timedelta(days=2), granularity="day"), headers=headers)).json()
    assert [(d["day"], d["generations"]) for d in days["days"]] == [
        (HOUR.replace(hour=0).isoformat(), 3), ((HOUR + timedelta(days=1)).replace(hour=0).isoformat(), 1)]
    assert "hours" not in days
    for model, expected in (("usage-b", 1), ("usage-b@2", 1), ("usage-a@1", 3), ("usage-a@9", 0)):
        one = (await gateway.get(window(HOUR, HOUR + timedelta(days=2), model=model), headers=headers)).json()
        assert (one["model"], one["totals"]["generations"]) == (model, expected)


async def test_another_tenant_sees_none_of_it(gateway, tenants, billed):
    other = await gateway.get(window(HOUR, HOUR + timedelta(days=2)), headers=tenants["other"].headers)
    assert other.json()["totals"]["generations"] == 0 and other.json()["models"] == []
    item = await gateway.get(f"/v1/generations/{billed['lost']}/usage", headers=tenants["other"].headers)
    assert item.status_code == 404 and item.json()["code"] == "not_found"
    unknown = await gateway.get(f"/v1/generations/gen-{uuid.uuid4().hex}/usage", headers=tenants["main"].headers)
    assert unknown.status_code == 404


@pytest.mark.parametrize(("query", "fields"), [
    ("granularity=week", ["granularity"]), ("from=2026-11-02T00:00:00Z&to=2026-11-01T00:00:00Z", ["from", "to"]),
    ("from=2026-11-01T00:00:00", ["from", "to"]), ("model=a%20b", ["model"]),
    ("from=2025-01-01T00:00:00Z&to=2026-01-01T00:00:00Z", ["from", "to", "granularity"])])
async def test_a_bad_usage_query_is_400_naming_the_parameter(gateway, tenants, query, fields):
    answer = await gateway.get(f"/v1/usage?{query}", headers=tenants["main"].headers)
    assert answer.status_code == 400 and answer.json()["code"] == "invalid_request"
    assert answer.json()["details"]["fields"] == fields and answer.json()["message"]


async def test_the_line_item_of_an_interrupted_generation_shows_each_attempt(gateway, tenants, billed):
    answer = await gateway.get(f"/v1/generations/{billed['lost']}/usage", headers=tenants["main"].headers)
    item = LineItem.model_validate(answer.json()).model_dump(by_alias=True)
    assert (item["status"], item["sealed"], item["bill"]["label"], item["bill"]["outputTokens"],
            item["bill"]["period"], item["bill"]["belongsTo"]) == ("interrupted", True, "interrupted", 6,
                                                                   str(PERIOD), str(PERIOD))
    first, second = item["attempts"]
    assert (first["epoch"], first["billed"], first["label"], first["watermark"]["generatedOutputTokens"],
            first["workerId"]) == (1, False, "superseded", 2, "worker-a")
    assert (second["billed"], second["label"], second["deliveredOutputTokens"], second["unbilledTailTokens"],
            second["watermark"]["recomputeTokens"], second["sealedAt"]) == (
        True, "interrupted", 9, 3, 5, item["bill"]["sealedAt"])


async def test_the_line_item_of_a_real_generation_is_its_bill(gateway, worker, tenants, versions, bootstrap,
                                                              database_url):
    headers = tenants["main"].headers
    done = (await gateway.post("/v1/generations?wait=true", headers=headers,
                               json=body(model=versions["served"], maxOutputTokens=6))).json()
    await project_all(bootstrap, database_url)
    item = (await gateway.get(f"/v1/generations/{done['id']}/usage", headers=headers)).json()
    assert (item["sealed"], item["bill"]["label"], item["bill"]["outputTokens"], item["bill"]["inputTokens"]) == (
        True, "final", 6, done["usage"]["inputTokens"])
    sealed_at = datetime.fromisoformat(item["bill"]["sealedAt"])
    assert item["bill"]["period"] == item["bill"]["belongsTo"] == str(Period.of(sealed_at))
    [attempt] = item["attempts"]
    assert (attempt["billed"], attempt["label"], attempt["deliveredOutputTokens"], attempt["unbilledTailTokens"],
            attempt["watermark"]["generatedOutputTokens"]) == (True, "final", 6, 0, 6)


def cli_env(bootstrap: str, database_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERLM_KAFKA_")}
    return {**env, "LEDGERLM_KAFKA_BOOTSTRAP": bootstrap, "LEDGERLM_DATABASE_URL": database_url}


async def cli(env: dict, *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "ledgerlm", *args, env=env,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    return proc.returncode, out.decode(), err.decode()


async def close_with_projector(env: dict, bootstrap: str, database_url: str, period: Period) -> str:
    """`billing close` while a projector applies its markers, as a running `ledgerlm project` would."""
    closing = asyncio.create_task(cli(env, "billing", "close", "--period", str(period), "--json"))
    while not closing.done():
        await project_all(bootstrap, database_url)
        await asyncio.sleep(0.2)
    code, out, err = closing.result()
    assert code == 0, err
    return out


async def test_closing_a_period_fixes_each_tenants_statement_and_the_api_and_cli_agree(
        gateway, tenants, billed, bootstrap, database_url, producer):
    headers, env = tenants["main"].headers, cli_env(bootstrap, database_url)
    late, late_events = gen(tenants["main"].tenant_id, PERIOD.end - timedelta(minutes=1))
    await emit(producer, *late_events, late.started(), late.report(1, 2))
    assert (await gateway.get(f"/v1/statements/{PERIOD}", headers=headers)).status_code == 404
    closed = json.loads(await close_with_projector(env, bootstrap, database_url, PERIOD))
    assert (closed["period"], closed["alreadyClosed"]) == (str(PERIOD), False) and closed["tenants"] >= 1
    await emit(producer, late.completed(2))  # sealed in PERIOD by its clock, after the close in the log
    await project_all(bootstrap, database_url)

    answer = await gateway.get(f"/v1/statements/{PERIOD}?lineItems=true", headers=headers)
    doc = StatementAnswer.model_validate(answer.json()).model_dump(by_alias=True, exclude_none=True)
    assert (doc["generations"], doc["lateGenerations"], doc["totals"]) == (
        4, 0, {"inputTokens": 160, "cachedInputTokens": 64, "outputTokens": 18})
    assert [(m["model"], m["generations"], m["outputTokens"]) for m in doc["models"]] == [
        ("usage-a@1", 3, 12), ("usage-b@2", 1, 6)]
    lines = "".join(json.dumps(i, sort_keys=True, separators=(",", ":")) + "\n" for i in answer.json()["lineItems"])
    assert hashlib.sha256(lines.encode()).hexdigest() == doc["lineItemsSha256"]
    assert late.generation_id not in {i["generationId"] for i in doc["lineItems"]}

    code, out, _ = await cli(env, "billing", "statement", "--tenant", tenants["main"].tenant_id, "--period",
                             str(PERIOD), "--json")
    assert code == 0 and json.loads(out) == answer.json()
    code, csv_text, _ = await cli(env, "billing", "statement", "--tenant", tenants["main"].tenant_id, "--period",
                                  str(PERIOD), "--csv")
    assert code == 0 and len(csv_text.splitlines()) == 5 and csv_text.startswith("generationId,epoch,model")
    code, text, _ = await cli(env, "billing", "statement", "--tenant", tenants["main"].tenant_id, "--period",
                              str(PERIOD))
    assert code == 0 and doc["lineItemsSha256"] in text and "usage-b@2" in text

    other = (await gateway.get(f"/v1/statements/{PERIOD}", headers=tenants["other"].headers)).json()
    assert (other["generations"], other["models"]) == (0, []) and "lineItems" not in other

    json.loads(await close_with_projector(env, bootstrap, database_url, PERIOD.next()))
    following = (await gateway.get(f"/v1/statements/{PERIOD.next()}?lineItems=true", headers=headers)).json()
    assert (following["generations"], following["lateGenerations"]) == (1, 1)
    assert following["lineItems"][0] | {"sealedAt": None} == {
        "generationId": late.generation_id, "epoch": 1, "model": "usage-a@1", "label": "final",
        "endReason": "completed", "sealedAt": None, "belongsTo": str(PERIOD), "inputTokens": 40,
        "cachedInputTokens": 16, "outputTokens": 2}
    again = await gateway.get(f"/v1/statements/{PERIOD}?lineItems=true", headers=headers)
    assert again.json() == answer.json()  # a closed statement never changes
    code, out, _ = await cli(env, "billing", "close", "--period", str(PERIOD), "--json")
    assert code == 0 and json.loads(out)["alreadyClosed"] is True


@pytest.mark.parametrize(("path", "status", "fragment"), [
    ("/v1/statements/2026-13", 400, "YYYY-MM"), ("/v1/statements/november", 400, "YYYY-MM"),
    ("/v1/statements/2999-12", 404, "not closed")])
async def test_a_statement_of_a_bad_or_open_period_is_400_or_404(gateway, tenants, path, status, fragment):
    answer = await gateway.get(path, headers=tenants["main"].headers)
    assert answer.status_code == status and fragment in answer.json()["message"]


async def test_billing_close_refuses_a_period_that_has_not_ended(bootstrap, database_url):
    code, _, err = await cli(cli_env(bootstrap, database_url), "billing", "close", "--period",
                             str(Period.of(datetime.now(UTC))))
    assert code == 2 and "has not ended" in err
    code, _, err = await cli(cli_env(bootstrap, database_url), "billing", "statement", "--tenant", "t",
                             "--period", "2026-1")
    assert code == 2 and "YYYY-MM" in err
