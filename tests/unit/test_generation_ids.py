"""Generation ids carry an HMAC tag of their tenant: the gateway tells "mine" from "not mine" without a read model."""
from __future__ import annotations

import re

from schemas.generation_ids import mint_generation_id, owned_by

SECRET = "s3cret"


def test_a_minted_id_is_owned_by_its_tenant_only():
    gen_id = mint_generation_id(SECRET, "tenant-a")
    assert re.fullmatch(r"gen_[0-9a-f]{40}", gen_id)
    assert owned_by(SECRET, gen_id, "tenant-a")
    assert not owned_by(SECRET, gen_id, "tenant-b")
    assert not owned_by("another-secret", gen_id, "tenant-a")


def test_ids_are_fresh_and_a_changed_character_breaks_the_tag():
    ids = {mint_generation_id(SECRET, "tenant-a") for _ in range(200)}
    assert len(ids) == 200
    gen_id = ids.pop()
    for position in (4, 27, 28, len(gen_id) - 1):  # nonce start, nonce end, tag start, tag end
        flipped = "0" if gen_id[position] != "0" else "1"
        assert not owned_by(SECRET, gen_id[:position] + flipped + gen_id[position + 1:], "tenant-a")


def test_untagged_and_malformed_ids_are_owned_by_nobody():
    for gen_id in ("gen_" + "ab" * 16, "gen_missing", "", "gen_", "x" * 44, mint_generation_id(SECRET, "t")[4:]):
        assert not owned_by(SECRET, gen_id, "t")
