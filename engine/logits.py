"""Logits processors that run before sampling, each batched over only the rows that ask for it.

Order (as vLLM's sampler): `logit_bias` added; then the repetition penalty over prompt and output tokens, the
frequency and presence penalties over output tokens; then the grammar's mask (engine/structured.py). The
sampler then bans min_tokens' stop ids and applies temperature, top-k and top-p.
"""
from __future__ import annotations

import torch

from engine.sequence import Sequence
from engine.structured import apply_grammar_masks


def needs_processing(seqs: list[Sequence]) -> bool:
    return any(s.request.params.logit_bias or s.request.params.penalized or s.grammar is not None for s in seqs)


def process_logits(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    """`logits` [S, V] with each row's processors applied; a copy when any applies, else `logits` itself."""
    if not needs_processing(seqs):
        return logits
    logits = logits.clone()  # the forward's output is an inference tensor, and its raw rows feed logprobs
    apply_logit_bias(logits, seqs)
    apply_penalties(logits, seqs)
    apply_grammar_masks(logits, [s.grammar for s in seqs])
    return logits


def apply_logit_bias(logits: torch.Tensor, seqs: list[Sequence]) -> None:
    ids: list[int] = []
    rows: list[int] = []
    values: list[float] = []
    for row, seq in enumerate(seqs):
        for token, bias in seq.request.params.logit_bias:
            rows.append(row)
            ids.append(token)
            values.append(bias)
    if ids:
        index = (torch.tensor(rows, device=logits.device), torch.tensor(ids, device=logits.device))
        logits.index_put_(index, torch.tensor(values, dtype=logits.dtype, device=logits.device), accumulate=True)


def _counts(token_lists: list[list[int]], vocab: int, device: torch.device) -> torch.Tensor:
    """[R, V] occurrences of each token id per list, from one padded scatter (padding lands in column V)."""
    width = max((len(t) for t in token_lists), default=0)
    index = torch.full((len(token_lists), max(width, 1)), vocab, dtype=torch.long)
    for row, tokens in enumerate(token_lists):
        index[row, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
    counts = torch.zeros((len(token_lists), vocab + 1), device=device)
    counts.scatter_add_(1, index.to(device), torch.ones(index.shape, device=device))
    return counts[:, :vocab]


def apply_penalties(logits: torch.Tensor, seqs: list[Sequence]) -> None:
    rows = [i for i, s in enumerate(seqs) if s.request.params.penalized]
    if not rows:
        return
    vocab, device = logits.shape[-1], logits.device
    params = [seqs[i].request.params for i in rows]
    index = torch.tensor(rows, device=device)
    sub = logits.index_select(0, index)
    if any(p.repetition_penalty != 1 for p in params):
        seen = _counts([seqs[i].token_ids for i in rows], vocab, device) > 0
        penalty = torch.tensor([p.repetition_penalty for p in params], dtype=sub.dtype, device=device)[:, None]
        sub = torch.where(seen, torch.where(sub > 0, sub / penalty, sub * penalty), sub)
    if any(p.frequency_penalty != 0 or p.presence_penalty != 0 for p in params):
        counts = _counts([seqs[i].output_token_ids for i in rows], vocab, device).to(sub.dtype)
        frequency = torch.tensor([p.frequency_penalty for p in params], dtype=sub.dtype, device=device)[:, None]
        presence = torch.tensor([p.presence_penalty for p in params], dtype=sub.dtype, device=device)[:, None]
        sub = sub - frequency * counts - presence * (counts > 0).to(sub.dtype)
    logits.index_copy_(0, index, sub)
