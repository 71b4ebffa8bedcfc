"""A native stream's events and their two wire forms: SSE frames and WebSocket messages.

Apart from the queue and the transports (`delivery.py`) and the source (`native/streams.py`), so each of those
builds events without importing the others. Token events are every stream's hot path: `token_event`
writes their JSON directly, the same text json.dumps would write.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from producers.gateway.streams.generation_view import FinalEvent


@dataclass(frozen=True)
class StreamEvent:
    kind: str  # "token" | "final" | "error"
    data: dict
    seq: int | None = None
    encoded: str | None = None  # `data` as JSON when it was built that way (token events: the hot path)

    def as_message(self) -> dict:
        """The WebSocket form: the SSE event name as `type`, then its data."""
        return {"type": self.kind, **self.data}


def sse(event: str, data: dict, event_id: int | None = None, encoded: str | None = None) -> bytes:
    head = f"id: {event_id}\n" if event_id is not None else ""
    body = encoded if encoded is not None else json.dumps(data, separators=(',', ':'))
    return f"{head}event: {event}\ndata: {body}\n\n".encode()


def final_payload(final: FinalEvent, generation_id: str) -> dict:
    usage = final.usage
    return {"id": generation_id, "reason": final.reason, "seq": final.seq, "usageLabel": final.usage_label,
            "usage": {"inputTokens": usage.processed_input_tokens, "cachedInputTokens": usage.cached_input_tokens,
                      "outputTokens": usage.generated_output_tokens}}


_quote = json.encoder.encode_basestring_ascii  # what json.dumps writes for a str, without its dispatch


def logprob_entries(entries) -> list[dict]:
    """The native form of `schemas.stream.TokenLogprob`s: {tokenId, logprob, top: [[id, logprob], ...]}."""
    return [{"tokenId": e.token_id, "logprob": e.logprob, "top": [list(pair) for pair in e.top]} for e in entries]


def token_event(generation_id: str, epoch: int, seq: int, token_ids, text: str, token_count: int,
                logprobs=None, prompt_logprobs=None, choice: int = 0, choice_end: str | None = None) -> StreamEvent:
    """A token event; `logprobs` / `promptLogprobs` appear only when the generation asked for them, `choice`
    (absent: 0) and `choiceEnd` only for a generation of n > 1 choices."""
    ids = list(token_ids)
    quoted = _quote(text)
    data = {"generationId": generation_id, "epoch": epoch, "seq": seq, "tokenIds": ids, "text": text,
            "textDelta": text, "tokenCount": token_count}
    if logprobs is not None or prompt_logprobs is not None or choice or choice_end is not None:
        if logprobs is not None:
            data["logprobs"] = logprob_entries(logprobs)
        if prompt_logprobs is not None:
            data["promptLogprobs"] = logprob_entries(prompt_logprobs)
        if choice or choice_end is not None:
            data["choice"] = choice
            data["choiceEnd"] = choice_end
        return StreamEvent("token", data, seq)
    # The same JSON json.dumps would write for `data`, formatted directly: every streamed token passes here.
    encoded = (f'{{"generationId":{_quote(generation_id)},"epoch":{epoch:d},"seq":{seq:d},'
               f'"tokenIds":[{",".join(map(str, ids))}],"text":{quoted},"textDelta":{quoted},'
               f'"tokenCount":{token_count:d}}}')
    return StreamEvent("token", data, seq, encoded)


def buffered_event(generation_id: str, epoch: int, row, token_count: int) -> StreamEvent:
    """A token event from the resume buffer (`producers.gateway.database.BufferedEvent`)."""
    return token_event(generation_id, epoch, row.seq, row.token_ids, row.text, token_count, row.logprobs(),
                       row.logprobs("prompt_logprobs"), row.choice, row.choice_end)
