"""One OpenAI answer from a generation's pieces: the whole body, or its stream of chunks.

    pieces: Piece (text, tokens, logprobs; prompt logprobs first) ... then End (usage) | None (no end in time)
      ├─ answer(): one chat.completion / text_completion body
      └─ stream(): data: {chunk} lines ... [finish chunk] [usage chunk] data: [DONE]

Completions with `echo` put the prompt before the output (as its own first chunk when streaming, with its
token logprobs once the prompt's scores have arrived); `continuous_usage_stats` puts the usage so far on
every chunk; vLLM's `prompt_logprobs` go top level (chat) or in the choice (completions).
"""
from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from producers.gateway.errors import ApiError
from producers.gateway.openai_chunks import (
    CompletionLogprobs, End, Piece, TokenTexts, chat_logprobs, echo_entries, output_entries, prompt_logprobs_vllm,
    sse_chunk,
)
from producers.gateway.openai_requests import CompletionRequest, OpenAIRequest
from schemas.stream import TokenLogprob

log = logging.getLogger(__name__)


@dataclass
class Reply:
    """What shapes one answer: the request, the effective prompt's tokens, and token texts for logprobs."""

    generation_id: str
    model: str
    body: OpenAIRequest
    prompt_token_ids: tuple[int, ...]
    texts: TokenTexts | None
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def chat(self) -> bool:
        return not isinstance(self.body, CompletionRequest)

    @property
    def echo(self) -> bool:
        return isinstance(self.body, CompletionRequest) and self.body.echo

    @property
    def wants_logprobs(self) -> bool:
        return self.body.output_logprobs() is not None

    def usage_so_far(self, completion_tokens: int) -> dict:
        prompt = len(self.prompt_token_ids)
        return {"prompt_tokens": prompt, "completion_tokens": completion_tokens,
                "total_tokens": prompt + completion_tokens}

    def vllm_prompt_logprobs(self, entries: list[TokenLogprob]) -> list:
        return prompt_logprobs_vllm(self.prompt_token_ids[0], tuple(entries), self.texts)


async def answer(reply: Reply, pieces: AsyncIterator[Piece | End | None]) -> dict:
    """The non-streamed body; ApiError 504 when the generation does not end in time."""
    text: list[str] = []
    outputs: list[TokenLogprob] = []
    prompt: list[TokenLogprob] = []
    async for piece in pieces:
        if isinstance(piece, Piece):
            text.append(piece.text)
            outputs.extend(piece.logprobs or ())
            prompt.extend(piece.prompt_logprobs or ())
        elif piece is None:
            break
        else:
            log.info("openai answer generation=%s finish=%s output_tokens=%d", reply.generation_id,
                     piece.finish_reason, piece.completion_tokens)
            return body_of(reply, "".join(text), outputs, prompt, piece)
    raise ApiError(504, "wait_timeout", "the generation did not end in time", {"generationId": reply.generation_id})


def body_of(reply: Reply, text: str, outputs: list[TokenLogprob], prompt: list[TokenLogprob], end: End) -> dict:
    scored = reply.body.prompt_logprobs is not None
    if reply.chat:
        logprobs = chat_logprobs(tuple(outputs), reply.texts) if reply.wants_logprobs else None
        choice = {"index": 0, "message": {"role": "assistant", "content": text, "refusal": None},
                  "logprobs": logprobs, "finish_reason": end.finish_reason}
        extra = {"prompt_logprobs": reply.vllm_prompt_logprobs(prompt)} if scored else {}
        return {"id": reply.generation_id, "object": "chat.completion", "created": reply.created,
                "model": reply.model, "choices": [choice], "usage": end.usage(), **extra}
    logprobs = None
    if reply.wants_logprobs:
        entries = echo_entries(reply.prompt_token_ids[0], tuple(prompt)) if reply.echo else []
        logprobs = CompletionLogprobs(reply.texts).format(entries + output_entries(tuple(outputs)))
    choice = {"index": 0, "text": (reply.body.prompt if reply.echo else "") + text, "logprobs": logprobs,
              "finish_reason": end.finish_reason}
    if scored:
        choice["prompt_logprobs"] = reply.vllm_prompt_logprobs(prompt)
    return {"id": reply.generation_id, "object": "text_completion", "created": reply.created, "model": reply.model,
            "choices": [choice], "usage": end.usage()}


