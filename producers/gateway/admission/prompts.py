"""Effective prompts: the pinned version's own tokenizer and chat template turn a request into token ids.

The gateway follows `llm.models`; the tokenizer of a version is loaded once
from its registered directory after the tokenizer files' checksums match the
registration, so the gateway counts exactly the tokens the worker will run. It
is loaded ahead of the first request, as soon as a live worker serves the
version (`ModelCatalog.warm`).
The payload hash covers what makes two requests the same generation: the
model name asked for (a version or an alias), effective token ids, limits and
sampling (not `stream`, which is delivery).

An alias is rendered with the tokenizer of any member: `models alias` admits
only versions that share tokenizer and chat template, which is what makes
these token ids valid for whichever version the controller then draws.
"""
from __future__ import annotations

import hashlib
import json
import logging
import threading
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from engine.errors import RequestError
from engine.request import StructuredOutput
from producers.gateway.admission.requests import GenerationRequest, logit_bias_pairs
from producers.gateway.errors import ApiError
from producers.model_registry import TOKENIZER_FILES
from schemas.envelope import Envelope
from schemas.model_book import ModelBook
from schemas.registry_events import ModelVersionRegistered
from schemas.values import SamplingParams

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EffectivePrompt:
    token_ids: tuple[int, ...]
    sampling: SamplingParams
    payload_hash: str
    # What the generation reserves and may produce: a scored prompt (`sampling.prompt_only`) reserves 1.
    max_output_tokens: int


