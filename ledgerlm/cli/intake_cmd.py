"""`ledgerlm intake`: tenants' Kafka requests in, their results out (producers/intake, projections/results*)."""
from __future__ import annotations

import argparse
import socket

from ledgerlm.cli.endpoints import service_kafka_access
from ledgerlm.cli.errors import CliError
from plumbing.settings import Settings


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("intake", help="consume llm.requests.<tenant>, publish llm.results.<tenant>")
    parser.add_argument("--instance-id", help="stable id of this instance: its transactional ids derive from it, "
                                              "so a restarted instance fences its predecessor's open transaction "
                                              "(default: intake-<host>-<index>)")
    parser.add_argument("--index", type=int, default=0,
                        help="this instance's number on its host, when several run there (default 0)")
    parser.add_argument("--tenant", action="append", dest="tenants", metavar="TENANT",
                        help="consume only this tenant's intake topic (repeatable; default: every tenant's)")
    parser.add_argument("--no-results", action="store_true", help="run the intake only, not a results publisher")
    parser.add_argument("--no-intake", action="store_true", help="run the results publisher only")
    parser.set_defaults(handler=run)


def default_instance_id(index: int = 0) -> str:
    """The same on every start of the same instance: a random id would leave a killed instance's transaction
    open until it times out, instead of being fenced by its successor."""
    return f"intake-{socket.gethostname()}-{index}"


async def run_roles(settings: Settings, kafka, instance_id: str, intake: bool = True, results: bool = True,
                    results_kafka=None, tenants: list[str] | None = None) -> None:
    import asyncio

    from plumbing.telemetry.server import RoleServer
    from producers.intake.metrics import intake_readiness, intake_registry
    from producers.intake.runtime import Intake
    from projections.results_publisher import ResultsPublisher

    from schemas.intake import intake_pattern

    role = Intake(settings, kafka, instance_id, pattern=intake_pattern(tenants)) if intake else None
    publisher = ResultsPublisher(settings, results_kafka or kafka, f"{instance_id}-results") if results else None
    tasks = [asyncio.create_task(r.run(), name=name) for name, r in (("intake", role), ("results", publisher)) if r]
    http = RoleServer("intake", intake_registry(role, publisher), lambda: intake_readiness(role, publisher),
                      settings.metrics_host, settings.intake_metrics_port)
    await http.start()
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            task.result()  # a role that stopped on its own stops the process, with its error
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await http.stop()


def run(args: argparse.Namespace) -> int:
    from ledgerlm.cli.roles import configure_logging, serve

    if args.no_intake and args.no_results:
        raise CliError("--no-intake and --no-results together leave nothing to run")
    configure_logging("intake")
    settings = Settings()
    instance_id = args.instance_id or default_instance_id(args.index)
    # Tenants' topics are out of PLAINTEXT's reach on a broker with ACLs: the intake reads them as the gateway
    # does its work, the results publisher writes them as a projection (infra/kafka_acls.py).
    return serve(run_roles(settings, service_kafka_access(settings, "gateway"), instance_id, not args.no_intake,
                           not args.no_results, service_kafka_access(settings, "projector"), args.tenants))
