"""One OpenAI answer from a generation's pieces: the whole body, or its stream of chunks.

    pieces: Piece (text, tokens, logprobs; prompt logprobs first) ... then End (usage) | None (no end in time)
      ├─ answer(): one chat.completion / text_completion body
      └─ stream(): data: {chunk} lines ... [finish chunk] [usage chunk] data: [DONE]

Completions with `echo` put the prompt before the output (as its own first chunk when streaming, with its
token logprobs once the prompt's scores have arrived); `continuous_usage_stats` puts the usage so far on
every chunk; vLLM's `prompt_logprobs` go top level (chat) or in the choice (completions). With `n` > 1 each
piece names its choice (chunks carry it as `index`) and a choice's last piece its end; the usage (one
generation's) counts every choice's output.
"""
from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from producers.gateway.errors import ApiError
from producers.gateway.openai.chunks import (
    FINISH_REASONS, CompletionLogprobs, End, Piece, TokenTexts, chat_logprobs, echo_entries, output_entries,
    prompt_logprobs_vllm, sse_chunk,
)
from producers.gateway.openai.requests import CompletionRequest, OpenAIRequest
from producers.gateway.openai.tools import ToolMode, tool_calls_of
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
    tools: ToolMode | None = None
    created: int = field(default_factory=lambda: int(time.time()))

    def call_id(self, choice: int) -> str:
        return f"call-{self.generation_id}-{choice}"

    def tool_message(self, choice: int, text: str, finish_reason: str) -> tuple[dict, str]:
        """The assistant message for `text` and its finish reason: tool calls where the text holds them."""
        message = {"role": "assistant", "content": text, "refusal": None}
        if self.tools is None:
            return message, finish_reason
        calls, content = tool_calls_of(text, self.tools, self.call_id(choice))
        if not calls:
            return message, finish_reason
        return {**message, "content": content, "tool_calls": calls}, (
            "tool_calls" if finish_reason == "stop" else finish_reason)

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

    @property
    def n(self) -> int:
        return self.body.n or 1

    def vllm_prompt_logprobs(self, entries: list[TokenLogprob]) -> list:
        return prompt_logprobs_vllm(self.prompt_token_ids[0], tuple(entries), self.texts)


@dataclass
class ChoiceAnswer:
    text: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    end: str | None = None  # the native end reason of this choice (n > 1)


async def answer(reply: Reply, pieces: AsyncIterator[Piece | End | None]) -> dict:
    """The non-streamed body; ApiError 504 when the generation does not end in time."""
    choices = [ChoiceAnswer() for _ in range(reply.n)]
    prompt: list[TokenLogprob] = []
    async for piece in pieces:
        if isinstance(piece, Piece):
            choice = choices[piece.choice]
            choice.text.append(piece.text)
            choice.logprobs.extend(piece.logprobs or ())
            choice.end = piece.choice_end or choice.end
            prompt.extend(piece.prompt_logprobs or ())
        elif piece is None:
            break
        else:
            log.info("openai answer generation=%s finish=%s output_tokens=%d", reply.generation_id,
                     piece.finish_reason, piece.completion_tokens)
            return body_of(reply, choices, prompt, piece)
    raise ApiError(504, "wait_timeout", "the generation did not end in time", {"generationId": reply.generation_id})


def finish_of(end_reason: str | None, end: End) -> str:
    return FINISH_REASONS.get(end_reason, end_reason) if end_reason else end.finish_reason


def body_of(reply: Reply, choices: list[ChoiceAnswer], prompt: list[TokenLogprob], end: End) -> dict:
    scored = reply.body.prompt_logprobs is not None
    if reply.chat:
        rendered = []
        for i, c in enumerate(choices):
            message, finish = reply.tool_message(i, "".join(c.text), finish_of(c.end, end))
            rendered.append({"index": i, "message": message, "finish_reason": finish, "logprobs": chat_logprobs(
                tuple(c.logprobs), reply.texts) if reply.wants_logprobs else None})
        extra = {"prompt_logprobs": reply.vllm_prompt_logprobs(prompt)} if scored else {}
        return {"id": reply.generation_id, "object": "chat.completion", "created": reply.created,
                "model": reply.model, "choices": rendered, "usage": end.usage(), **extra}
    rendered = []
    for i, c in enumerate(choices):
        logprobs = None
        if reply.wants_logprobs:
            entries = echo_entries(reply.prompt_token_ids[0], tuple(prompt)) if reply.echo else []
            logprobs = CompletionLogprobs(reply.texts).format(entries + output_entries(tuple(c.logprobs)))
        choice = {"index": i, "text": (reply.body.prompt if reply.echo else "") + "".join(c.text),
                  "logprobs": logprobs, "finish_reason": finish_of(c.end, end)}
        if scored:
            choice["prompt_logprobs"] = reply.vllm_prompt_logprobs(prompt)
        rendered.append(choice)
    return {"id": reply.generation_id, "object": "text_completion", "created": reply.created, "model": reply.model,
            "choices": rendered, "usage": end.usage()}