def sha256_file(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def payload_hash(version: str, token_ids: tuple[int, ...], max_output_tokens: int, sampling: SamplingParams) -> str:
    # Defaults are left out of `sampling`: a sampling field added later keeps old requests' hashes.
    canonical = json.dumps({"version": version, "tokens": list(token_ids), "maxOutputTokens": max_output_tokens,
                            "sampling": sampling.model_dump(mode="json", exclude_defaults=True)},
                           sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def vocab_size(registered: ModelVersionRegistered, tokenizer) -> int:
    """The model's vocabulary as registered (config.json), else the tokenizer's (older registrations)."""
    registered_size = registered.runtime.get("vocab_size", "")
    return int(registered_size) if registered_size.isdigit() else len(tokenizer)


def check_logit_bias(bias: tuple[tuple[int, float], ...], vocab: int, version: str) -> None:
    outside = next((t for t, _ in bias if not 0 <= t < vocab), None)
    if outside is not None:
        raise ApiError(400, "invalid_request",
                       f"logit_bias token id {outside} is outside the vocabulary of {version}: [0, {vocab})",
                       {"field": "logitBias", "vocabSize": vocab})


def check_stop_token_ids(ids: list[int], vocab: int, version: str) -> None:
    """ApiError 400 naming stopTokenIds for an id the model cannot produce: the engine would refuse it."""
    outside = next((t for t in ids if not 0 <= t < vocab), None)
    if outside is not None:
        raise ApiError(400, "invalid_request",
                       f"stop token id {outside} is outside the vocabulary of {version}: [0, {vocab})",
                       {"field": "stopTokenIds", "vocabSize": vocab})


def template_input(tokenizer, messages: list, tools: list[dict] | None) -> tuple[list[dict], list[dict] | None]:
    """Messages and tools as the chat template takes them. A template that never mentions tools is given
    them as a system message, and earlier tool calls as <tool_call> text, so the model sees them either way."""
    dumped = [m.model_dump(exclude_none=True) for m in messages]
    if "tools" in (getattr(tokenizer, "chat_template", None) or "") or not (
            tools or any("tool_calls" in m for m in dumped)):
        return dumped, tools
    from producers.gateway.openai.tools import tools_system_prompt

    for m in dumped:
        calls = m.pop("tool_calls", None) or []
        m.pop("tool_call_id", None)
        m["content"] = m.get("content", "") + "".join(
            f"<tool_call>{json.dumps({'name': c['function']['name'], 'arguments': c['function']['arguments']})}"
            f"</tool_call>" for c in calls if isinstance(c.get("function"), dict))
    if tools:
        prompt = tools_system_prompt(tools)
        if dumped and dumped[0]["role"] == "system":
            dumped[0]["content"] = dumped[0]["content"] + "\n\n" + prompt
        else:
            dumped.insert(0, {"role": "system", "content": prompt})
    return dumped, None


@dataclass(frozen=True)
class ModelTarget:
    """What a request's `model` names: one version, or an alias of versions sharing tokenizer and template."""

    name: str
    renderer: ModelVersionRegistered  # whose tokenizer renders the prompt (any member of an alias)
    max_context_tokens: int  # an alias: the smallest context of the members it can draw
    created_at: datetime


class ModelCatalog:
    """`llm.models` as followed (versions, aliases) and the loaded tokenizers."""

    def __init__(self) -> None:
        self.book = ModelBook()
        self._tokenizers: dict[str, Any] = {}
        self._grammar_tokenizers: dict[str, Any] = {}
        self._lock = threading.Lock()  # held while a tokenizer loads: never taken on the event loop
        self._warming: set[str] = set()  # loading now, or failed once (the requests then report why)
        self._warming_lock = threading.Lock()

    @property
    def versions(self) -> dict[str, ModelVersionRegistered]:
        return self.book.versions

    def observe(self, event: Envelope) -> None:
        self.book.observe(event)

    def target(self, name: str) -> ModelTarget:
        registered = self.book.versions.get(name)
        if registered is not None:
            return ModelTarget(name, registered, registered.max_context_tokens, registered.registered_at)
        members = [self.book.versions[version] for version in self.book.members(name)]
        if not members:
            raise ApiError(404, "unknown_model", f"{name!r} is neither a registered model version nor an alias of one",
                           {"model": name})
        return ModelTarget(name, members[0], min(m.max_context_tokens for m in members),
                           self.book.aliases[name].set_at)

    def versions_of(self, name: str) -> tuple[str, ...]:
        """The concrete versions a request naming `name` may run on."""
        return (name,) if name in self.book.versions else tuple(self.book.members(name))

    def names(self) -> list[str]:
        """Every name a request may use now (versions and aliases with a member to draw), sorted."""
        return sorted(name for name in self.book.names() if name in self.book.versions or self.book.members(name))

    def tokenizer(self, registered: ModelVersionRegistered):
        with self._lock:
            if registered.model_version not in self._tokenizers:
                self._tokenizers[registered.model_version] = self._load(registered)
            return self._tokenizers[registered.model_version]

    def warm(self, versions) -> None:
        """Load the tokenizers of `versions` (ones a live worker serves) on a thread of their own, once each, so
        the first requests for a version do not wait for its loading: several seconds on a busy machine, during
        which every request for it queues behind the lock (a burst's first admissions took 5.7 s). Cheap to
        call on every heartbeat; it never waits on the event loop."""
        for version in versions:
            registered = self.book.versions.get(version)
            if registered is None or version in self._tokenizers:
                continue
            with self._warming_lock:
                if version in self._warming:
                    continue
                self._warming.add(version)
            threading.Thread(target=self._warm, args=(registered,), name="tokenizer-warm", daemon=True).start()

    def _warm(self, registered: ModelVersionRegistered) -> None:
        try:
            self.tokenizer(registered)
        except Exception as exc:  # not tried again: a request for it tries, and answers why (503 model_unavailable)
            log.warning("tokenizer warm-up failed version=%s error=%s", registered.model_version, type(exc).__name__)
            return
        with self._warming_lock:
            self._warming.discard(registered.model_version)

    def grammar_tokenizer(self, registered: ModelVersionRegistered):
        """llguidance's tokenizer for the version (built once, ~0.7 s for a 49k vocabulary)."""
        from engine.structured import llg_tokenizer

        tokenizer = self.tokenizer(registered)
        with self._lock:
            if registered.model_version not in self._grammar_tokenizers:
                eos = tokenizer.eos_token_id
                self._grammar_tokenizers[registered.model_version] = llg_tokenizer(
                    tokenizer, vocab_size(registered, tokenizer), [eos] if isinstance(eos, int) else [])
            return self._grammar_tokenizers[registered.model_version]

    def check_structured(self, registered: ModelVersionRegistered, spec) -> None:
        """ApiError 400 naming responseFormat when the grammar engine cannot compile `spec` for this version."""
        from engine.structured import check_structured

        try:
            check_structured(StructuredOutput(spec.kind, spec.spec, spec.strict), self.grammar_tokenizer(registered))
        except RequestError as exc:
            raise ApiError(400, "invalid_response_format", str(exc), {"field": "responseFormat"}) from None

    @staticmethod
    def _load(registered: ModelVersionRegistered):
        from transformers import AutoTokenizer

        if not registered.source_uri:
            raise ApiError(503, "model_unavailable", f"{registered.model_version} has no registered location")
        root = Path(registered.source_uri)
        for name in TOKENIZER_FILES:
            want = registered.checksums.get(name)
            if want is not None and (not (root / name).is_file() or sha256_file(root / name) != want):
                raise ApiError(503, "model_unavailable",
                               f"{registered.model_version}: {name} does not match its registered checksum")
        return AutoTokenizer.from_pretrained(root, local_files_only=True)

    def encode(self, target: ModelTarget, text: str | None, messages: list | None,
               tools: list[dict] | None = None) -> tuple[int, ...]:
        """The effective prompt's token ids: `messages` (and `tools`) through the chat template (opening the
        assistant's turn), else `text` as the tokenizer encodes it."""
        tokenizer = self.tokenizer(target.renderer)
        if messages is not None:
            conversation, template_tools = template_input(tokenizer, messages, tools)
            try:
                rendered = tokenizer.apply_chat_template(conversation, tools=template_tools,
                                                         add_generation_prompt=True, tokenize=True)
            except Exception as exc:  # the template's own refusal (roles out of order, a tool it cannot show)
                raise ApiError(400, "invalid_request", f"the chat template of {target.name} cannot render these "
                               f"messages: {type(exc).__name__}: {str(exc)[:300]}", {"field": "messages"}) from None
            ids = rendered["input_ids"] if isinstance(rendered, dict) or hasattr(rendered, "keys") else rendered
        else:
            ids = tokenizer(text)["input_ids"]
        return tuple(int(t) for t in ids)

    def render(self, request: GenerationRequest, max_tokens_per_request: int) -> EffectivePrompt:
        """Token ids of the effective prompt, with limits checked (ApiError 400/404 otherwise)."""
        target = self.target(request.model)
        tokenizer = self.tokenizer(target.renderer)
        token_ids = self.encode(target, request.input, request.messages, request.tools)
        if not token_ids:
            raise ApiError(400, "empty_input", "the effective prompt has no tokens", {"field": "input"})
        max_output_tokens = max(request.max_output_tokens, 1)  # a scored prompt reserves one token
        total = len(token_ids) + max_output_tokens
        if total > target.max_context_tokens:
            raise ApiError(400, "context_length_exceeded",
                           f"{len(token_ids)} input + {max_output_tokens} output tokens exceed the context "
                           f"of {target.max_context_tokens}",
                           {"field": "maxOutputTokens", "inputTokens": len(token_ids),
                            "limit": target.max_context_tokens})
        total = len(token_ids) + max_output_tokens * request.n
        if total > max_tokens_per_request:
            raise ApiError(400, "tenant_limit_exceeded",
                           f"{total} tokens exceed the tenant's limit of {max_tokens_per_request} per request",
                           {"field": "maxOutputTokens", "inputTokens": len(token_ids),
                            "limit": max_tokens_per_request})
        vocab = vocab_size(target.renderer, tokenizer)
        check_stop_token_ids(request.stop_token_ids, vocab, target.name)
        bias = logit_bias_pairs(request.logit_bias)
        check_logit_bias(bias, vocab, target.name)
        structured = request.response_format.spec() if request.response_format is not None else None
        if structured is not None:
            self.check_structured(target.renderer, structured)
        sampling = SamplingParams(temperature=request.temperature, top_p=request.top_p, top_k=request.top_k,
                                  seed=request.seed, stop=request.stop_strings(),
                                  stop_token_ids=tuple(request.stop_token_ids), ignore_eos=request.ignore_eos,
                                  min_tokens=request.min_tokens, presence_penalty=request.presence_penalty,
                                  frequency_penalty=request.frequency_penalty,
                                  repetition_penalty=request.repetition_penalty, logit_bias=bias,
                                  logprobs=request.logprobs, prompt_logprobs=request.prompt_logprobs,
                                  prompt_only=request.prompt_only, structured=structured, n=request.n)
        return EffectivePrompt(token_ids, sampling,
                               payload_hash(target.name, token_ids, max_output_tokens, sampling), max_output_tokens)
