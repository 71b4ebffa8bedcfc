"""Gateways share the token stream (issue 16): each reads its share of the partitions, and any of them serves
any stream, resume and disconnect grace. Real gateway processes (one group per test), the session's controller
and worker; the projector does not run, so nothing is served from the projections unless the test says so."""
from __future__ import annotations

import asyncio
import json
import uuid
from contextlib import asynccontextmanager

import httpx

from plumbing.kafka.follower import partition_for
from schemas.topics import TOKENS, spec
from tests.controlplane.conftest import Process, body, free_port, start_gateway_process
from tests.waiting import wait_until

PARTITIONS = spec(TOKENS).partitions


class Member:
    def __init__(self, process: Process, url: str) -> None:
        self.process, self.url = process, url
        self.client = httpx.AsyncClient(base_url=url, timeout=60)

    async def bridge(self) -> dict:
        return (await self.client.get("/healthz")).json()["bridge"]


@asynccontextmanager
async def gateways(cp_env: dict, tmp_path, count: int = 2, **env):
    """`count` gateway processes in one group, yielded once their shares split every partition between them."""
    env = {**cp_env, "LEDGERLM_GATEWAY_GROUP": f"share-{uuid.uuid4().hex[:8]}",
           **{f"LEDGERLM_{k.upper()}": str(v) for k, v in env.items()}}
    members: list[Member] = []
    try:
        for i in range(count):
            port = free_port()
            process = await start_gateway_process(env, tmp_path / f"gateway-{i}.log", port)
            members.append(Member(process, f"http://127.0.0.1:{port}"))
        await shares_settle(members)
        yield members
    finally:
        for member in members:
            await member.client.aclose()
            member.process.stop()


async def shares_settle(members: list[Member], timeout_s: float = 60) -> list[list[int]]:
    async def shares() -> list[list[int]]:
        return [(await m.bridge())["ownedPartitions"] for m in members]

    def settled(shares: list[list[int]]) -> bool:
        return sorted(p for share in shares for p in share) == list(range(PARTITIONS)) and all(shares)

    return await wait_until(shares, timeout_s, step_s=0.2, accept=settled,
                            what=lambda shares: f"the shares to settle: {shares}")


async def owner_of(members: list[Member], gen_id: str) -> tuple[Member, Member]:
    """(the gateway owning the generation's partition, another one)."""
    partition = partition_for(gen_id, PARTITIONS)
    shares = await shares_settle(members)
    owner = next(m for m, share in zip(members, shares) if partition in share)
    return owner, next(m for m in members if m is not owner)


async def read_events(member: Member, gen_id: str, headers: dict, stop_after_tokens: int | None = None,
                      after: int | None = None) -> list[tuple[str, dict]]:
    """The SSE events of one GET as (event, data); hangs up after `stop_after_tokens` token events."""
    events, block = [], {}
    if after is not None:
        headers = {**headers, "Last-Event-ID": str(after)}
    async with member.client.stream("GET", f"/v1/generations/{gen_id}/events", headers=headers) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if line:
                key, _, value = line.partition(": ")
                block[key] = value
            elif block:
                events.append((block["event"], json.loads(block["data"])))
                block = {}
                tokens = sum(1 for kind, _ in events if kind == "token")
                if stop_after_tokens is not None and tokens >= stop_after_tokens:
                    break
    return events


def seqs(events) -> list[int]:
    return [data["seq"] for kind, data in events if kind == "token"]


async def create(member: Member, tenant, model: str, tokens: int, **fields) -> str:
    created = await member.client.post("/v1/generations", headers=tenant.headers,
                                       json=body(model=model, maxOutputTokens=tokens, **fields))
    assert created.status_code == 201, created.text
    return created.json()["id"]


async def test_two_gateways_split_the_partitions_and_a_stream_on_the_non_owner_is_served_whole(
        cp_env, controller, worker, tenants, versions, tmp_path):
    tenant = tenants["main"]
    async with gateways(cp_env, tmp_path) as members:
        shares = await shares_settle(members)
        assert not set(shares[0]) & set(shares[1])
        for _ in range(2):
            gen_id = await create(members[0], tenant, versions["served"], 40)
            owner, other = await owner_of(members, gen_id)
            events = await read_events(other, gen_id, tenant.headers)
            assert seqs(events) == list(range(1, 41))
            assert events[-1][0] == "final" and events[-1][1]["seq"] == 41
            assert events[-1][1]["usage"]["outputTokens"] == 40
            status = await other.client.get(f"/v1/generations/{gen_id}", headers=tenant.headers)
            assert status.status_code == 200 and status.json()["status"] == "completed"
        other_bridge, owner_bridge = await other.bridge(), await owner.bridge()
        assert partition_for(gen_id, PARTITIONS) in other_bridge["guestPartitions"]
        # Each decoded only what it needed: nobody watched on the owner, so it skipped the tokens there.
        assert owner_bridge["recordsSkipped"] >= 40


