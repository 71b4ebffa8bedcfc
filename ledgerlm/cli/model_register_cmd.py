"""`ledgerlm models register DIR --name NAME [--json]`: publish an immutable model version."""
from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from ledgerlm.cli.endpoints import kafka_access
from ledgerlm.cli.errors import CliError
from plumbing.settings import Settings


def add_register_parser(models: argparse._SubParsersAction) -> None:
    register = models.add_parser("register", help="register a verified model directory as an immutable version")
    register.add_argument("dir", type=Path)
    register.add_argument("--name", required=True, help="version name, e.g. demo-tiny@1")
    register.add_argument("--json", action="store_true")
    register.set_defaults(handler=run_register)


def run_register(args: argparse.Namespace) -> int:
    from engine.errors import ArtifactError
    from producers.model_registry import InvalidVersionName, ModelVersionConflict, register_model

    if not args.dir.is_dir():
        raise CliError(f"{args.dir} is not a directory")
    try:
        result = asyncio.run(register_model(kafka_access(Settings()), args.dir, args.name))
    except (ModelVersionConflict, InvalidVersionName, ArtifactError) as exc:
        raise CliError(str(exc)) from None
    event = result.event
    if args.json:
        print(json.dumps({"modelVersion": event.model_version, "created": result.created,
                          "contentSha256": event.content_sha256, "sourceUri": event.source_uri}))
    else:
        verb = "registered" if result.created else "already registered (same content)"
        print(f"{event.model_version} {verb}: {len(event.checksums)} files, content {event.content_sha256[:12]}")
    return 0
