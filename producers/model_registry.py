"""Model versions are immutable events on the compacted `llm.models` topic.

`register_model(dir, name)` verifies the directory's manifest checksums,
derives the tokenizer, chat-template and content hashes, and publishes a
`ModelVersionRegistered` keyed by the version name. Registering the same name
again with the same content is a no-op; with different content it is refused.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from plumbing.kafka.clients import Kafka, make_producer, publish
from plumbing.kafka.follower import REGISTRY_POLL_MS, Follower
from schemas.envelope import Envelope
from schemas.model_book import ModelBook
from schemas.model_rollout import RESERVED_PREFIXES
from schemas.registry_events import ModelVersionRegistered
from schemas.topics import MODELS

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")
BYTES_PER_ELEMENT = {"float32": 4, "bfloat16": 2, "float16": 2}


class ModelVersionConflict(Exception):
    """The name is registered with different content."""


class InvalidVersionName(ValueError):
    """A name that would share a record key with a qualification or an alias on `llm.models`."""


@dataclass(frozen=True)
class Registration:
    event: ModelVersionRegistered
    created: bool


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def chat_template_of(model_dir: Path) -> str:
    jinja = model_dir / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    config = model_dir / "tokenizer_config.json"
    if config.is_file():
        template = json.loads(config.read_text()).get("chat_template")
        if isinstance(template, str):
            return template
    return ""


def describe(model_dir: str | Path, name: str, dtype: str = "float32", block_size: int = 16) -> ModelVersionRegistered:
    """The registration record of a verified model directory (raises engine ArtifactError when it is not)."""
    from engine.artifacts.model_dir import verify_files

    root = Path(model_dir).resolve()
    checksums = verify_files(root)
    config = json.loads((root / "config.json").read_text())
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    kv_heads = config.get("num_key_value_heads") or heads
    kv_bytes = 2 * config["num_hidden_layers"] * kv_heads * head_dim * BYTES_PER_ELEMENT[dtype]
    tokenizer_parts = {n: checksums[n] for n in TOKENIZER_FILES if n in checksums}
    return ModelVersionRegistered(
        model_version=name, name=name.split("@", 1)[0], checksums=checksums,
        max_context_tokens=int(config["max_position_embeddings"]), kv_bytes_per_token=kv_bytes,
        registered_at=datetime.now(UTC), source_uri=str(root),
        content_sha256=sha256_text(json.dumps(checksums, sort_keys=True)),
        tokenizer_sha256=sha256_text(json.dumps(tokenizer_parts, sort_keys=True)),
        chat_template_sha256=sha256_text(chat_template_of(root)),
        runtime={"model_type": str(config.get("model_type")), "dtype": dtype, "block_size": str(block_size),
                 "vocab_size": str(config["vocab_size"])},
    )


async def read_model_book(kafka: Kafka) -> ModelBook:
    """`llm.models` folded up to its current end: versions, qualifications, aliases."""
    book = ModelBook()
    follower = Follower(kafka, [MODELS], lambda _topic, event: book.observe(event), client_id="model-registry",
                        long_poll_ms=REGISTRY_POLL_MS)
    await follower.start()
    try:
        await follower.catch_up()
    finally:
        await follower.stop()
    return book


async def registered_versions(kafka: Kafka) -> dict[str, ModelVersionRegistered]:
    """Every registered version (the first record per name wins: versions are immutable)."""
    return (await read_model_book(kafka)).versions


async def publish_model_record(kafka: Kafka, event: Envelope) -> None:
    """One record on `llm.models`, acknowledged."""
    producer = make_producer(kafka)
    await producer.start()
    try:
        await publish(producer, MODELS, event)
    finally:
        await producer.stop()


async def register_model(kafka: Kafka, model_dir: str | Path, name: str) -> Registration:
    if name.startswith(RESERVED_PREFIXES):
        raise InvalidVersionName(f"model version {name!r} starts with a reserved prefix "
                                 f"({', '.join(RESERVED_PREFIXES)})")
    event = describe(model_dir, name)
    existing = (await registered_versions(kafka)).get(name)
    if existing is not None:
        if existing.content_sha256 != event.content_sha256:
            raise ModelVersionConflict(f"model version {name!r} is already registered with different content")
        return Registration(existing, created=False)
    await publish_model_record(kafka, event)
    return Registration(event, created=True)
