"""`ledgerlm gateway [--host H] [--port P]`: the HTTP API (FastAPI on uvicorn)."""
from __future__ import annotations

import argparse

from ledgerlm.cli.endpoints import database_url, kafka_access
from plumbing.settings import Settings


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("gateway", help="run the HTTP gateway")
    parser.add_argument("--host", help="bind address (default: settings.gateway_host)")
    parser.add_argument("--port", type=int, help="port (default: settings.gateway_port)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from ledgerlm.cli.roles import configure_logging
    from producers.gateway.http.app import create_app

    configure_logging("gateway")
    settings = Settings()
    app = create_app(settings, kafka_access(settings), database_url(settings))
    uvicorn.run(app, host=args.host or settings.gateway_host, port=args.port or settings.gateway_port,
                timeout_keep_alive=settings.gateway_keep_alive_s, log_level="warning", access_log=False)
    return 0
