"""`ledgerlm bench engine --structured`: what a JSON schema costs the engine, with llguidance and with xgrammar.

* throughput: 8 concurrent greedy requests (chat prompts asking for JSON), the same token budget each, run
  without a constraint, then with a JSON schema under each grammar engine (xgrammar plugged into the engine
  through the same `fill_mask` / `accept` / `done` surface as `engine.structured.Grammar`). The schema asks for
  at least 64 list items, so every run produces its full `max_tokens` and the runs compare step for step.
  Reported: output tok/s, the median decode step at batch 8, and the slowdown against the unconstrained run.
* compile: a 30-field schema (strings, integers, numbers, booleans, arrays), compiled `repeats` times from
  nothing, to its first token mask (llguidance compiles lazily: the first mask is part of its cost).
* mask: per-token cost of fill-mask + consume over the tokens the schema run produced, and inside the runs the
  time each step spent on grammar work (masks filled and applied, tokens consumed) against its length: on a
  shared machine the tok/s of separate runs drift with the neighbours' load, the share of a step does less.
  The three runs alternate for `rounds` rounds; each reports the median of its rounds.
"""
from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

TARGET_SLOWDOWN = 0.10  # the target: with a schema at most 10% slower at batch 8
BATCH = 8
LIST_SCHEMA = {"type": "object", "additionalProperties": False, "required": ["notes"],
               "properties": {"notes": {"type": "array", "minItems": 64,
                                        "items": {"type": "string", "maxLength": 24}}}}
QUESTIONS = ["List facts about the sea.", "List facts about mountains.", "List kinds of bread.",
             "List famous rivers.", "List uses of copper.", "List types of clouds.", "List garden birds.",
             "List board games."]


def log(msg: str) -> None:
    print(f"[bench engine --structured] {msg}", file=sys.stderr, flush=True)


def thirty_field_schema() -> dict:
    kinds = ["string", "integer", "number", "boolean"]
    props = {}
    for i in range(30):
        kind = kinds[i % 4]
        props[f"field_{i}"] = {"type": kind} if i % 5 else {"type": "array", "items": {"type": kind}, "maxItems": 3}
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


class XGrammarGrammar:
    """One sequence's xgrammar matcher behind `engine.structured.Grammar`'s surface (same int32 bitmask layout)."""

    def __init__(self, matcher) -> None:
        self.matcher = matcher

    def fill_mask(self, bitmask: torch.Tensor, row: int) -> None:
        self.matcher.fill_next_token_bitmask(bitmask, row)

    def accept(self, token: int) -> bool:
        return bool(self.matcher.accept_token(token))

    @property
    def done(self) -> bool:
        return self.matcher.is_terminated()


class XGrammarCompiler:
    def __init__(self, hf_tokenizer, vocab_size: int) -> None:
        import xgrammar

        self.xgr = xgrammar
        info = xgrammar.TokenizerInfo.from_huggingface(hf_tokenizer, vocab_size=vocab_size)
        self.compiler = xgrammar.GrammarCompiler(info)

    def compile(self, schema: str):
        return self.compiler.compile_json_schema(schema, any_whitespace=False, strict_mode=True)

    def grammar(self, structured) -> XGrammarGrammar:
        return XGrammarGrammar(self.xgr.GrammarMatcher(self.compile(structured.spec)))


def prompts(engine, max_tokens: int) -> list[tuple[int, ...]]:
    tokenizer = engine.tokenizer
    out = []
    for question in QUESTIONS[:BATCH]:
        messages = [{"role": "user", "content": f"{question} Answer in JSON with a key notes."}]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        out.append(tuple(int(t) for t in (ids["input_ids"] if hasattr(ids, "keys") else ids)))
    return out


