"""Chained SHA-256 hashes that name full KV blocks in the prefix cache.

    h0 = sha256(ROOT || compat || scope || tokens[0:B])
    h1 = sha256(h0   || compat || scope || tokens[B:2B])   ...

The compatibility key covers everything that changes the *content* of a KV
block for the same tokens (model weights, tokenizer, dtype, block size); the
scope key is supplied by the platform (derived from the tenant) so that
identical prompts of different tenants never share blocks.
"""
from __future__ import annotations

import hashlib
from array import array
from typing import Sequence

ROOT_HASH = b"\x00" * 32


def compatibility_key(file_checksums: dict[str, str], dtype: str, block_size: int) -> bytes:
    """Digest of model/tokenizer file checksums, dtype and block size."""
    h = hashlib.sha256()
    for name in sorted(file_checksums):
        h.update(f"{name}={file_checksums[name]}\n".encode())
    h.update(f"dtype={dtype}\nblock_size={block_size}\n".encode())
    return h.digest()


def _len_prefixed(value: bytes) -> bytes:
    # Length prefix keeps (compat, scope) boundaries unambiguous.
    return len(value).to_bytes(4, "little") + value


def block_hash(parent: bytes, compat_key: bytes, scope_key: str, token_ids: Sequence[int]) -> bytes:
    """Hash of one full block given the hash of the block before it."""
    h = hashlib.sha256(parent)
    h.update(_len_prefixed(compat_key))
    h.update(_len_prefixed(scope_key.encode()))
    h.update(array("q", token_ids).tobytes())
    return h.digest()


def extend_block_hashes(
    hashes: list[bytes], token_ids: Sequence[int], block_size: int, compat_key: bytes, scope_key: str
) -> list[bytes]:
    """Append hashes for every full block of `token_ids` not yet hashed; returns `hashes`."""
    num_full = len(token_ids) // block_size
    for i in range(len(hashes), num_full):
        parent = hashes[i - 1] if i else ROOT_HASH
        hashes.append(block_hash(parent, compat_key, scope_key, token_ids[i * block_size : (i + 1) * block_size]))
    return hashes
