"""Results records, derived from the log like a projection: `llm.generations` + `llm.tokens` -> one
`GenerationResult` per generation end (schemas/intake.py), a pure function of the records seen.

    Admitted ─▶ open (tenant, requestId, version)      TokensEmitted(choice 0) ─▶ text of its epoch
    UsageReported ─▶ watermark of its epoch            AttemptStarted ─▶ current epoch
    StreamFinished ─▶ result: reason, usage and label as the worker wrote them, the epoch's text (and its
                      token events when `Admitted.result_tokens`: the request said `includeTokens`)
    Interrupted ─▶ result "interrupted": the epoch's last watermark (labelled interrupted), the text read
    Rejected ─▶ result "rejected"                      Canceled/Expired before any attempt ─▶ result, usage 0

Completed/Failed and a worker's Canceled/Expired are followed by the worker's StreamFinished (written after
the terminal event is acknowledged), which carries what the result needs; the first end of a generation
wins, so a late record of a dead attempt never makes a second result. Both topics are keyed by generation
id with the same partition count, so one owner sees every record of a generation.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from schemas.envelope import Envelope
from schemas.intake import GenerationResult, ResultToken, ResultUsage
from schemas.lifecycle import Admitted, AttemptStarted, Canceled, Expired, Interrupted, Rejected, UsageReported
from schemas.stream import StreamFinished, TokensEmitted
from schemas.values import Usage

STATUS_OF_REASON = {"completed": "completed", "output-limit": "completed"}


def result_usage(usage: Usage) -> ResultUsage:
    return ResultUsage(input_tokens=usage.processed_input_tokens, cached_input_tokens=usage.cached_input_tokens,
                       output_tokens=usage.generated_output_tokens)


@dataclass
class OpenGeneration:
    """`request_id` None: records of it arrived before its `Admitted` (the two topics are fetched apart)."""

    tenant_id: str
    request_id: str | None = None
    model: str | None = None
    epoch: int = 1
    started: bool = False
    include_tokens: bool = False
    text: dict[int, list[str]] = field(default_factory=dict)
    tokens: dict[int, list[ResultToken]] = field(default_factory=dict)  # kept while they may be asked for
    usage: dict[int, Usage] = field(default_factory=dict)
    ended: dict | None = None  # the result's fields, held until `Admitted` names the request
    end_epoch: int | None = None
    seen_at: float = field(default_factory=time.monotonic)

    def text_of(self, epoch: int) -> str:
        return "".join(self.text.get(epoch, []))

    def observe_tokens(self, event: TokensEmitted) -> None:
        if event.choice == 0 and event.text_delta:
            self.text.setdefault(event.epoch, []).append(event.text_delta)
        if self.include_tokens or self.request_id is None:  # before `Admitted` nobody knows yet
            self.tokens.setdefault(event.epoch, []).append(
                ResultToken(seq=event.seq, token_ids=event.token_ids, text=event.text_delta, choice=event.choice))

    def result(self, fields: dict) -> GenerationResult:
        tokens = None
        if self.include_tokens:
            tokens = tuple(t for t in self.tokens.get(self.end_epoch, []) if t.token_ids or t.text)
        return GenerationResult(request_id=self.request_id, tenant_id=self.tenant_id, model=self.model,
                                tokens=tokens, **fields)


class ResultsDeriver:
    """Open generations of the partitions one publisher owns; `observe` returns a result when one ends."""

    def __init__(self) -> None:
        self.open: dict[str, OpenGeneration] = {}
        self.ended: set[str] = set()  # generations whose result is made; bounded by `sweep`

    def sweep(self, orphan_age_s: float = 120.0, max_ended: int = 200_000) -> list[str]:
        """Forget generations whose `Admitted` never came (records of a generation that ended before where
        this owner started reading): they would otherwise pin the committed offset. Returns their ids."""
        now = time.monotonic()
        orphans = [gid for gid, gen in self.open.items() if gen.request_id is None and now - gen.seen_at > orphan_age_s]
        for gid in orphans:
            del self.open[gid]
        if len(self.ended) > max_ended:
            self.ended.clear()
        return orphans

    def _close(self, gid: str, gen: OpenGeneration) -> GenerationResult:
        del self.open[gid]
        self.ended.add(gid)
        return gen.result(gen.ended)

    def observe(self, event: Envelope) -> GenerationResult | None:
        gid = getattr(event, "generation_id", None)
        if gid is None or gid in self.ended:
            return None
        gen = self.open.get(gid)
        if gen is None:
            gen = self.open[gid] = OpenGeneration(event.tenant_id)
        if isinstance(event, Admitted):
            gen.request_id, gen.model, gen.include_tokens = event.request_id, event.model_version, event.result_tokens
            if not gen.include_tokens:
                gen.tokens.clear()
            return self._close(gid, gen) if gen.ended is not None else None
        if isinstance(event, AttemptStarted):
            gen.epoch, gen.started = max(gen.epoch, event.epoch), True
        elif isinstance(event, TokensEmitted):
            gen.observe_tokens(event)
        elif isinstance(event, UsageReported):
            known = gen.usage.get(event.epoch)
            if known is None or event.usage.generated_output_tokens >= known.generated_output_tokens:
                gen.usage[event.epoch] = event.usage
        else:
            return self._end(gen, event)
        return None

    def _end(self, gen: OpenGeneration, event: Envelope) -> GenerationResult | None:
        fields = self._end_fields(gen, event)
        if fields is None:
            return None
        gen.ended = {"generation_id": event.generation_id, **fields}
        gen.end_epoch = getattr(event, "epoch", None)
        return self._close(event.generation_id, gen) if gen.request_id is not None else None

    @staticmethod
    def _end_fields(gen: OpenGeneration, event: Envelope) -> dict | None:
        if isinstance(event, StreamFinished):
            return {"status": STATUS_OF_REASON.get(event.reason, event.reason), "end_reason": event.reason,
                    "text": gen.text_of(event.epoch), "usage": result_usage(event.usage),
                    "usage_label": event.usage_label}
        if isinstance(event, Interrupted):
            return {"status": "interrupted", "end_reason": "interrupted", "text": gen.text_of(event.epoch),
                    "usage": result_usage(gen.usage.get(event.epoch, Usage())), "usage_label": "interrupted"}
        if isinstance(event, Rejected):
            return {"status": "rejected", "end_reason": "rejected", "error_code": event.error_code,
                    "reason": event.reason, "text": "", "usage": result_usage(Usage()), "usage_label": "final"}
        if isinstance(event, (Canceled, Expired)) and not gen.started:
            reason = "canceled" if isinstance(event, Canceled) else "expired"
            return {"status": reason, "end_reason": reason, "text": "", "usage": result_usage(event.usage),
                    "usage_label": "final"}
        return None
