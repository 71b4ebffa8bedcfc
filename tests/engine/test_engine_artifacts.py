"""Model directories load only when every checksum matches the manifest."""
from __future__ import annotations

import json
import shutil

import pytest

from engine.artifacts.model_dir import load_artifacts, write_manifest
from engine.config import EngineConfig
from engine.engine import Engine
from engine.errors import ArtifactError


@pytest.fixture
def model_copy(tiny_model_dir, tmp_path):
    return shutil.copytree(tiny_model_dir, tmp_path / "model")


def test_tampered_weight_file_is_refused(model_copy):
    weights = model_copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01  # one bit of one weight
    weights.write_bytes(bytes(data))
    with pytest.raises(ArtifactError) as err:
        Engine(model_copy, EngineConfig(kv_cache_bytes=1 << 20, device="cpu"))
    assert err.value.path == str(weights)
    assert "SHA-256 does not match" in str(err.value)


def test_tampered_tokenizer_is_refused(model_copy):
    path = model_copy / "tokenizer.json"
    path.write_text(path.read_text().replace('"<|eos|>"', '"<|EOS|>"', 1))
    with pytest.raises(ArtifactError) as err:
        load_artifacts(model_copy)
    assert err.value.path == str(path)


def test_missing_listed_file_is_refused(model_copy):
    (model_copy / "config.json").unlink()
    with pytest.raises(ArtifactError, match="listed in the manifest but missing") as err:
        load_artifacts(model_copy)
    assert err.value.path == str(model_copy / "config.json")


def test_unlisted_weight_shard_is_refused(model_copy):
    shutil.copy(model_copy / "model.safetensors", model_copy / "extra.safetensors")
    with pytest.raises(ArtifactError, match="not listed in the manifest") as err:
        load_artifacts(model_copy)
    assert err.value.path == str(model_copy / "extra.safetensors")


def test_missing_manifest_is_refused(model_copy):
    (model_copy / "manifest.json").unlink()
    with pytest.raises(ArtifactError, match="manifest missing"):
        load_artifacts(model_copy)


def test_registered_checksums_must_agree_with_manifest(model_copy):
    expected = json.loads((model_copy / "manifest.json").read_text())["files"]
    assert load_artifacts(model_copy, expected).checksums == expected
    expected["model.safetensors"] = "0" * 64
    with pytest.raises(ArtifactError, match="registered checksum") as err:
        load_artifacts(model_copy, expected)
    assert err.value.path == str(model_copy / "model.safetensors")


@pytest.mark.parametrize("model_type", ["gpt2", "gemma", "phi3"])
def test_unsupported_architecture_is_refused(model_copy, model_type):
    # gemma and phi3 configs use the same field names as Llama: only model_type keeps them out.
    cfg = json.loads((model_copy / "config.json").read_text())
    cfg["model_type"] = model_type
    cfg.pop("architectures", None)
    (model_copy / "config.json").write_text(json.dumps(cfg))
    write_manifest(model_copy)  # a correctly signed but unsupported checkpoint
    with pytest.raises(ArtifactError, match=f"model_type '{model_type}' is not one of") as err:
        load_artifacts(model_copy)
    assert err.value.path == str(model_copy / "config.json")
