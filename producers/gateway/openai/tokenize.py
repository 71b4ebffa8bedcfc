"""vLLM's `POST /tokenize` and `POST /detokenize`, with the model version's own tokenizer and chat template.

    /tokenize   {model, prompt} | {model, messages}  ->  {count, max_model_len, tokens, token_strs}
    /detokenize {model, tokens}                      ->  {prompt}

The token ids are exactly those a completion (or chat completion) of the same input would run and bill.
"""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from producers.gateway.admission.prompts import ModelCatalog, vocab_size
from producers.gateway.errors import ApiError
from producers.gateway.openai.requests import ChatMessage


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1, max_length=256)
    prompt: str | None = Field(default=None, max_length=200_000)
    messages: list[ChatMessage] | None = Field(default=None, min_length=1, max_length=256)
    return_token_strs: bool = False
    # vLLM's; only their defaults are served (the template opens the assistant's turn; special tokens as a
    # completion adds them)
    add_special_tokens: bool | None = None
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None
    chat_template: Any = None
    chat_template_kwargs: Any = None
    tools: Any = None
    mm_processor_kwargs: Any = None

    @model_validator(mode="after")
    def one_input(self) -> "TokenizeRequest":
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("exactly one of 'prompt' or 'messages' is required")
        return self

    def check_supported(self) -> None:
        chat = self.messages is not None
        neutral = {"add_special_tokens": (None, not chat), "add_generation_prompt": (None, True),
                   "continue_final_message": (None, False), "chat_template": (None,),
                   "chat_template_kwargs": (None, {}), "tools": (None, []), "mm_processor_kwargs": (None,)}
        for name, values in neutral.items():
            value = getattr(self, name)
            if not any(value == v and isinstance(value, bool) == isinstance(v, bool) for v in values):
                raise ApiError(400, "unsupported_parameter", f"{name}={value!r} is not supported here",
                               {"field": name})


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1, max_length=256)
    tokens: list[int] = Field(max_length=1_000_000)


def tokenize(catalog: ModelCatalog, body: TokenizeRequest) -> dict:
    body.check_supported()
    target = catalog.target(body.model)
    messages = None if body.messages is None else [m.native() for m in body.messages]
    ids = catalog.encode(target, body.prompt, messages)
    strs = catalog.tokenizer(target.renderer).convert_ids_to_tokens(list(ids)) if body.return_token_strs else None
    return {"count": len(ids), "max_model_len": target.max_context_tokens, "tokens": list(ids), "token_strs": strs}


def detokenize(catalog: ModelCatalog, body: DetokenizeRequest) -> dict:
    target = catalog.target(body.model)
    tokenizer = catalog.tokenizer(target.renderer)
    vocab = vocab_size(target.renderer, tokenizer)
    outside = next((t for t in body.tokens if not 0 <= t < vocab), None)
    if outside is not None:
        raise ApiError(400, "invalid_request", f"token id {outside} is outside the vocabulary of {target.name}: "
                       f"[0, {vocab})", {"field": "tokens"})
    return {"prompt": tokenizer.decode(body.tokens)}
