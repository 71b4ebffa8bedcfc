"""`ledgerlm models ...` commands (the benchmark is a program, not a test)."""
from __future__ import annotations

import json

from ledgerlm.cli.main import main


def test_build_demo_writes_verified_model(tmp_path, capsys):
    out = tmp_path / "m"
    assert main(["models", "build-demo", "--out", str(out), "--size", "tiny", "--train-steps", "0"]) == 0
    files = json.loads((out / "manifest.json").read_text())["files"]
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(files)
    config = json.loads((out / "config.json").read_text())
    assert config["num_key_value_heads"] < config["num_attention_heads"]  # GQA
    assert main(["models", "verify", str(out)]) == 0
    assert "ok: llama, 2 layers" in capsys.readouterr().out
    # Refuses to overwrite, and verify names a tampered file.
    assert main(["models", "build-demo", "--out", str(out)]) == 2
    (out / "config.json").write_text((out / "config.json").read_text() + " ")
    assert main(["models", "verify", str(out)]) == 2
    assert "config.json: SHA-256 does not match" in capsys.readouterr().err


def test_build_demo_max_context_overrides_the_size_and_keeps_its_shape(tmp_path, capsys):
    out = tmp_path / "long"
    assert main(["models", "build-demo", "--out", str(out), "--size", "tiny", "--train-steps", "0",
                 "--max-context", "4096"]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["max_position_embeddings"] == 4096 and config["num_hidden_layers"] == 2
    assert main(["models", "build-demo", "--out", str(tmp_path / "bad"), "--max-context", "0"]) == 2
    assert "--max-context must be >= 1" in capsys.readouterr().err


def test_mini_size_has_the_serving_bench_context():
    from engine.artifacts.demo_model import SIZES

    assert SIZES["mini"].max_position_embeddings >= 4000 + 600  # the long-document mix fits
    assert SIZES["tiny"].max_position_embeddings == 512 and SIZES["small"].max_position_embeddings == 2048
