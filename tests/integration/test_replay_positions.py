"""Where a starting gateway's bridge begins (producers/gateway/streams/replay.py), on the real broker: at the
projections' offset, never before the replay window, and caught up only once it has read to the end."""
from __future__ import annotations

import time
import uuid

from aiokafka import TopicPartition

from plumbing.kafka.clients import make_producer, publish
from plumbing.kafka.follower import Follower
from producers.gateway.streams.replay import replay_from
from schemas.topics import GENERATIONS
from tests.factories import make_event


async def publish_three(bootstrap: str) -> tuple[str, list]:
    gen_id = f"gen_replay_{uuid.uuid4().hex[:8]}"
    producer = make_producer(bootstrap)
    await producer.start()
    try:
        metas = [await publish(producer, GENERATIONS, make_event(name, "tenant-replay", gen_id))
                 for name in ("Admitted", "AttemptStarted", "Completed")]
    finally:
        await producer.stop()
    return gen_id, metas


async def replayed(bootstrap: str, gen_id: str, start) -> tuple[list[str], bool, bool]:
    """The types the follower reads of `gen_id`, and whether it was caught up right after start / at the end."""
    seen: list[str] = []
    follower = Follower(bootstrap, [GENERATIONS], lambda _t, e: seen.append(e.type) if getattr(e, "generation_id", None) == gen_id
                        else None, start=start, client_id="test-replay")
    await follower.start()
    try:
        at_start = follower.caught_up.is_set()
        await follower.catch_up()
        return seen, at_start, follower.caught_up.is_set()
    finally:
        await follower.stop()


async def test_the_bridge_starts_at_the_projected_offset_and_is_caught_up_only_after_reading_to_the_end(
        bootstrap, topics):
    gen_id, metas = await publish_three(bootstrap)
    partition = metas[0].partition
    assert {m.partition for m in metas} == {partition}

    async def projected(topics_asked):
        assert topics_asked == [GENERATIONS]
        return {(GENERATIONS, partition): metas[1].offset}  # the projections applied the Admitted only

    seen, at_start, at_end = await replayed(bootstrap, gen_id, replay_from(projected, max_age_s=3600))
    assert seen == ["AttemptStarted", "Completed"]
    assert (at_start, at_end) == (False, True)


async def test_no_projected_offset_replays_the_window_and_nothing_older(bootstrap, topics):
    gen_id, _ = await publish_three(bootstrap)

    async def nothing_projected(_topics):
        return {}

    seen, _, _ = await replayed(bootstrap, gen_id, replay_from(nothing_projected, max_age_s=3600))
    assert seen == ["Admitted", "AttemptStarted", "Completed"]
    later = replay_from(nothing_projected, max_age_s=60, clock=lambda: time.time() + 3600)  # window after them
    seen, at_start, _ = await replayed(bootstrap, gen_id, later)
    assert seen == [] and at_start is True


async def test_a_projected_offset_the_log_no_longer_holds_starts_at_the_first_retained(bootstrap, topics):
    gen_id, metas = await publish_three(bootstrap)
    tp = TopicPartition(GENERATIONS, metas[0].partition)

    async def behind_retention(_topics):
        return {(tp.topic, tp.partition): -5}

    seen, _, _ = await replayed(bootstrap, gen_id, replay_from(behind_retention, max_age_s=3600))
    assert seen == ["Admitted", "AttemptStarted", "Completed"]
