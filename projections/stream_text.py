"""How the resume buffer stores a text delta: its UTF-8 bytes in a `bytea` column.

PostgreSQL `text` refuses NUL (0x00), and a byte-level model can emit any byte, so a `text` column
put holes in the buffer. `surrogatepass` also keeps a lone surrogate (a JSON `\\ud800` decodes to one),
so every Python str round-trips exactly: decode(encode(s)) == s. Live projection, the gateway's resume
path and the audit all go through these two functions.
"""
from __future__ import annotations


def encode_text(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def decode_text(stored: bytes | memoryview) -> str:
    return bytes(stored).decode("utf-8", "surrogatepass")