async def test_an_id_is_minted_into_the_admitting_gateways_share_so_its_stream_needs_no_guest_read(
        cp_env, controller, worker, paced_worker, tenants, versions, tmp_path):
    tenant = tenants["main"]
    async with gateways(cp_env, tmp_path) as members:
        shares = await shares_settle(members)
        for member, share in zip(members, shares):
            created = [await create(member, tenant, versions["served"], 3) for _ in range(8)]
            # By chance all 8 of a half share: 1 in 256 per gateway.
            assert [partition_for(gen_id, PARTITIONS) in share for gen_id in created] == [True] * 8
        await pacing_becomes(members, {"idle", "quiet"})  # nobody watches: batches, or long polls once nothing comes
        gen_id = await create(members[1], tenant, versions["paced"], 400)
        watcher = asyncio.create_task(read_events(members[1], gen_id, tenant.headers))
        await pacing_becomes(members[1:], {"live", "busy"}, while_running=watcher)
        events = await asyncio.wait_for(watcher, 120)
        assert seqs(events) == list(range(1, 401)) and events[-1][0] == "final"
        assert (await members[1].bridge())["guestPartitions"] == []
        await pacing_becomes(members, {"idle", "quiet"})


async def pacing_becomes(members: list[Member], pacing: set[str], while_running: asyncio.Task | None = None,
                         timeout_s: float = 30) -> None:
    async def became() -> bool:
        if all([(await m.bridge())["pacing"] in pacing for m in members]):
            return True
        assert while_running is None or not while_running.done(), "the stream ended before the pacing changed"
        return False

    await wait_until(became, timeout_s, step_s=0.1, what=f"the pacing to become {pacing}")


async def test_streams_and_resumes_go_on_without_gap_or_repeat_when_the_owner_leaves(
        cp_env, controller, worker, tenants, versions, tmp_path):
    tenant = tenants["main"]
    async with gateways(cp_env, tmp_path) as members:
        gen_id = await create(members[0], tenant, versions["served"], 300)
        owner, other = await owner_of(members, gen_id)
        head = await read_events(owner, gen_id, tenant.headers, stop_after_tokens=5)
        held = seqs(head)[-1]
        watcher = asyncio.create_task(read_events(other, gen_id, tenant.headers))  # a guest there, until the move
        await asyncio.sleep(0)  # (its request goes out before the owner leaves)
        owner.process.stop()  # leaves the group: its partitions move to the other gateway
        members.remove(owner)
        await shares_settle(members)
        resumed = await read_events(other, gen_id, tenant.headers, after=held)
        whole = await asyncio.wait_for(watcher, 120)
    assert seqs(head)[:5] == [1, 2, 3, 4, 5] and seqs(head) == list(range(1, held + 1))
    assert seqs(resumed) == list(range(held + 1, 301)) and resumed[-1][0] == "final"
    assert seqs(whole) == list(range(1, 301)) and whole[-1][0] == "final" and whole[-1][1]["seq"] == 301


async def standin_generation(producer, settings, tenant, tokens: int = 3) -> str:
    """An interactive generation no worker runs (it stays open as long as the test needs): its `Admitted` and
    first tokens, published as the controller and a worker would."""
    from plumbing.kafka.clients import publish
    from schemas.generation_ids import mint_generation_id
    from schemas.topics import GENERATIONS
    from tests.factories import make_event

    gen_id = mint_generation_id(settings.generation_id_key(), tenant.tenant_id)
    await publish(producer, GENERATIONS, make_event("Admitted", tenant.tenant_id, gen_id))
    for seq in range(1, tokens + 1):
        event = make_event("TokensEmitted", tenant.tenant_id, gen_id).model_copy(
            update={"seq": seq, "token_count": seq * 2})
        await publish(producer, TOKENS, event)
    return gen_id


def cancels(member: Member, gen_id: str) -> int:
    return member.process.log.read_text(errors="replace").count(f"canceled after disconnect generation={gen_id}")


async def test_a_client_that_reconnects_to_another_gateway_keeps_its_generation_past_the_grace(
        cp_env, cp_settings, controller, tenants, tmp_path, producer):
    """The grace counts watchers on every gateway: a client that left A and reconnected to B keeps its generation
    however long it watches there; when it leaves B too, B (where it left last) cancels it, and A never does."""
    tenant = tenants["main"]
    async with gateways(cp_env, tmp_path, disconnect_grace_s=3.0) as (a, b):
        kept = await standin_generation(producer, cp_settings, tenant)
        control = await standin_generation(producer, cp_settings, tenant)
        assert seqs(await read_events(a, kept, tenant.headers, stop_after_tokens=2)) == [1, 2]
        watching = asyncio.create_task(read_events(b, kept, tenant.headers, after=2))  # reconnected to B
        assert seqs(await read_events(a, control, tenant.headers, stop_after_tokens=2)) == [1, 2]
        # The control generation left A after `kept` did and nobody came back: A cancels it after the grace.
        await wait_until(lambda: cancels(a, control), 30, step_s=0.1,
                         what="A to cancel the unwatched control generation")
        assert cancels(a, kept) == 0 and cancels(b, kept) == 0 and not watching.done()
        watching.cancel()  # the client leaves B as well: B decides
        await asyncio.gather(watching, return_exceptions=True)
        await wait_until(lambda: cancels(b, kept), 30, step_s=0.1,
                         what="B to cancel the generation nobody watches any more")
        assert cancels(a, kept) == 0 and cancels(b, control) == 0
