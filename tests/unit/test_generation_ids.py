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


def test_without_a_configured_secret_each_home_generates_its_own_key_kept_0600(tmp_path):
    from pydantic import SecretStr

    from plumbing.settings import Settings

    one, other = Settings(home=tmp_path / "a"), Settings(home=tmp_path / "b")
    key = one.generation_id_key()
    assert key == Settings(home=tmp_path / "a").generation_id_key()  # roles of one host share it
    assert key != other.generation_id_key() and len(key) >= 32
    assert (tmp_path / "a" / "credentials" / "generation-id-secret").stat().st_mode & 0o777 == 0o600
    assert Settings(home=tmp_path / "a", generation_id_secret=SecretStr("mine")).generation_id_key() == "mine"


def test_a_preferred_id_is_drawn_within_what_the_preference_accepts():
    from consumers.controller.decisions import in_share
    from plumbing.kafka.follower import partition_for
    from schemas.commands import StreamShare

    share = StreamShare(partitions=12, owned=(3, 7))
    ids = [mint_generation_id(SECRET, "tenant-a", in_share(share)) for _ in range(200)]
    assert {partition_for(gen_id, 12) for gen_id in ids} == {3, 7}  # both, and nothing else
    assert all(owned_by(SECRET, gen_id, "tenant-a") for gen_id in ids)
    assert in_share(None) is None and in_share(StreamShare(partitions=12, owned=())) is None
    # Nothing acceptable: the last draw is used rather than never minting.
    assert owned_by(SECRET, mint_generation_id(SECRET, "tenant-a", lambda _: False), "tenant-a")


def test_a_submit_without_a_share_encodes_as_before_and_one_with_it_round_trips():
    from schemas.codec import decode, encode
    from schemas.commands import StreamShare, SubmitGeneration
    from schemas.topics import COMMANDS

    fields = dict(tenant_id="t", request_id="r", gateway_id="g", correlation_id="c", model_version="m@1",
                  input_token_ids=(1, 2), max_output_tokens=3, payload_hash="ab" * 32)
    assert b"stream_share" not in encode(SubmitGeneration(**fields))
    shared = SubmitGeneration(**fields, stream_share=StreamShare(partitions=6, owned=(0, 1, 2)))
    assert decode(COMMANDS, encode(shared)).stream_share == StreamShare(partitions=6, owned=(0, 1, 2))
