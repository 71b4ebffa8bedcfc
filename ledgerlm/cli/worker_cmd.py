"""`ledgerlm worker --model-version NAME` and `ledgerlm workers drain ID`."""
from __future__ import annotations

import argparse
import asyncio
import logging
import os

from plumbing.kafka.access import KafkaAccess
from ledgerlm.cli.endpoints import kafka_access
from ledgerlm.cli.errors import CliError
from plumbing.compute_threads import passive_compute_threads
from plumbing.settings import Settings


def register(subparsers: argparse._SubParsersAction) -> None:
    worker = subparsers.add_parser("worker", help="run a worker serving one registered model version")
    worker.add_argument("--model-version", required=True, help="registered version name (ledgerlm models register)")
    worker.add_argument("--model-dir", help="where the files are, if not at the registered location")
    worker.add_argument("--worker-id", help="stable id (default: random)")
    worker.set_defaults(handler=run_worker)
    workers = subparsers.add_parser("workers", help="operate workers").add_subparsers(dest="action", required=True)
    drain = workers.add_parser("drain", help="no new work; finish running attempts; exit")
    drain.add_argument("worker_id")
    drain.set_defaults(handler=run_drain)


async def _worker(settings: Settings, kafka: KafkaAccess, args: argparse.Namespace) -> None:
    from consumers.worker.runtime import Worker, load_engine
    from producers.model_registry import registered_versions

    model = (await registered_versions(kafka)).get(args.model_version)
    if model is None:
        raise CliError(f"model version {args.model_version!r} is not registered")
    from engine.errors import EngineError

    try:
        engine = await asyncio.to_thread(load_engine, settings, model, args.model_dir)
    except EngineError as exc:
        raise CliError(f"worker refused to start: {exc}") from None
    from plumbing.telemetry.collections import freeze_startup_objects, log_slow_collections

    frozen = freeze_startup_objects()  # the pool's block objects are never garbage: no collection walks them
    log_slow_collections()
    logging.getLogger(__name__).info("startup objects frozen count=%d", frozen)
    await Worker(settings, kafka, model, engine, args.worker_id).run()


def run_worker(args: argparse.Namespace) -> int:
    from ledgerlm.cli.roles import configure_logging, serve

    passive_compute_threads()
    configure_logging("worker")
    settings = Settings()
    if settings.worker_nice:
        os.nice(settings.worker_nice)
    return serve(_worker(settings, kafka_access(settings), args))


def run_drain(args: argparse.Namespace) -> int:
    from plumbing.kafka.clients import make_producer, publish
    from schemas.dispatch import DrainWorker
    from schemas.topics import DISPATCH

    async def send() -> None:
        producer = make_producer(kafka_access(Settings()))
        await producer.start()
        try:
            await publish(producer, DISPATCH, DrainWorker(worker_id=args.worker_id))
        finally:
            await producer.stop()

    asyncio.run(send())
    print(f"drain ordered for {args.worker_id}")
    return 0
