"""`ledgerlm intake`: tenants' Kafka requests in, their results out (producers/intake, projections/results*)."""
from __future__ import annotations

import argparse

from ledgerlm.cli.endpoints import kafka_access
from plumbing.settings import Settings


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("intake", help="consume llm.requests.<tenant>, publish llm.results.<tenant>")
    parser.add_argument("--instance-id", help="stable id of this instance (its transactional ids derive from it, "
                                              "so a restarted instance fences its predecessor); random when unset")
    parser.add_argument("--no-results", action="store_true", help="run the intake only, not a results publisher")
    parser.set_defaults(handler=run)


async def run_roles(settings: Settings, kafka, instance_id: str | None, results: bool) -> None:
    import asyncio

    from producers.intake.runtime import Intake
    from projections.results_publisher import ResultsPublisher

    tasks = [asyncio.create_task(Intake(settings, kafka, instance_id).run(), name="intake")]
    if results:
        publisher_id = f"{instance_id}-results" if instance_id else None
        tasks.append(asyncio.create_task(ResultsPublisher(settings, kafka, publisher_id).run(), name="results"))
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            task.result()  # a role that stopped on its own stops the process, with its error
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def run(args: argparse.Namespace) -> int:
    from ledgerlm.cli.roles import configure_logging, serve

    configure_logging("intake")
    settings = Settings()
    return serve(run_roles(settings, kafka_access(settings), args.instance_id, not args.no_results))
