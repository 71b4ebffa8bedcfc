"""Rollout operations on `llm.models`: qualify a version on its golden prompts, weigh versions under an alias.

    qualify(version)        verified files -> CPU float32 engine -> golden prompts -> ModelQualified
    set_alias(alias, w)     checks against the registered versions -> ModelAliasSet

An alias groups versions that share a tokenizer and a chat template: the
gateway renders a prompt into token ids *before* the controller pins the
version, so those ids must mean the same to every version the draw can pick.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from plumbing.kafka.clients import Kafka
from engine.artifacts.golden import GOLDEN_FILE, GoldenReport, load_golden, run_golden  # light: no torch here
from plumbing.settings import Settings
from producers.model_registry import publish_model_record, read_model_book
from schemas.model_book import ModelBook
from schemas.model_rollout import ModelAliasSet, ModelQualified
from schemas.registry_events import ModelVersionRegistered


class RolloutError(Exception):
    """A qualification or alias that cannot be made; the message names the version, alias or file."""


@dataclass(frozen=True)
class Qualification:
    event: ModelQualified
    report: GoldenReport


# -- aliases ---------------------------------------------------------------------------
def alias_record(book: ModelBook, alias: str, weights: dict[str, int], now: datetime) -> ModelAliasSet:
    """The alias record for `weights`, or RolloutError saying why the registry refuses it."""
    if not alias or "@" in alias or any(c.isspace() for c in alias):
        raise RolloutError(f"alias {alias!r}: a name without '@' or spaces (versions are NAME@V)")
    if alias in book.versions:
        raise RolloutError(f"alias {alias!r} is a registered model version")
    if not weights:
        raise RolloutError(f"alias {alias!r}: name at least one VERSION=WEIGHT")
    for version, weight in sorted(weights.items()):
        if version not in book.versions:
            raise RolloutError(f"{version!r} is not a registered model version")
        if weight < 0:
            raise RolloutError(f"{version}: weight {weight} is negative")
    if not any(weights.values()):
        raise RolloutError(f"alias {alias!r}: at least one weight must be positive")
    members = [book.versions[v] for v in sorted(weights)]
    for kind in ("tokenizer_sha256", "chat_template_sha256"):
        missing = [m.model_version for m in members if getattr(m, kind) is None]
        if missing:
            raise RolloutError(f"{', '.join(missing)}: registered without {kind}; re-register to alias it")
        if len({getattr(m, kind) for m in members}) > 1:
            found = ", ".join(f"{m.model_version}={getattr(m, kind)[:12]}" for m in members)
            raise RolloutError(f"alias {alias!r}: versions differ in {kind} ({found}); an alias groups versions "
                               f"that share a tokenizer and chat template")
    return ModelAliasSet(alias=alias, weights=dict(sorted(weights.items())), set_at=now)


async def set_alias(kafka: Kafka, alias: str, weights: dict[str, int]) -> ModelAliasSet:
    """Publish the alias's new weights (the latest record wins: a rollback is new weights)."""
    event = alias_record(await read_model_book(kafka), alias, weights, datetime.now(UTC))
    await publish_model_record(kafka, event)
    return event


# -- qualification -----------------------------------------------------------------------
def run_golden_prompts(registered: ModelVersionRegistered, settings: Settings,
                       model_dir: str | Path | None = None) -> GoldenReport:
    """Load the version's verified files on CPU float32 and run its golden prompts (blocking)."""
    from engine.config import EngineConfig
    from engine.engine import Engine  # torch: loaded only to qualify

    checksum = registered.checksums.get(GOLDEN_FILE)
    if checksum is None:
        raise RolloutError(f"{registered.model_version} has no {GOLDEN_FILE}: it cannot qualify")
    root = model_dir or registered.source_uri
    if not root:
        raise RolloutError(f"{registered.model_version} has no registered location; pass its directory")
    config = EngineConfig(kv_cache_bytes=settings.worker_kv_pool_bytes, device="cpu", dtype="float32",
                          expected_checksums=registered.checksums)
    return run_golden(Engine(root, config), load_golden(root, checksum))


async def qualify(kafka: Kafka, version: str, settings: Settings,
                  model_dir: str | Path | None = None) -> Qualification:
    """Run `version`'s golden prompts and publish the outcome, passed or not."""
    registered = (await read_model_book(kafka)).versions.get(version)
    if registered is None:
        raise RolloutError(f"model version {version!r} is not registered")
    if registered.content_sha256 is None:
        raise RolloutError(f"{version} was registered without a content hash; re-register it to qualify")
    report = await asyncio.to_thread(run_golden_prompts, registered, settings, model_dir)
    event = ModelQualified(model_version=version, passed=report.passed, prompts=len(report.results),
                           failures=report.failures, content_sha256=registered.content_sha256,
                           qualified_at=datetime.now(UTC))
    await publish_model_record(kafka, event)
    return Qualification(event, report)
