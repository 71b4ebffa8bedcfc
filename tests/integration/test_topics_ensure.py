"""`topics ensure` against the real broker: creates the declared configs, detects drift."""
import uuid

from plumbing.kafka.topic_admin import Drift, TopicAdmin
from schemas.topics import TOPICS, TopicSpec
from tests.waiting import wait_until


def specs_for_test() -> tuple[TopicSpec, ...]:
    suffix = uuid.uuid4().hex[:8]
    return (
        TopicSpec(f"test.log-{suffix}", "generation_id", (), "delete", 3_600_000, partitions=3),
        TopicSpec(f"test.registry-{suffix}", "worker_id", (), "compact", partitions=2),
    )


async def test_creates_declared_topics_then_verifies_them(bootstrap, topics):
    specs = specs_for_test()
    async with TopicAdmin(bootstrap) as admin:
        try:
            first = await admin.ensure(specs)
            second = await admin.ensure(specs)
            configs = await admin._configs([s.name for s in specs])
            layout = await admin._layout([s.name for s in specs])
        finally:
            await admin.delete([s.name for s in specs])
    assert first.created == tuple(s.name for s in specs) and first.drift == ()
    assert second.created == () and second.verified == tuple(s.name for s in specs) and second.drift == ()
    assert configs[specs[0].name]["cleanup.policy"] == "delete"
    assert configs[specs[0].name]["retention.ms"] == "3600000"
    assert configs[specs[1].name]["cleanup.policy"] == "compact"
    assert layout == {specs[0].name: (3, 1), specs[1].name: (2, 1)}  # one broker: RF 1


async def test_detects_config_and_partition_drift(bootstrap, topics):
    specs = specs_for_test()
    async with TopicAdmin(bootstrap) as admin:
        try:
            await admin.ensure(specs)
            await admin.alter(specs[0].name, {"cleanup.policy": "delete", "retention.ms": "1000"})
            widened = (TopicSpec(specs[1].name, "worker_id", (), "compact", partitions=4),)
            # an altered config reaches describe_configs after the controller applies it
            drift = await wait_until(lambda: admin.drift(list(specs[:1]) + list(widened)), 15, step_s=0.2,
                                     accept=lambda drift: len(drift) == 2, what=lambda drift: f"both drifts: {drift}")
        finally:
            await admin.delete([s.name for s in specs])
    assert Drift(specs[0].name, "retention.ms", "3600000", "1000") in drift
    assert Drift(specs[1].name, "partitions", "4", "2") in drift
    assert len(drift) == 2


async def test_the_registry_topics_exist_without_drift(bootstrap, topics, settings):
    async with TopicAdmin(bootstrap, settings.topic_partitions, settings.topic_replication_factor) as admin:
        report = await admin.ensure()
    assert report.created == ()
    assert set(report.verified) == {t.name for t in TOPICS}
    assert report.drift == ()
