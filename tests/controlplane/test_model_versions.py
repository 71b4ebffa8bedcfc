"""Model versions are immutable: the same name with other content is refused."""
from __future__ import annotations

import json
import shutil
import uuid

import pytest

from producers.model_registry import ModelVersionConflict, register_model, registered_versions


async def test_register_is_idempotent_and_refuses_other_content_under_the_same_name(bootstrap, topics, model_dir,
                                                                                     tmp_path):
    from engine.artifacts.model_dir import write_manifest

    name = f"cp-immutable-{uuid.uuid4().hex[:8]}@1"
    first = await register_model(bootstrap, model_dir, name)
    again = await register_model(bootstrap, model_dir, name)
    assert (first.created, again.created) == (True, False)
    assert again.event.content_sha256 == first.event.content_sha256
    assert first.event.checksums == json.loads((model_dir / "manifest.json").read_text())["files"]
    assert first.event.source_uri == str(model_dir.resolve()) and first.event.max_context_tokens == 512

    changed = tmp_path / "changed"
    shutil.copytree(model_dir, changed)
    config = json.loads((changed / "generation_config.json").read_text())
    (changed / "generation_config.json").write_text(json.dumps({**config, "temperature": 0.5}))
    write_manifest(changed)
    with pytest.raises(ModelVersionConflict, match="different content"):
        await register_model(bootstrap, changed, name)
    assert (await registered_versions(bootstrap))[name].content_sha256 == first.event.content_sha256
