"""`ledgerlm tenants create NAME [--weight W] [limits...] [--json]`: the API key is printed once."""
from __future__ import annotations

import argparse
import asyncio
import json

from ledgerlm.cli.endpoints import database_url, kafka_access
from ledgerlm.cli.errors import CliError
from ledgerlm.settings import Settings


def register(subparsers: argparse._SubParsersAction) -> None:
    tenants = subparsers.add_parser("tenants", help="tenants and API keys").add_subparsers(
        dest="action", required=True)
    create = tenants.add_parser("create", help="register a tenant and issue its API key (shown once)")
    create.add_argument("name", help="tenant id: lowercase letters, digits, '-' or '_'")
    create.add_argument("--weight", type=float, default=1.0, help="fair-share weight")
    create.add_argument("--max-tokens-in-flight", type=int, default=200_000)
    create.add_argument("--tokens-per-minute", type=int, default=1_000_000)
    create.add_argument("--max-concurrency", type=int, default=64)
    create.add_argument("--max-queued-tokens", type=int, default=400_000)
    create.add_argument("--json", action="store_true")
    create.set_defaults(handler=run_create)


def run_create(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from producers.tenant_admin import InvalidTenantName, TenantExists, create_tenant
    from schemas.values import TenantLimits

    settings = Settings()
    try:
        limits = TenantLimits(weight=args.weight, max_tokens_in_flight=args.max_tokens_in_flight,
                              tokens_per_minute=args.tokens_per_minute, max_concurrency=args.max_concurrency,
                              max_queued_tokens=args.max_queued_tokens)
    except ValidationError as exc:
        raise CliError("invalid limits: " + "; ".join(f"{e['loc'][0]}: {e['msg']}" for e in exc.errors())) from None
    try:
        created = asyncio.run(create_tenant(kafka_access(settings), database_url(settings), args.name, limits))
    except (TenantExists, InvalidTenantName) as exc:
        raise CliError(str(exc)) from None
    if args.json:
        print(json.dumps({"tenantId": created.tenant_id, "apiKey": created.api_key}))
    else:
        print(f"tenant {created.tenant_id} created")
        print(f"API key (shown once, store it now): {created.api_key}")
    return 0
