"""`IncrementalDetokenizer`: text deltas from a growing list of token ids.

Byte-level tokens can end in the middle of a UTF-8 character; decoding such
a prefix yields U+FFFD. A delta is emitted only once the decoded text no
longer ends in U+FFFD, so a client never receives half a character. Decoding
starts a few tokens back (`prefix_offset`) because some tokenizers render a
token differently depending on its left neighbour (leading spaces).

Stop strings: the text is searched after each delta; the match and anything
after it are dropped. Until the request finishes, the last
`len(longest stop) - 1` characters are held back, since they may be the
start of a stop string that the next token completes.
"""
from __future__ import annotations

from typing import Any

_CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Any, prompt_ids: list[int], stop: tuple[str, ...] = ()) -> None:
        # The Rust tokenizer's decode skips the Python wrapper's per-call overhead.
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self._decode = (
            (lambda ids: backend.decode(ids, skip_special_tokens=True))
            if backend is not None
            else (lambda ids: tokenizer.decode(ids, skip_special_tokens=True))
        )
        self.ids: list[int] = list(prompt_ids[-_CONTEXT_TOKENS:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.stop = stop
        self.holdback = max((len(s) for s in stop), default=1) - 1
        self.text = ""
        self.num_emitted = 0

    def append(self, token_id: int, check_stop: bool = True) -> bool:
        """Add one token; returns True when a stop string was matched (only looked for with `check_stop`)."""
        self.ids.append(token_id)
        prefix_text = self._decode(self.ids[self.prefix_offset : self.read_offset])
        new_text = self._decode(self.ids[self.prefix_offset :])
        if len(new_text) <= len(prefix_text) or new_text.endswith("\ufffd"):
            return False
        delta = new_text[len(prefix_text) :]
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        start = max(0, len(self.text) - self.holdback)
        self.text += delta
        hits = [i for i in (self.text.find(s, start) for s in self.stop) if i >= 0] if check_stop else []
        if hits:
            self.text = self.text[: min(hits)]
            return True
        return False

    def take_delta(self, finished: bool) -> str:
        """Text not yet handed out; everything once the request has finished."""
        end = len(self.text) if finished else max(self.num_emitted, len(self.text) - self.holdback)
        delta = self.text[self.num_emitted : end]
        self.num_emitted = end
        return delta
