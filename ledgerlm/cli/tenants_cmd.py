"""`ledgerlm tenants create NAME [--weight W] [limits...] [--json]`: the API key is printed once.
`ledgerlm tenants set-billing --tenant T [--stripe-customer C] [--lago-subscription S]`: its billing ids."""
from __future__ import annotations

import argparse
import asyncio
import json

from ledgerlm.cli.endpoints import database_url, kafka_access, service_kafka_access
from ledgerlm.cli.errors import CliError
from plumbing.settings import Settings


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
    create.add_argument("--stripe-customer", metavar="CUS_ID", help="the Stripe customer its meter events name")
    create.add_argument("--lago-subscription", metavar="ID", help="the Lago subscription its usage is billed on "
                                                                 "(default: the tenant id)")
    create.add_argument("--json", action="store_true")
    create.add_argument("--no-kafka", action="store_true", help="no intake/results topics for the tenant")
    create.set_defaults(handler=run_create)
    billing = tenants.add_parser("set-billing", help="set an existing tenant's billing ids (the ones not given "
                                                     "stay); the exporters use them for seals exported from now")
    billing.add_argument("--tenant", required=True)
    billing.add_argument("--stripe-customer", metavar="CUS_ID", help="the Stripe customer its meter events name")
    billing.add_argument("--lago-subscription", metavar="ID", help="the Lago subscription its usage is billed on")
    billing.add_argument("--json", action="store_true")
    billing.set_defaults(handler=run_set_billing)
    grant = tenants.add_parser("grant-kafka", help="create the tenant's intake and results topics "
                                                   "(llm.requests.<tenant>, llm.results.<tenant>) and, on a "
                                                   "broker with SASL and an authorizer, its principal and ACLs")
    grant.add_argument("name")
    grant.add_argument("--json", action="store_true")
    grant.set_defaults(handler=run_grant)


def grant(settings: Settings, name: str):
    """Topics, and where the admin access is SASL, the tenant's principal and ACLs (password kept 0600)."""
    from ledgerlm.tenant_credentials import password_for, store_grant
    from producers.tenant_kafka import grant_kafka

    password = password_for(settings, name)
    granted = asyncio.run(grant_kafka(service_kafka_access(settings, "admin"), name, settings.topic_partitions,
                                      settings.topic_replication_factor, password))
    if granted.principal is not None:
        store_grant(settings, granted, password)
    return granted


def grant_json(settings: Settings, granted) -> dict:
    from ledgerlm.tenant_credentials import credentials_path

    path = credentials_path(settings, granted.tenant_id) if granted.principal else None
    return {**granted.as_json(), "credentialsFile": str(path) if path else None}


def describe_grant(settings: Settings, granted) -> list[str]:
    from ledgerlm.tenant_credentials import credentials_path

    lines = [f"Kafka: publish to {granted.intake_topic}, read {granted.results_topic}"]
    if granted.principal is None:
        return lines + ["  unauthenticated: this broker has no SASL listener with an authorizer (anyone who can "
                        "reach it may use these topics)"]
    lines += [f"  principal {granted.principal} (SCRAM-SHA-256) at {granted.bootstrap}",
              f"  password in {credentials_path(settings, granted.tenant_id)} (0600)",
              *(f"  ACL {acl}" for acl in granted.acls),
              f"  connect: security.protocol=SASL_PLAINTEXT sasl.mechanism=SCRAM-SHA-256 "
              f"sasl.username={granted.username}; consumer groups must start with '{granted.tenant_id}.'"]
    return lines


def run_grant(args: argparse.Namespace) -> int:
    from producers.tenant_admin import project_tenants

    settings = Settings()
    import psycopg

    asyncio.run(project_tenants(kafka_access(settings), database_url(settings)))
    with psycopg.connect(database_url(settings)) as conn:
        if conn.execute("SELECT 1 FROM tenants WHERE tenant_id = %s", (args.name,)).fetchone() is None:
            raise CliError(f"no tenant {args.name!r}")
    granted = grant(settings, args.name)
    lines = [json.dumps(grant_json(settings, granted))] if args.json else [f"tenant {args.name}",
                                                                          *describe_grant(settings, granted)]
    print("\n".join(lines))
    return 0


def run_create(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from producers.tenant_admin import InvalidTenantName, TenantExists, create_tenant
    from schemas.values import BillingIds, TenantLimits

    settings = Settings()
    try:
        limits = TenantLimits(weight=args.weight, max_tokens_in_flight=args.max_tokens_in_flight,
                              tokens_per_minute=args.tokens_per_minute, max_concurrency=args.max_concurrency,
                              max_queued_tokens=args.max_queued_tokens)
        billing = BillingIds(stripe_customer_id=args.stripe_customer, lago_subscription_id=args.lago_subscription)
    except ValidationError as exc:
        raise CliError("invalid limits: " + "; ".join(f"{e['loc'][0]}: {e['msg']}" for e in exc.errors())) from None
    try:
        created = asyncio.run(create_tenant(kafka_access(settings), database_url(settings), args.name, limits,
                                            billing))
    except (TenantExists, InvalidTenantName) as exc:
        raise CliError(str(exc)) from None
    granted = None if args.no_kafka else grant(settings, created.tenant_id)
    if args.json:
        print(json.dumps({"tenantId": created.tenant_id, "apiKey": created.api_key,
                          **({"kafka": grant_json(settings, granted)} if granted else {})}))
    else:
        print(f"tenant {created.tenant_id} created")
        print(f"API key (shown once, store it now): {created.api_key}")
        if granted:
            print("\n".join(describe_grant(settings, granted)))
    return 0


def run_set_billing(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from producers.tenant_admin import UnknownTenant, set_billing

    if args.stripe_customer is None and args.lago_subscription is None:
        raise CliError("give --stripe-customer, --lago-subscription or both")
    settings = Settings()
    try:
        billing = asyncio.run(set_billing(kafka_access(settings), database_url(settings), args.tenant,
                                          stripe_customer_id=args.stripe_customer,
                                          lago_subscription_id=args.lago_subscription))
    except UnknownTenant as exc:
        raise CliError(f"{exc} (create it with `ledgerlm tenants create`)") from None
    except ValidationError as exc:
        raise CliError("invalid billing ids: " + "; ".join(f"{e['loc'][0]}: {e['msg']}" for e in exc.errors())
                       ) from None
    ids = billing.model_dump(exclude_none=True)
    if args.json:
        print(json.dumps({"tenantId": args.tenant, "billing": ids}))
    else:
        print(f"tenant {args.tenant} billing: " + (", ".join(f"{k}={v}" for k, v in sorted(ids.items())) or "none"))
    return 0
