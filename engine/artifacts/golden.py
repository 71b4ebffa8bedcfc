"""Golden prompts: a model version's own quality check, run greedily on the engine.

`golden.json` lives in the model directory, so the manifest lists it and it is
part of the version's content hash:

    {"format": "ledgerlm-golden/1",
     "prompts": [{"name": "capital",
                  "messages": [{"role": "user", "content": "The capital of France is?"}],
                  "maxOutputTokens": 24,                  # optional, default 32
                  "expect": {"contains": "Paris"}}]}      # or {"exact": "<the whole greedy output>"}

Prompts are rendered with the model's chat template (as the gateway renders
`messages`) and decoded greedily, so a result depends only on the files.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from engine.errors import ArtifactError, RequestError
from engine.request import EngineRequest, SamplingParams

GOLDEN_FILE = "golden.json"
GOLDEN_FORMAT = "ledgerlm-golden/1"
DEFAULT_MAX_OUTPUT_TOKENS = 32
ROLES = ("system", "user", "assistant")
PROMPT_KEYS = frozenset({"name", "messages", "maxOutputTokens", "expect"})

ExpectKind = Literal["exact", "contains"]


@dataclass(frozen=True)
class GoldenPrompt:
    name: str
    messages: tuple[tuple[str, str], ...]  # (role, content)
    max_output_tokens: int
    expect_kind: ExpectKind
    expect_text: str

    def accepts(self, output: str) -> bool:
        return output == self.expect_text if self.expect_kind == "exact" else self.expect_text in output


@dataclass(frozen=True)
class GoldenResult:
    """One prompt's outcome; the output itself is not kept (logs and events never carry output text)."""

    name: str
    passed: bool
    output_chars: int
    expect_kind: ExpectKind


@dataclass(frozen=True)
class GoldenReport:
    results: tuple[GoldenResult, ...]

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)

    @property
    def failures(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.results if not r.passed)


def load_golden(model_dir: str | Path, expected_sha256: str | None = None) -> tuple[GoldenPrompt, ...]:
    """Parse `golden.json` of a model directory, from bytes checked against `expected_sha256` when given."""
    path = Path(model_dir) / GOLDEN_FILE
    if not path.is_file():
        raise ArtifactError(str(path), "no golden prompts (golden.json missing)")
    data = path.read_bytes()
    if expected_sha256 is not None and hashlib.sha256(data).hexdigest() != expected_sha256:
        raise ArtifactError(str(path), "SHA-256 does not match the registered checksum")
    return parse_golden(data, str(path))


def parse_golden(data: bytes, path: str = GOLDEN_FILE) -> tuple[GoldenPrompt, ...]:
    """The prompts of a golden.json document; `ArtifactError` naming the file and the bad entry otherwise."""
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ArtifactError(path, f"not UTF-8 JSON ({type(exc).__name__})") from None
    if not isinstance(doc, dict) or doc.get("format") != GOLDEN_FORMAT:
        raise ArtifactError(path, f"expected an object with format {GOLDEN_FORMAT!r}")
    prompts = doc.get("prompts")
    if not isinstance(prompts, list) or not prompts:
        raise ArtifactError(path, "'prompts' must be a non-empty list")
    parsed = tuple(_prompt(entry, f"prompts[{i}]", path) for i, entry in enumerate(prompts))
    names = [p.name for p in parsed]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ArtifactError(path, f"prompt names must be unique; repeated: {', '.join(duplicates)}")
    return parsed


def _prompt(entry: Any, where: str, path: str) -> GoldenPrompt:
    def bad(reason: str) -> ArtifactError:
        return ArtifactError(path, f"{where}: {reason}")

    if not isinstance(entry, dict):
        raise bad("must be an object")
    unknown = sorted(set(entry) - PROMPT_KEYS)
    if unknown:
        raise bad(f"unknown field(s) {', '.join(unknown)}")
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise bad("'name' must be a non-empty string")
    messages = entry.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("'messages' must be a non-empty list")
    pairs = []
    for j, message in enumerate(messages):
        if (not isinstance(message, dict) or set(message) != {"role", "content"} or message["role"] not in ROLES
                or not isinstance(message["content"], str)):
            raise bad(f"messages[{j}] must be {{'role': one of {ROLES}, 'content': string}}")
        pairs.append((message["role"], message["content"]))
    limit = entry.get("maxOutputTokens", DEFAULT_MAX_OUTPUT_TOKENS)
    if type(limit) is not int or limit < 1:
        raise bad("'maxOutputTokens' must be an integer >= 1")
    expect = entry.get("expect")
    if not isinstance(expect, dict) or len(expect) != 1 or next(iter(expect)) not in ("exact", "contains"):
        raise bad("'expect' must be exactly one of {'exact': text} or {'contains': text}")
    kind, text = next(iter(expect.items()))
    if not isinstance(text, str) or (kind == "contains" and not text):
        raise bad(f"'expect.{kind}' must be a {'non-empty ' if kind == 'contains' else ''}string")
    return GoldenPrompt(name, tuple(pairs), limit, kind, text)


def render(tokenizer: Any, prompt: GoldenPrompt) -> tuple[int, ...]:
    """Token ids of the prompt through the chat template, as the gateway renders `messages`."""
    rendered = tokenizer.apply_chat_template([{"role": r, "content": c} for r, c in prompt.messages],
                                             add_generation_prompt=True, tokenize=True)
    ids = rendered["input_ids"] if hasattr(rendered, "keys") else rendered
    return tuple(int(t) for t in ids)


def run_golden(engine: Any, prompts: tuple[GoldenPrompt, ...]) -> GoldenReport:
    """Run every prompt greedily on `engine` (an idle `Engine`) and check each output."""
    texts: dict[str, list[str]] = {}
    for prompt in prompts:
        request_id = f"golden:{prompt.name}"
        params = SamplingParams(max_tokens=prompt.max_output_tokens, temperature=0.0)
        try:
            engine.add_request(EngineRequest(request_id, render(engine.tokenizer, prompt), params,
                                             tenant_id="golden", scope_key="golden"))
        except RequestError as exc:
            raise RequestError(f"golden prompt {prompt.name!r}: {exc}") from None
        texts[request_id] = []
    while engine.has_unfinished():
        for output in engine.step():
            if output.request_id in texts:
                texts[output.request_id].append(output.text_delta)
    results = []
    for prompt in prompts:
        output = "".join(texts[f"golden:{prompt.name}"])
        results.append(GoldenResult(prompt.name, prompt.accepts(output), len(output), prompt.expect_kind))
    return GoldenReport(tuple(results))
