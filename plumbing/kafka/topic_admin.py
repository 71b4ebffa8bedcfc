"""`topics ensure`: create the declared topics, verify existing ones, report drift.

The replication factor is the configured one, or min(3, brokers the cluster
describes): a three-broker cluster gets RF 3 and `min.insync.replicas` 2 on the
control and billing topics, a single node RF 1.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass

from aiokafka.admin import NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import TopicAlreadyExistsError, for_code

from plumbing.kafka.clients import Kafka, make_admin
from schemas.topics import TOPICS, TopicSpec


@dataclass(frozen=True)
class Drift:
    topic: str
    setting: str
    expected: str
    actual: str


@dataclass(frozen=True)
class EnsureReport:
    created: tuple[str, ...]
    verified: tuple[str, ...]
    drift: tuple[Drift, ...]

    def as_dict(self) -> dict[str, object]:
        return {"created": list(self.created), "verified": list(self.verified),
                "drift": [d.__dict__ for d in self.drift]}


class TopicAdmin:
    def __init__(self, kafka: Kafka, partitions: int | None = None, replication_factor: int | None = None) -> None:
        self.admin = make_admin(kafka)
        self.partitions = partitions
        self.replication_factor = replication_factor or 1
        self._replication_configured = replication_factor is not None

    async def __aenter__(self) -> "TopicAdmin":
        await self.admin.start()
        if not self._replication_configured:
            brokers = (await self.admin.describe_cluster())["brokers"]
            self.replication_factor = min(3, max(1, len(brokers)))
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.admin.close()

    def _partitions(self, spec: TopicSpec) -> int:
        return self.partitions or spec.partitions

    async def ensure(self, specs: tuple[TopicSpec, ...] = TOPICS) -> EnsureReport:
        existing = set(await self.admin.list_topics())
        missing = [s for s in specs if s.name not in existing]
        if missing:
            response = await self.admin.create_topics([
                NewTopic(s.name, self._partitions(s), self.replication_factor,
                         topic_configs=s.configs(self.replication_factor))
                for s in missing
            ])
            # The metadata listed above can lag a creation that just happened: those topics exist, verify them.
            existing |= self._already_existing(response.topic_errors)
            # Brokers learn of new topics asynchronously: return once every declared topic shows its
            # partitions, so what runs next (a producer, a second `ensure`, the drift check) finds them whole.
            await self._await_metadata(specs)
            missing = [s for s in missing if s.name not in existing]
        present = [s for s in specs if s.name in existing]
        drift = await self.drift(present) if present else ()
        return EnsureReport(tuple(s.name for s in missing), tuple(s.name for s in present), tuple(drift))

    async def _await_metadata(self, specs: tuple[TopicSpec, ...], timeout_s: float = 15.0) -> None:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            layout = await self._layout([s.name for s in specs])
            if all(layout.get(s.name, (0, None))[0] > 0 for s in specs):
                return
            if asyncio.get_running_loop().time() > deadline:
                raise RuntimeError(f"topics without partitions in the metadata after {timeout_s:.0f}s")
            await asyncio.sleep(0.1)

    @staticmethod
    def _already_existing(topic_errors) -> set[str]:
        """Topics a CreateTopics answer says exist already; any other refusal is an error."""
        already = set()
        for topic, code, *_ in topic_errors:
            if code == TopicAlreadyExistsError.errno:
                already.add(topic)
            elif code:
                raise RuntimeError(f"creating topic {topic} failed: {for_code(code).__name__}")
        return already

    async def drift(self, specs: list[TopicSpec]) -> list[Drift]:
        found: list[Drift] = []
        layout = await self._layout([s.name for s in specs])
        for s in specs:
            partitions, replicas = layout.get(s.name, (None, None))
            if partitions != self._partitions(s):
                found.append(Drift(s.name, "partitions", str(self._partitions(s)), str(partitions)))
            if replicas != self.replication_factor:
                found.append(Drift(s.name, "replication.factor", str(self.replication_factor), str(replicas)))
        actual_configs = await self._configs([s.name for s in specs])
        for s in specs:
            for key, want in s.configs(self.replication_factor).items():
                have = actual_configs.get(s.name, {}).get(key)
                if have != want:
                    found.append(Drift(s.name, key, want, str(have)))
        return found

    async def _layout(self, names: list[str]) -> dict[str, tuple[int, int | None]]:
        """topic -> (partitions, replicas of its smallest partition)."""
        described = await self.admin.describe_topics(names)
        return {t["topic"]: (len(t["partitions"]), min((len(p["replicas"]) for p in t["partitions"]), default=None))
                for t in described}

    async def _configs(self, names: list[str]) -> dict[str, dict[str, str]]:
        responses = await self.admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, name) for name in names])
        configs: dict[str, dict[str, str]] = {}
        for response in responses:
            for resource in response.resources:
                # (error_code, error_message, resource_type, resource_name, config_entries)
                name, entries = resource[3], resource[4]
                configs[name] = {entry[0]: entry[1] for entry in entries}
        return configs

    async def alter(self, topic: str, configs: dict[str, str]) -> None:
        await self.admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic, configs)])

    async def delete(self, names: list[str]) -> None:
        await self.admin.delete_topics(names)
