"""Model directories: manifest checksums, config, tokenizer and weights.

A model directory is a Hugging Face checkpoint (config.json, *.safetensors,
tokenizer files) plus `manifest.json`:

    {"format": "ledgerlm-manifest/1", "files": {"config.json": "<sha256>", ...}}

Nothing is usable until every listed file matches its checksum, and weight
files not listed are refused too (an extra shard would change the model).
Weights are hashed and parsed from the same bytes, so a file swapped after
verification cannot slip in.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch

from engine.errors import ArtifactError
from engine.llama import ModelDims

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = "ledgerlm-manifest/1"
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


def sha256_file(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def write_manifest(model_dir: str | Path) -> dict[str, str]:
    """Checksum every regular file in `model_dir` (except the manifest) into manifest.json."""
    root = Path(model_dir)
    files = {
        p.relative_to(root).as_posix(): sha256_file(p)
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != MANIFEST_NAME and not p.name.startswith(".")
    }
    (root / MANIFEST_NAME).write_text(json.dumps({"format": MANIFEST_FORMAT, "files": files}, indent=2) + "\n")
    return files


def read_manifest(model_dir: Path) -> dict[str, str]:
    path = model_dir / MANIFEST_NAME
    if not path.is_file():
        raise ArtifactError(str(path), "manifest missing; run `ledgerlm models manifest DIR` for a trusted checkpoint")
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ArtifactError(str(path), f"not valid JSON ({exc.msg})") from None
    if doc.get("format") != MANIFEST_FORMAT or not isinstance(doc.get("files"), dict):
        raise ArtifactError(str(path), f"expected format {MANIFEST_FORMAT!r} with a 'files' map")
    return {str(k): str(v) for k, v in doc["files"].items()}


def verify_files(model_dir: Path, expected: Mapping[str, str] | None = None) -> dict[str, str]:
    """Check every manifest entry (and `expected`, the registered checksums, if given).

    Returns the verified name -> sha256 map. Weight files are verified later,
    from the bytes that are actually parsed (see `load_weights`).
    """
    checksums = read_manifest(model_dir)
    if expected is not None:
        for name in sorted(set(expected) | set(checksums)):
            if expected.get(name) != checksums.get(name):
                raise ArtifactError(str(model_dir / name), "manifest disagrees with the registered checksum")
    if "config.json" not in checksums:
        raise ArtifactError(str(model_dir / "config.json"), "not listed in the manifest")
    for name in sorted(checksums):
        path = model_dir / name
        if not path.is_file():
            raise ArtifactError(str(path), "listed in the manifest but missing")
        if not name.endswith(".safetensors") and sha256_file(path) != checksums[name]:
            raise ArtifactError(str(path), "SHA-256 does not match the manifest")
    for path in sorted(model_dir.glob("*.safetensors")):
        if path.name not in checksums:
            raise ArtifactError(str(path), "weight file not listed in the manifest")
    if not any(n.endswith(".safetensors") for n in checksums):
        raise ArtifactError(str(model_dir), "no .safetensors weights listed in the manifest")
    return checksums


def load_weights(model_dir: Path, checksums: Mapping[str, str]) -> dict[str, torch.Tensor]:
    """Read each listed safetensors file once, verify its hash, then parse those bytes."""
    from safetensors.torch import load as load_safetensors

    tensors: dict[str, torch.Tensor] = {}
    for name in sorted(n for n in checksums if n.endswith(".safetensors")):
        path = model_dir / name
        data = path.read_bytes()
        if hashlib.sha256(data).hexdigest() != checksums[name]:
            raise ArtifactError(str(path), "SHA-256 does not match the manifest")
        try:
            tensors.update(load_safetensors(data))
        except Exception as exc:  # safetensors raises its own error types
            raise ArtifactError(str(path), f"unreadable safetensors ({type(exc).__name__})") from None
    return tensors


def model_dims(config: Any, path: Path) -> ModelDims:
    """Translate a transformers config of a supported family into `ModelDims`."""
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ArtifactError(str(path), f"model_type {model_type!r} is not one of {SUPPORTED_MODEL_TYPES}")
    if getattr(config, "hidden_act", "silu") != "silu":
        raise ArtifactError(str(path), f"hidden_act {config.hidden_act!r} unsupported (SwiGLU with silu only)")
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return ModelDims(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_layers=config.num_hidden_layers,
        num_heads=heads,
        num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
        head_dim=head_dim,
        rms_norm_eps=config.rms_norm_eps,
        max_position_embeddings=config.max_position_embeddings,
        # Qwen2 always has QKV bias; Qwen3 dropped it (attention_bias) and added per-head q/k RMSNorm.
        qkv_bias=model_type == "qwen2" or bool(getattr(config, "attention_bias", False)),
        qk_norm=model_type == "qwen3",
        tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
    )


def rope_tables(config: Any, path: Path) -> tuple[torch.Tensor, float]:
    """(inv_freq, attention_scaling) exactly as transformers computes them."""
    params = getattr(config, "rope_parameters", None) or {}
    rope_type = params.get("rope_type", "default")
    if rope_type == "default":
        dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        base = params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
        return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)), 1.0
    if rope_type == "dynamic":
        # Dynamic NTK changes frequencies with the live sequence length, which
        # would make cached KV blocks depend on batch mates.
        raise ArtifactError(str(path), "dynamic RoPE scaling is not supported")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    if rope_type not in ROPE_INIT_FUNCTIONS:
        raise ArtifactError(str(path), f"unknown rope_type {rope_type!r}")
    inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](config, torch.device("cpu"))
    return inv_freq, float(scaling)


def sliding_window(config: Any) -> int | None:
    """The attention window if any layer uses one, else None.

    Qwen2/Qwen3 configs keep a `sliding_window` size even when `layer_types`
    says every layer attends fully (`max_window_layers` covers them all), so
    the layer types decide. The engine caps the context at the window, which
    makes a window on only some layers harmless.
    """
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None and "sliding_attention" not in layer_types:
        return None
    return window


@dataclass(frozen=True)
class ModelArtifacts:
    """Everything loaded from a verified model directory."""

    path: Path
    checksums: dict[str, str]
    config: Any  # transformers PretrainedConfig
    tokenizer: Any  # transformers PreTrainedTokenizerBase
    dims: ModelDims
    tensors: dict[str, torch.Tensor]
    inv_freq: torch.Tensor
    attention_scaling: float
    sliding_window: int | None


def load_artifacts(model_dir: str | Path, expected: Mapping[str, str] | None = None) -> ModelArtifacts:
    """Verify then load a model directory; raises `ArtifactError` naming the bad file."""
    from transformers import AutoConfig, AutoTokenizer

    path = Path(model_dir)
    if not path.is_dir():
        raise ArtifactError(str(path), "not a directory")
    checksums = verify_files(path, expected)
    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True)
    except Exception as exc:
        raise ArtifactError(str(path / "config.json"), f"unreadable config ({type(exc).__name__}: {exc})") from None
    dims = model_dims(config, path / "config.json")
    inv_freq, scaling = rope_tables(config, path / "config.json")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as exc:
        raise ArtifactError(str(path), f"tokenizer unreadable ({type(exc).__name__})") from None
    tensors = load_weights(path, checksums)
    return ModelArtifacts(path, checksums, config, tokenizer, dims, tensors, inv_freq, scaling, sliding_window(config))
