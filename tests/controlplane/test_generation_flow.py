"""Gateway -> controller -> worker over the real broker: admission answers, streams, cancel, tenancy."""
from __future__ import annotations

import time

from tests.controlplane.conftest import body, parse_sse, post_until_admitted, read_topic
from tests.waiting import wait_until


async def test_stream_runs_to_the_end_with_ordered_seqs_and_terminal_before_final(
        gateway, worker, tenants, versions, bootstrap):
    since_ms = int(time.time() * 1000) - 1000
    tenant = tenants["main"]
    response = await gateway.post("/v1/generations", headers=tenant.headers,
                                  json=body(model=versions["served"], maxOutputTokens=10, stream=True))
    assert response.status_code == 201, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    events = parse_sse(response.text)
    kinds = [kind for kind, _ in events]
    assert kinds == ["generation"] + ["token"] * 10 + ["final"]
    first, tokens, final = events[0][1], [e for k, e in events if k == "token"], events[-1][1]
    gen_id = first["id"]
    assert first["status"] == "admitted" and first["created"] is True
    assert [t["seq"] for t in tokens] == list(range(1, 11))
    assert {t["epoch"] for t in tokens} == {1}
    assert final["reason"] == "output-limit" and final["seq"] == 11 and final["usageLabel"] == "final"
    assert final["usage"] == {"inputTokens": first["inputTokens"], "cachedInputTokens": 0, "outputTokens": 10}

    lifecycle = await read_topic(bootstrap, "llm.generations", since_ms, lambda e: e.generation_id == gen_id)
    types = [e.type for e in lifecycle]
    assert types[:2] == ["Admitted", "AttemptStarted"] and types[-1] == "Completed"
    assert types.count("Completed") == 1
    watermarks = [e for e in lifecycle if e.type == "UsageReported"]
    assert [w.report_seq for w in watermarks] == list(range(1, len(watermarks) + 1))
    assert watermarks[-1].usage.generated_output_tokens == 10
    assert lifecycle[-1].finish_reason == "length" and lifecycle[-1].usage.generated_output_tokens == 10
    assert lifecycle[-1].epoch == 1 and lifecycle[1].worker_id == worker.worker_id


async def test_wait_returns_text_and_usage(gateway, worker, tenants, versions):
    response = await gateway.post("/v1/generations?wait=true", headers=tenants["main"].headers,
                                  json=body(model=versions["served"], maxOutputTokens=6))
    assert response.status_code == 201
    done = response.json()
    view = gateway.gateway.bridge.view(done["id"])
    assert done["status"] == "completed" and done["reason"] == "output-limit"
    assert done["usage"]["outputTokens"] == 6
    assert done["text"] == "".join(t.text_delta for t in view.tokens) and len(view.tokens) == 6
    replay = parse_sse((await gateway.get(f"/v1/generations/{done['id']}/events",
                                          headers=tenants["main"].headers)).text)
    assert [k for k, _ in replay] == ["generation"] + ["token"] * 6 + ["final"]
    assert "".join(e["text"] for k, e in replay if k == "token") == done["text"]
    assert replay[-1][1]["usage"] == done["usage"]


async def test_same_request_is_the_same_generation_and_a_changed_one_conflicts(gateway, worker, tenants, versions):
    headers = tenants["main"].headers
    original = body(model=versions["served"], maxOutputTokens=4)
    first = await gateway.post("/v1/generations", headers=headers, json=original)
    again = await gateway.post("/v1/generations", headers=headers, json=original)
    changed = await gateway.post("/v1/generations", headers=headers, json={**original, "maxOutputTokens": 5})
    assert (first.status_code, again.status_code, changed.status_code) == (201, 200, 409)
    assert again.json()["id"] == first.json()["id"] and again.json()["created"] is False
    assert changed.json()["code"] == "request_id_conflict"
    assert changed.json()["details"] == {"requestId": original["requestId"], "generationId": first.json()["id"]}


async def test_tenant_budget_429_with_jittered_retry_after_then_admitted_after_the_end(
        gateway, worker, tenants, versions):
    headers = tenants["single"].headers  # max_concurrency = 1
    first = await gateway.post("/v1/generations", headers=headers, json=body(model=versions["served"],
                                                                            maxOutputTokens=200))
    refused = await gateway.post("/v1/generations", headers=headers, json=body(model=versions["served"]))
    assert first.status_code == 201
    assert refused.status_code == 429
    error = refused.json()
    assert set(error) == {"code", "message", "details"} and error["code"] == "concurrency"
    assert 1000 <= error["details"]["retryAfterMs"] <= 1500
    assert refused.headers["Retry-After"] == "2" if error["details"]["retryAfterMs"] > 1000 else "1"
    bridge = gateway.gateway.bridge
    await wait_until(lambda: (v := bridge.view(first.json()["id"])) and v.final, 20, what="first generation end")
    # The worker's ReleaseReservation follows its final stream event; until the controller applied it, 429.
    statuses = []

    async def retry():
        response = await gateway.post("/v1/generations", headers=headers, json=body(model=versions["served"]))
        statuses.append(response.status_code)
        return response

    await wait_until(retry, 15, step_s=0.1, accept=lambda r: r.status_code != 429,
                     what=lambda _: f"the release applied (answers {statuses})")
    assert statuses[-1] == 201 and set(statuses[:-1]) <= {429}