class ChunkWriter:
    """The chunks of one stream, in order."""

    def __init__(self, reply: Reply) -> None:
        self.reply = reply
        self.kind = "chat.completion.chunk" if reply.chat else "text_completion"
        self.extra = {"usage": None} if reply.body.include_usage else {}
        self.completion_logprobs = CompletionLogprobs(reply.texts) if reply.texts is not None else None
        self.prompt: list[TokenLogprob] = []
        self.prompt_done = False
        self.completion_tokens = 0

    def chunk(self, choices: list[dict], **more) -> bytes:
        r = self.reply
        data = {"id": r.generation_id, "object": self.kind, "created": r.created, "model": r.model,
                "choices": choices, **self.extra, **more}
        if r.body.continuous_usage and choices:
            data["usage"] = r.usage_so_far(self.completion_tokens)
        return sse_chunk(data)

    def choice(self, text: str | None, logprobs: dict | None = None, finish_reason: str | None = None) -> dict:
        if not self.reply.chat:
            return {"index": 0, "text": text or "", "logprobs": logprobs, "finish_reason": finish_reason}
        delta = {} if text is None else {"content": text}
        return {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}

    def opening(self) -> list[bytes]:
        r = self.reply
        if r.chat:
            return [self.chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                 "finish_reason": None}])]
        if r.echo and not r.wants_logprobs:
            return [self.chunk([self.choice(r.body.prompt)])]
        return []

    def on_prompt_logprobs(self, entries: tuple[TokenLogprob, ...]) -> list[bytes]:
        """Prompt scores arrive in pieces before the first token; once all are in, the echo (and vLLM's
        prompt_logprobs) go out."""
        self.prompt.extend(entries)
        r = self.reply
        if self.prompt_done or len(self.prompt) < len(r.prompt_token_ids) - 1:
            return []
        self.prompt_done = True
        extra = {"prompt_logprobs": r.vllm_prompt_logprobs(self.prompt)} if r.body.prompt_logprobs is not None else {}
        if r.echo and r.wants_logprobs:
            logprobs = self.completion_logprobs.format(echo_entries(r.prompt_token_ids[0], tuple(self.prompt)))
            choice = {**self.choice(r.body.prompt, logprobs), **extra}
            return [self.chunk([choice])]
        if extra:
            if r.chat:
                return [self.chunk([self.choice(None)], **extra)]
            return [self.chunk([{**self.choice(""), **extra}])]
        return []

    def on_tokens(self, piece: Piece) -> list[bytes]:
        self.completion_tokens = max(self.completion_tokens, piece.token_count)
        logprobs = None
        if self.reply.wants_logprobs and piece.logprobs is not None:
            if self.reply.chat:
                logprobs = chat_logprobs(piece.logprobs, self.reply.texts)
            else:
                logprobs = self.completion_logprobs.format(output_entries(piece.logprobs))
        if not piece.text and logprobs is None:
            return []
        return [self.chunk([self.choice(piece.text, logprobs)])]

    def on_end(self, end: End) -> list[bytes]:
        self.completion_tokens = end.completion_tokens
        out = [self.chunk([self.choice(None, None, end.finish_reason)])]
        if self.reply.body.include_usage:
            out.append(sse_chunk({"id": self.reply.generation_id, "object": self.kind, "created": self.reply.created,
                                  "model": self.reply.model, "choices": [], "usage": end.usage()}))
        return out


async def stream(reply: Reply, pieces: AsyncIterator[Piece | End | None]) -> AsyncIterator[bytes]:
    writer = ChunkWriter(reply)
    for chunk in writer.opening():
        yield chunk
    async for piece in pieces:
        if isinstance(piece, Piece):
            chunks = writer.on_prompt_logprobs(piece.prompt_logprobs) if piece.prompt_logprobs is not None else []
            for chunk in chunks + writer.on_tokens(piece):
                yield chunk
        elif piece is None:
            error = {"message": "the generation did not end in time", "type": "server_error", "param": None,
                     "code": "stream_timeout"}
            yield sse_chunk({"error": error})
            break
        else:
            log.info("openai stream end generation=%s finish=%s output_tokens=%d", reply.generation_id,
                     piece.finish_reason, piece.completion_tokens)
            for chunk in writer.on_end(piece):
                yield chunk
    yield b"data: [DONE]\n\n"
