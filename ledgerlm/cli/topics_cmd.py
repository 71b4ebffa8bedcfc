"""`ledgerlm topics ensure [--json]`: create or verify every declared topic, report drift (exit 1)."""
from __future__ import annotations

import argparse
import asyncio
import json

from ledgerlm.cli.endpoints import kafka_access
from plumbing.settings import Settings


def register(subparsers: argparse._SubParsersAction) -> None:
    topics = subparsers.add_parser("topics", help="Kafka topics of the registry").add_subparsers(
        dest="action", required=True)
    ensure = topics.add_parser("ensure", help="create missing topics, verify existing ones, report drift")
    ensure.add_argument("--json", action="store_true")
    ensure.set_defaults(handler=run_ensure)


def run_ensure(args: argparse.Namespace) -> int:
    from plumbing.kafka.topic_admin import TopicAdmin

    from infra.services import LocalServices

    settings = Settings()
    kafka = kafka_access(settings)
    # A local cluster's size comes from what `infra up` started, so a broker that is down right now does not
    # shrink the expected replication factor; an external cluster is asked for its live brokers.
    brokers = LocalServices(settings).local_brokers()
    replication = settings.topic_replication_factor or (min(3, brokers) if brokers else None)

    async def ensure():
        async with TopicAdmin(kafka, settings.topic_partitions, replication) as admin:
            return await admin.ensure()

    report = asyncio.run(ensure())
    if args.json:
        print(json.dumps(report.as_dict()))
    else:
        print(f"created {len(report.created)}: {', '.join(report.created) or '-'}")
        print(f"verified {len(report.verified)}")
        for d in report.drift:
            print(f"DRIFT {d.topic} {d.setting}: expected {d.expected}, found {d.actual}")
    return 1 if report.drift else 0