async def test_no_ready_worker_for_the_version_is_503(gateway, controller, tenants, versions):
    response = await gateway.post("/v1/generations", headers=tenants["main"].headers,
                                  json=body(model=versions["idle"]))
    assert response.status_code == 503
    assert response.json()["code"] == "no_capacity" and response.headers["Retry-After"] in ("1", "2")


async def test_edges_unknown_model_invalid_body_and_missing_key(gateway, controller, tenants, versions):
    headers = tenants["main"].headers
    unknown = await gateway.post("/v1/generations", headers=headers, json=body(model="nope@9"))
    invalid = await gateway.post("/v1/generations", headers=headers,
                                 json=body(model=versions["served"], maxOutputTokens=0))
    too_long = await gateway.post("/v1/generations", headers=headers,
                                  json=body(model=versions["served"], maxOutputTokens=600))
    both = await gateway.post("/v1/generations", headers=headers,
                              json=body(model=versions["served"], messages=[{"role": "user", "content": "x"}]))
    anonymous = await gateway.post("/v1/generations", json=body(model=versions["served"]))
    assert (unknown.status_code, unknown.json()["code"]) == (404, "unknown_model")
    assert (invalid.status_code, invalid.json()["details"]["fields"]) == (400, ["maxOutputTokens"])
    assert (too_long.status_code, too_long.json()["code"]) == (400, "context_length_exceeded")
    assert too_long.json()["details"]["limit"] == 512
    assert both.status_code == 400 and "exactly one of 'input' or 'messages'" in both.json()["message"]
    assert (anonymous.status_code, anonymous.json()["code"]) == (401, "unauthorized")


async def test_cancel_after_first_tokens_frees_blocks_and_bills_generated_tokens(
        gateway, paced_worker, tenants, versions, bootstrap):
    since_ms = int(time.time() * 1000) - 1000
    headers, worker = tenants["main"].headers, paced_worker
    created = await post_until_admitted(gateway, "/v1/generations", headers=headers,
                                        json=body(model=versions["paced"], maxOutputTokens=480))
    gen_id = created.json()["id"]
    bridge = gateway.gateway.bridge
    await wait_until(lambda: (v := bridge.view(gen_id)) and len(v.tokens) >= 2, 20, what="first tokens")
    canceled = await gateway.post(f"/v1/generations/{gen_id}/cancel", headers=headers)
    assert canceled.status_code == 202 and canceled.json()["status"] == "canceling"
    view = await wait_until(lambda: (v := bridge.view(gen_id)) and v.final and v, 20, what="canceled end")
    assert view.final.reason == "canceled" and view.status == "canceled"
    streamed = len(view.tokens)
    assert 2 <= streamed < 480
    assert view.final.usage.generated_output_tokens == streamed
    await wait_until(lambda: not worker.attempts, 5, what="attempt released")
    assert worker.free_blocks == worker.total_blocks
    assert worker.engine.stats().num_blocks_used == 0
    again = await gateway.post(f"/v1/generations/{gen_id}/cancel", headers=headers)
    assert (again.status_code, again.json()["status"]) == (200, "canceled")
    lifecycle = await read_topic(bootstrap, "llm.generations", since_ms, lambda e: e.generation_id == gen_id)
    types = [e.type for e in lifecycle]
    assert types.count("CancelRequested") == 1 and types[-1] == "Canceled"
    assert lifecycle[-1].usage.generated_output_tokens == streamed


async def test_another_tenant_can_neither_read_nor_cancel(gateway, worker, tenants, versions):
    owner, other = tenants["main"].headers, tenants["other"].headers
    created = await gateway.post("/v1/generations?wait=true", headers=owner,
                                 json=body(model=versions["served"], maxOutputTokens=3))
    gen_id = created.json()["id"]
    assert (await gateway.get(f"/v1/generations/{gen_id}", headers=owner)).json()["status"] == "completed"
    read = await gateway.get(f"/v1/generations/{gen_id}", headers=other)
    cancel = await gateway.post(f"/v1/generations/{gen_id}/cancel", headers=other)
    events = await gateway.get(f"/v1/generations/{gen_id}/events", headers=other)
    assert [r.status_code for r in (read, cancel, events)] == [404, 404, 404]
    assert read.json() == {"code": "not_found", "message": "no such generation", "details": {"generationId": gen_id}}


async def test_coalesced_stream_events_carry_every_token_once_in_order(gateway, start_worker, controller, tenants,
                                                                        versions):
    await start_worker("coalesced", stream_flush_ms=40)
    done = (await post_until_admitted(gateway, "/v1/generations?wait=true", headers=tenants["main"].headers,
                                      json=body(model=versions["coalesced"], maxOutputTokens=60))).json()
    view = gateway.gateway.bridge.view(done["id"])
    events = view.tokens
    assert [e.seq for e in events] == list(range(1, len(events) + 1)) and view.final.seq == len(events) + 1
    assert sum(len(e.token_ids) for e in events) == 60 and events[-1].token_count == 60
    assert [e.token_count for e in events] == sorted({e.token_count for e in events})
    assert len(events[0].token_ids) == 1  # the first token is not held back
    assert "".join(e.text_delta for e in events) == done["text"] and done["usage"]["outputTokens"] == 60
