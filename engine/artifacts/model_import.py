"""Import a Hugging Face checkpoint directory or a GGUF file into a checksummed model directory.

    SRC (HF dir | .gguf) ─▶ <out>.partial-<pid>/  config.json, model.safetensors, tokenizer files,
                                                  source.json, [golden.json], manifest.json
                         ─▶ rename to <out>       (nothing half-written is ever at <out>)

A GGUF file is dequantized to float32 by transformers (with the `gguf`
package); its architecture is read from the header first, so a model the
engine cannot run is refused before the slow part. `source.json` records
where the weights came from (file name, format, SHA-256), so the provenance
is part of the version's content hash.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from engine.artifacts.model_dir import SUPPORTED_MODEL_TYPES, read_manifest, sha256_file, write_manifest
from engine.errors import ArtifactError

# Tokenizer and generation files copied from a Hugging Face directory as they are.
HF_SIDE_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                 "special_tokens_map.json", "chat_template.jinja", "chat_template.json", "added_tokens.json",
                 "vocab.json", "merges.txt", "tokenizer.model", "model.safetensors.index.json")


@dataclass(frozen=True)
class ImportResult:
    model_dir: Path
    model_type: str
    source_sha256: str | None
    seconds: float
    reused: bool


def _noop(_msg: str) -> None:
    pass


def gguf_architecture(path: Path) -> str:
    """`general.architecture` from a GGUF header (ArtifactError when the file is not a readable GGUF)."""
    try:
        from gguf import GGUFReader
    except ImportError:
        raise ArtifactError(str(path), "the `gguf` package is needed to import GGUF files") from None
    try:
        field = GGUFReader(path, "r").fields["general.architecture"]
        return bytes(field.parts[field.data[0]]).decode("utf-8")
    except KeyError:
        raise ArtifactError(str(path), "GGUF header has no general.architecture") from None
    except Exception as exc:  # the reader raises ValueError/struct errors/IndexError on damaged files
        raise ArtifactError(str(path), f"not a readable GGUF file ({type(exc).__name__})") from None


def check_supported(model_type: str, path: Path) -> None:
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ArtifactError(str(path), f"architecture {model_type!r} is not supported by the engine "
                                       f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})")


def save_model(model: Any, tokenizer: Any, out: Path) -> None:
    """Weights as one safetensors file (tied lm_head left out), config without quantization, tokenizer."""
    from safetensors.torch import save_file

    config = model.config
    state = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    if getattr(config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    doc = config.to_dict()
    doc.pop("quantization_config", None)
    doc["dtype"] = "float32"
    (out / "config.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    tokenizer.save_pretrained(out)


def convert_gguf(src: Path, out: Path, log: Callable[[str], None]) -> str:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    architecture = gguf_architecture(src)
    check_supported(architecture, src)
    log(f"dequantizing {src.name} ({architecture}) to float32")
    try:
        model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    except Exception as exc:
        raise ArtifactError(str(src), f"transformers could not load it ({type(exc).__name__}: {exc})") from None
    log("writing safetensors, config and tokenizer")
    save_model(model, tokenizer, out)
    return architecture


def convert_hf(src: Path, out: Path, log: Callable[[str], None]) -> str:
    config_path = src / "config.json"
    if not config_path.is_file():
        raise ArtifactError(str(config_path), "a Hugging Face checkpoint needs config.json")
    try:
        model_type = str(json.loads(config_path.read_text()).get("model_type"))
    except json.JSONDecodeError as exc:
        raise ArtifactError(str(config_path), f"not valid JSON ({exc.msg})") from None
    check_supported(model_type, config_path)
    weights = sorted(src.glob("*.safetensors"))
    if weights:
        log(f"copying {len(weights)} safetensors file(s) and tokenizer files")
        for path in [*weights, *(src / n for n in HF_SIDE_FILES)]:
            if path.is_file():
                shutil.copyfile(path, out / path.name)
        return model_type
    # Only pickled (.bin) weights: load them through transformers and write safetensors.
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log("no safetensors weights: loading the checkpoint and converting")
    try:
        model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32, local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(src, local_files_only=True)
    except Exception as exc:
        raise ArtifactError(str(src), f"transformers could not load it ({type(exc).__name__}: {exc})") from None
    save_model(model, tokenizer, out)
    return model_type


def source_record(src: Path) -> dict[str, Any]:
    """Provenance: the GGUF file's SHA-256, or one SHA-256 over a checkpoint directory's files."""
    if src.is_file():
        return {"format": "gguf", "name": src.name, "sha256": sha256_file(src)}
    files = {p.name: sha256_file(p) for p in sorted(src.iterdir())
             if p.is_file() and (p.suffix in (".safetensors", ".bin") or p.name in HF_SIDE_FILES)}
    digest = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()
    return {"format": "hf", "name": src.name, "sha256": digest}


def existing_import(out: Path, source: dict[str, Any]) -> bool:
    """True when `out` is already a finished import of exactly this source."""
    record = out / "source.json"
    if not (out / "manifest.json").is_file() or not record.is_file():
        return False
    try:
        read_manifest(out)
        return json.loads(record.read_text()) == source
    except (ArtifactError, json.JSONDecodeError):
        return False


def import_checkpoint(src: str | Path, out: str | Path, golden: Path | None = None,
                      log: Callable[[str], None] = _noop) -> ImportResult:
    """Convert `src` into the model directory `out` (which must not exist, unless it holds this import).

    Raises `ArtifactError` naming the file for an unreadable, truncated or unsupported source.
    """
    src, out = Path(src), Path(out)
    t0 = time.monotonic()
    if not src.exists():
        raise ArtifactError(str(src), "does not exist")
    if src.is_file() and src.suffix != ".gguf":
        raise ArtifactError(str(src), "expected a Hugging Face checkpoint directory or a .gguf file")
    log(f"checksumming {src}")
    source = source_record(src)
    if golden is not None:
        source["golden_sha256"] = sha256_file(golden)
    if existing_import(out, source):
        log(f"{out} already holds this import")
        return ImportResult(out, json.loads((out / "config.json").read_text()).get("model_type", "?"),
                            source.get("sha256"), time.monotonic() - t0, reused=True)
    if out.exists() and any(out.iterdir()):
        raise ArtifactError(str(out), "already exists with other content; choose another name or remove it")
    partial = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        model_type = convert_gguf(src, partial, log) if src.is_file() else convert_hf(src, partial, log)
        (partial / "source.json").write_text(json.dumps(source, sort_keys=True) + "\n")
        if golden is not None:
            shutil.copyfile(golden, partial / "golden.json")
        log("writing manifest.json (SHA-256 of every file)")
        write_manifest(partial)
        if out.exists():
            out.rmdir()  # empty (checked above)
        partial.rename(out)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return ImportResult(out, model_type, source.get("sha256"), time.monotonic() - t0, reused=False)
