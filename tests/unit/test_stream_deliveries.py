"""A watermark waits for the stream events before it (consumers/worker/reports.py), in order, and is dropped
when one of them is not delivered."""
from __future__ import annotations

import asyncio

import pytest
from aiokafka.errors import KafkaTimeoutError

from consumers.worker.reports import StreamDeliveries


def sender(sent: list[str], name: str):
    async def send() -> None:
        sent.append(name)
    return send


async def test_a_watermark_goes_at_once_when_its_stream_events_are_acknowledged():
    deliveries, sent, tasks = StreamDeliveries(), [], set()
    acked = asyncio.get_running_loop().create_future()
    acked.set_result(None)
    deliveries.add(acked)
    await deliveries.report(sender(sent, "w1"), tasks)
    assert sent == ["w1"] and not tasks


async def test_watermarks_wait_for_their_events_and_go_out_in_the_order_they_were_made():
    loop = asyncio.get_running_loop()
    deliveries, sent, tasks = StreamDeliveries(), [], set()
    first, second = loop.create_future(), loop.create_future()
    deliveries.add(first)
    await deliveries.report(sender(sent, "w1"), tasks)
    deliveries.add(second)
    await deliveries.report(sender(sent, "w2"), tasks)
    await asyncio.sleep(0)
    assert sent == [] and len(tasks) == 2
    second.set_result(None)  # the later event acknowledged first: w2 still waits for w1
    await asyncio.sleep(0)
    assert sent == []
    first.set_result(None)
    await deliveries.settled()
    assert sent == ["w1", "w2"] and not tasks


async def test_a_watermark_over_an_undelivered_event_is_never_sent_and_the_end_sees_the_failure():
    loop = asyncio.get_running_loop()
    deliveries, sent, tasks = StreamDeliveries(), [], set()
    lost = loop.create_future()
    deliveries.add(lost)
    await deliveries.report(sender(sent, "w1"), tasks)
    lost.set_exception(KafkaTimeoutError())
    later = loop.create_future()
    later.set_result(None)
    deliveries.add(later)  # a failed delivery stays counted until the end
    await deliveries.report(sender(sent, "w2"), tasks)
    with pytest.raises(KafkaTimeoutError):
        await deliveries.settled()
    await asyncio.gather(*tasks)
    assert sent == []