class ChunkWriter:
    """The chunks of one stream, in order."""

    def __init__(self, reply: Reply) -> None:
        self.reply = reply
        self.kind = "chat.completion.chunk" if reply.chat else "text_completion"
        self.extra = {"usage": None} if reply.body.include_usage else {}
        # Per choice: `text_offset` runs on across its chunks.
        self.completion_logprobs = [CompletionLogprobs(reply.texts) for _ in range(reply.n)] \
            if reply.texts is not None else None
        self.prompt: list[TokenLogprob] = []
        self.prompt_done = False
        self.completion_tokens = 0
        self.finished: set[int] = set()
        # Tool modes: the text each choice produced (required/auto: parsed at its end), and whether a named
        # call's opening delta (id, name) went out.
        self.tool_text: dict[int, list[str]] = {}
        self.call_opened: set[int] = set()

    def chunk(self, choices: list[dict], **more) -> bytes:
        r = self.reply
        data = {"id": r.generation_id, "object": self.kind, "created": r.created, "model": r.model,
                "choices": choices, **self.extra, **more}
        if r.body.continuous_usage and choices:
            data["usage"] = r.usage_so_far(self.completion_tokens)
        return sse_chunk(data)

    def choice(self, index: int, text: str | None, logprobs: dict | None = None,
               finish_reason: str | None = None) -> dict:
        if not self.reply.chat:
            return {"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish_reason}
        delta = {} if text is None else {"content": text}
        return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}

    def opening(self) -> list[bytes]:
        r = self.reply
        if r.chat:
            return [self.chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                 "finish_reason": None}]) for i in range(r.n)]
        if r.echo and not r.wants_logprobs:
            return [self.chunk([self.choice(i, r.body.prompt)]) for i in range(r.n)]
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
            out = []
            for i in range(r.n):
                logprobs = self.completion_logprobs[i].format(echo_entries(r.prompt_token_ids[0], tuple(self.prompt)))
                out.append(self.chunk([{**self.choice(i, r.body.prompt, logprobs), **extra}]))
            return out
        if extra:
            if r.chat:
                return [self.chunk([self.choice(0, None)], **extra)]
            return [self.chunk([{**self.choice(0, ""), **extra}])]
        return []

    def on_tokens(self, piece: Piece) -> list[bytes]:
        self.completion_tokens = max(self.completion_tokens, piece.token_count)
        logprobs = None
        if self.reply.wants_logprobs and piece.logprobs is not None:
            if self.reply.chat:
                logprobs = chat_logprobs(piece.logprobs, self.reply.texts)
            else:
                logprobs = self.completion_logprobs[piece.choice].format(output_entries(piece.logprobs))
        out = []
        if self.reply.tools is not None:
            out.extend(self.tool_delta(piece.choice, piece.text))
        elif piece.text or logprobs is not None:
            out.append(self.chunk([self.choice(piece.choice, piece.text, logprobs)]))
        if piece.choice_end is not None:
            out.extend(self.finish(piece.choice, FINISH_REASONS.get(piece.choice_end, piece.choice_end)))
        return out

    def tool_delta(self, index: int, text: str) -> list[bytes]:
        """A named call streams its arguments as they come; other tool modes wait for the choice's end."""
        self.tool_text.setdefault(index, []).append(text)
        if self.reply.tools.kind != "named" or not text:
            return []
        out = []
        if index not in self.call_opened:
            self.call_opened.add(index)
            opening = {"index": 0, "id": f"{self.reply.call_id(index)}-0", "type": "function",
                       "function": {"name": self.reply.tools.names[0], "arguments": ""}}
            out.append(self.chunk([{"index": index, "delta": {"tool_calls": [opening]}, "logprobs": None,
                                    "finish_reason": None}]))
        out.append(self.chunk([{"index": index, "delta": {"tool_calls": [{"index": 0, "function": {
            "arguments": text}}]}, "logprobs": None, "finish_reason": None}]))
        return out

    def finish(self, index: int, finish_reason: str) -> list[bytes]:
        """The end of one choice: in a tool mode its calls (or its text) first, then the finish reason."""
        self.finished.add(index)
        out = []
        if self.reply.tools is not None:
            message, finish_reason = self.reply.tool_message(index, "".join(self.tool_text.get(index, [])),
                                                             finish_reason)
            if self.reply.tools.kind != "named":  # a named call's arguments went out as they came
                if message["content"]:
                    out.append(self.chunk([self.choice(index, message["content"])]))
                if message.get("tool_calls"):
                    deltas = [{"index": j, **call} for j, call in enumerate(message["tool_calls"])]
                    out.append(self.chunk([{"index": index, "delta": {"tool_calls": deltas}, "logprobs": None,
                                            "finish_reason": None}]))
        out.append(self.chunk([self.choice(index, None, None, finish_reason)]))
        return out

    def on_end(self, end: End) -> list[bytes]:
        self.completion_tokens = end.completion_tokens
        out = [chunk for i in range(self.reply.n) if i not in self.finished
               for chunk in self.finish(i, end.finish_reason)]
        if self.reply.body.include_usage:
            out.append(sse_chunk({"id": self.reply.generation_id, "object": self.kind, "created": self.reply.created,
                                  "model": self.reply.model, "choices": [], "usage": end.usage()}))
        return out


async def stream(reply: Reply, pieces: AsyncIterator[Piece | End | None]) -> AsyncIterator[bytes]:
    writer = ChunkWriter(reply)
    for chunk in writer.opening():
        yield chunk
    try:
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
    except ApiError as exc:  # the 200 went out: e.g. database_unavailable reading the resume buffer of a repeat
        log.warning("openai stream source refused generation=%s code=%s", reply.generation_id, exc.code)
        yield sse_chunk({"error": {"message": exc.message, "type": "server_error", "param": None, "code": exc.code}})
    yield b"data: [DONE]\n\n"
