"""`ledgerlm docs asyncapi`: print the AsyncAPI document of the topics (JSON)."""
from __future__ import annotations

import argparse
import json


def register(subparsers: argparse._SubParsersAction) -> None:
    docs = subparsers.add_parser("docs", help="generated documentation").add_subparsers(dest="action", required=True)
    asyncapi = docs.add_parser("asyncapi", help="AsyncAPI document of every topic and record type")
    asyncapi.set_defaults(handler=run_asyncapi)


def run_asyncapi(args: argparse.Namespace) -> int:
    from plumbing.kafka.clients import make_broker
    from schemas.asyncapi import asyncapi_document

    broker = make_broker("localhost:9092", description="ledgerlm event log")
    print(json.dumps(asyncapi_document(broker), indent=2))
    return 0
