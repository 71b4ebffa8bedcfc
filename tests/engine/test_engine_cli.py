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