class GrammarClock:
    """Time spent in grammar work during engine steps: mask fill + apply (engine.logits) and token consumption."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def install(self):
        import engine.logits as logits

        original = logits.apply_grammar_masks

        def timed(*args):
            t0 = time.perf_counter()
            try:
                return original(*args)
            finally:
                self.seconds += time.perf_counter() - t0

        logits.apply_grammar_masks = timed
        return lambda: setattr(logits, "apply_grammar_masks", original)

    def wrap(self, compiler):
        clock = self

        class Timed:
            def grammar(self, structured):
                inner = compiler.grammar(structured)

                class TimedGrammar:
                    def fill_mask(self, bitmask, row):
                        inner.fill_mask(bitmask, row)

                    def accept(self, token):
                        t0 = time.perf_counter()
                        try:
                            return inner.accept(token)
                        finally:
                            clock.seconds += time.perf_counter() - t0

                    @property
                    def done(self):
                        return inner.done

                return TimedGrammar()

            def __getattr__(self, name):
                return getattr(compiler, name)

        return Timed()


def run_batch(engine, token_prompts, max_tokens: int, structured, label: str) -> dict:
    from engine.request import EngineRequest, SamplingParams

    clock = GrammarClock()
    uninstall = clock.install()
    compiler = engine.grammars
    engine.grammars = clock.wrap(compiler)
    try:
        result = _run_batch(engine, token_prompts, max_tokens, structured, label)
    finally:
        uninstall()
        engine.grammars = compiler
    result["grammar_s"] = round(clock.seconds, 3)
    result["grammar_share_of_wall"] = round(clock.seconds / result["wall_s"], 4)
    return result


def _run_batch(engine, token_prompts, max_tokens: int, structured, label: str) -> dict:
    from engine.request import EngineRequest, SamplingParams

    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, structured=structured)
    t0 = time.perf_counter()
    for i, prompt in enumerate(token_prompts):
        engine.add_request(EngineRequest(f"{label}-{i}", prompt, params))
    tokens: dict[str, list[int]] = {}
    texts: dict[str, str] = {}
    steps: list[float] = []
    while engine.has_unfinished():
        s0 = time.perf_counter()
        outputs = engine.step()
        elapsed = time.perf_counter() - s0
        if len(outputs) == BATCH and all(o.num_output_tokens > 1 for o in outputs):
            steps.append(elapsed)
        for o in outputs:
            tokens.setdefault(o.request_id, []).extend(o.new_token_ids)
            texts[o.request_id] = texts.get(o.request_id, "") + o.text_delta
    wall = time.perf_counter() - t0
    produced = sum(len(t) for t in tokens.values())
    valid_prefix = all(text.startswith('{"notes": [') for text in texts.values()) if structured else None
    return {"output_tokens": produced, "wall_s": wall, "output_tok_s": round(produced / wall, 2),
            "decode_step_ms_batch8_median": round(statistics.median(steps) * 1e3, 2) if steps else None,
            "decode_steps_measured": len(steps), "json_prefix_ok": valid_prefix,
            "_tokens": tokens}


def compile_times(engine, repeats: int) -> dict:
    import llguidance

    from engine.structured import Grammar

    schema = json.dumps(thirty_field_schema())
    vocab = engine.artifacts.dims.vocab_size
    out = {}
    llg_tokenizer = engine.grammars.tokenizer
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        text = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults={"whitespace_flexible": False})
        matcher = llguidance.LLMatcher(llg_tokenizer, text)
        Grammar(matcher).fill_mask(torch.full((1, (vocab + 31) // 32), -1, dtype=torch.int32), 0)
        samples.append(time.perf_counter() - t0)
    out["llguidance"] = {"median_ms": round(statistics.median(samples) * 1e3, 2),
                         "max_ms": round(max(samples) * 1e3, 2)}
    try:
        xgr = XGrammarCompiler(engine.tokenizer, vocab)
        samples = []
        for _ in range(repeats):
            xgr.compiler.clear_cache()
            t0 = time.perf_counter()
            matcher = xgr.xgr.GrammarMatcher(xgr.compile(schema))
            mask = xgr.xgr.allocate_token_bitmask(1, vocab)
            matcher.fill_next_token_bitmask(mask, 0)
            samples.append(time.perf_counter() - t0)
        out["xgrammar"] = {"median_ms": round(statistics.median(samples) * 1e3, 2),
                           "max_ms": round(max(samples) * 1e3, 2)}
    except ImportError as exc:
        out["xgrammar"] = {"error": f"{type(exc).__name__}: {exc} (pip install xgrammar: the bench extra)"}
    return out


def mask_cost(engine, compiler, structured, token_lists: list[list[int]]) -> dict:
    """Mean fill-mask + accept time per token, replaying the schema run's own tokens."""
    vocab = engine.artifacts.dims.vocab_size
    bitmask = torch.full((1, (vocab + 31) // 32), -1, dtype=torch.int32)
    samples = []
    for tokens in token_lists:
        grammar = compiler.grammar(structured)
        for token in tokens:
            t0 = time.perf_counter()
            grammar.fill_mask(bitmask, 0)
            grammar.accept(token)
            samples.append(time.perf_counter() - t0)
    return {"mean_us": round(statistics.fmean(samples) * 1e6, 1), "p95_us": round(
        sorted(samples)[int(len(samples) * 0.95)] * 1e6, 1), "tokens": len(samples)}


def median_run(runs: list[dict]) -> dict:
    """The run of median throughput, with every round's tok/s beside it."""
    chosen = dict(sorted(runs, key=lambda r: r["output_tok_s"])[len(runs) // 2])
    chosen["wall_s"] = round(chosen["wall_s"], 3)
    chosen["output_tok_s_rounds"] = [r["output_tok_s"] for r in runs]
    return chosen


def run_structured_bench(model_dir: Path, quick: bool = False, rounds: int = 2) -> dict:
    from engine.config import EngineConfig
    from engine.engine import Engine
    from engine.request import StructuredOutput

    max_tokens = 32 if quick else 96
    engine = Engine(model_dir, EngineConfig(kv_cache_bytes=1 << 30, device="cpu", dtype="float32"))
    token_prompts = prompts(engine, max_tokens)
    structured = StructuredOutput("json_schema", json.dumps(LIST_SCHEMA))
    report: dict = {
        "benchmark": "engine-structured", "quick": quick, "model_dir": str(model_dir), "batch": BATCH,
        "max_tokens": max_tokens, "greedy": True, "device": "cpu", "dtype": "float32",
        "torch_threads": torch.get_num_threads(), "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default"),
        "machine": platform.machine(), "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "schema": LIST_SCHEMA, "runs": {},
    }
    log("warm-up")
    run_batch(engine, token_prompts[:1] * 1, 4, None, "warmup")
    engine.grammars.grammar(structured)  # builds llguidance's tokenizer outside the timed runs
    runs = report["runs"]
    report["rounds"] = rounds
    xgr = None
    try:
        xgr = XGrammarCompiler(engine.tokenizer, engine.artifacts.dims.vocab_size)
    except ImportError as exc:
        runs["xgrammar"] = {"error": f"{type(exc).__name__}: {exc} (pip install xgrammar: the bench extra)"}
    llg = engine.grammars
    rounds_of: dict[str, list[dict]] = {"plain": [], "llguidance": [], "xgrammar": []}
    for round_ in range(rounds):
        log(f"round {round_ + 1}/{rounds}: unconstrained batch of 8")
        rounds_of["plain"].append(run_batch(engine, token_prompts, max_tokens, None, f"plain{round_}"))
        log(f"round {round_ + 1}/{rounds}: json schema, llguidance")
        rounds_of["llguidance"].append(run_batch(engine, token_prompts, max_tokens, structured, f"llg{round_}"))
        if xgr is not None:
            log(f"round {round_ + 1}/{rounds}: json schema, xgrammar")
            engine.grammars = xgr
            try:
                rounds_of["xgrammar"].append(run_batch(engine, token_prompts, max_tokens, structured, f"xgr{round_}"))
            finally:
                engine.grammars = llg
    for name, done in rounds_of.items():
        if done:
            runs[name] = median_run(done)
    llg_tokens = list(runs["llguidance"]["_tokens"].values())
    plain = runs["plain"]["output_tok_s"]
    for name in ("llguidance", "xgrammar"):
        if "output_tok_s" in runs[name]:
            runs[name]["slowdown_vs_plain"] = round(1 - runs[name]["output_tok_s"] / plain, 3)
            runs[name]["same_tokens_as_llguidance"] = (list(runs[name]["_tokens"].values())
                                                       == list(runs["llguidance"]["_tokens"].values()))
    for run in runs.values():
        run.pop("_tokens", None)
    report["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    log("compile times (30-field schema)")
    report["compile_30_fields"] = compile_times(engine, 5 if quick else 20)
    report["mask_per_token"] = {"llguidance": mask_cost(engine, engine.grammars, structured, llg_tokens)}
    if xgr is not None:
        report["mask_per_token"]["xgrammar"] = mask_cost(engine, xgr, structured, llg_tokens)
    slowdown = runs["llguidance"].get("slowdown_vs_plain")
    report["targets"] = {"slowdown_vs_plain_batch8": TARGET_SLOWDOWN}
    report["targets_met"] = slowdown is not None and slowdown <= TARGET_SLOWDOWN
    report["grammar_engine_in_use"] = "llguidance"
    return report
