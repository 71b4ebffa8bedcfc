"""`ledgerlm bench engine [--quick] --json PATH`: this engine vs transformers (`--structured`: with a grammar)."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from ledgerlm.cli.errors import CliError
from plumbing.compute_threads import passive_compute_threads


def register_engine(bench: argparse._SubParsersAction) -> None:
    engine = bench.add_parser("engine", help="this engine vs transformers generate / continuous batching")
    engine.add_argument("--json", required=True, type=Path, help="where to write the report")
    engine.add_argument("--quick", action="store_true", help="16 shorter requests; finishes in under a minute")
    engine.add_argument("--model-dir", type=Path, default=Path(".ledgerlm/models/small"),
                        help="small demo model (built here if missing)")
    engine.add_argument("--model", default=None,
                        help="a known model (e.g. smollm2-135m-instruct, pulled and imported once) instead of "
                             "--model-dir; its targets are 2x generate and a decode step within 1.5x its bound")
    engine.add_argument("--contenders", default="engine,hf_generate,hf_continuous")
    engine.add_argument("--max-num-batched-tokens", type=int, default=2048,
                        help="per-step token budget for this engine and for transformers continuous batching")
    engine.add_argument("--seed", type=int, default=0)
    engine.add_argument("--structured", action="store_true",
                        help="instead: batch of 8 with a JSON schema vs without (llguidance and xgrammar), and "
                             "the compile time of a 30-field schema")
    engine.set_defaults(handler=run_engine_bench)


def run_engine_bench(args: argparse.Namespace) -> int:
    # Must precede the first torch import. With the default (spinning) wait
    # policy, 2 OpenMP threads on a 2-core machine shared with other processes
    # ran the quick engine run 4x slower (21.7 s vs 5.2 s) than with PASSIVE.
    passive_compute_threads()  # before torch loads, inherited by the roles
    from bench.engine.run import run_bench

    contenders = tuple(c.strip() for c in args.contenders.split(",") if c.strip())
    unknown = set(contenders) - {"engine", "hf_generate", "hf_continuous"}
    if unknown:
        raise CliError(f"unknown contenders: {', '.join(sorted(unknown))}")
    model_dir, targets = args.model_dir, None
    if args.model is not None:
        from engine.errors import ArtifactError
        from ledgerlm.model_pull import PullError, pull
        from plumbing.settings import Settings

        try:
            model_dir = pull(args.model, Settings().home, lambda msg: print(msg, flush=True))[1].model_dir
        except (PullError, ArtifactError) as exc:
            raise CliError(f"--model {args.model}: {exc}") from None
        targets = {"ratio_vs_hf_generate": 2.0, "decode_step_ratio_to_bound_batch8": 1.5}
    if args.structured:
        from bench.engine.run import ensure_model
        from bench.engine.structured import run_structured_bench

        report = run_structured_bench(ensure_model(Path(model_dir)), quick=args.quick)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        runs = report["runs"]
        print(json.dumps({"output_tok_s": {k: v.get("output_tok_s") for k, v in runs.items()},
                          "slowdown": {k: v.get("slowdown_vs_plain") for k, v in runs.items() if k != "plain"},
                          "grammar_share_of_wall": {k: v.get("grammar_share_of_wall") for k, v in runs.items()
                                                    if k != "plain"},
                          "compile_30_fields_ms": {k: v.get("median_ms")
                                                   for k, v in report["compile_30_fields"].items()},
                          "targets_met": report["targets_met"]}))
        print(f"wrote {args.json}")
        return 0
    report = run_bench(model_dir, quick=args.quick, contenders=contenders, seed=args.seed,
                       max_num_batched_tokens=args.max_num_batched_tokens, targets=targets)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: report.get(k) for k in ("ratio_vs_hf_generate", "ratio_vs_hf_continuous",
                                                  "decode_step_ratio_to_bound_batch8", "targets_met")}))
    print(f"wrote {args.json}")
    return 0
