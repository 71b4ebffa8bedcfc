"""Running one long-lived role (controller, worker, gateway) until SIGTERM/SIGINT."""
from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Coroutine


def log_format(role: str) -> str:
    """How a role's log lines read (bench capacity parses the controller's back: bench/capacity/refusals.py)."""
    return f"%(asctime)s {role} %(levelname)s %(name)s: %(message)s"


def configure_logging(role: str) -> None:
    logging.basicConfig(level=logging.INFO, format=log_format(role))
    logging.getLogger("aiokafka").setLevel(logging.WARNING)


def serve(main: Coroutine) -> int:
    """Run `main` until it returns or a stop signal arrives (then it is cancelled, so its cleanup runs)."""

    async def runner() -> int:
        task = asyncio.ensure_future(main)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        try:
            await task
        except asyncio.CancelledError:
            pass
        return 0

    try:
        import uvloop  # a faster event loop for the I/O-bound roles (a dependency; plain asyncio without it)
    except ImportError:
        return asyncio.run(runner())
    return uvloop.run(runner())
