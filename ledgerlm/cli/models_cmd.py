"""`ledgerlm models build-demo|manifest|verify`: offline model directories for the engine."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ledgerlm.cli.errors import CliError


def register(subparsers: argparse._SubParsersAction) -> None:
    models = subparsers.add_parser(
        "models", help="model directories and versions (import, pull, demo build, manifests, register, qualify, "
                       "alias)").add_subparsers(dest="action", required=True)
    build = models.add_parser("build-demo", help="build a seeded demo Llama model and tokenizer, no network")
    build.add_argument("--out", required=True, type=Path, help="directory to create (must not exist or be empty)")
    build.add_argument("--size", choices=("tiny", "small", "mini"), default="tiny",
                       help="tiny 0.16M / small 31M parameters (contexts 512 / 2,048); mini 4.9M, 8,192 context")
    build.add_argument("--train-steps", type=int, default=None, help="CPU training steps (default per size)")
    build.add_argument("--seed", type=int, default=0)
    build.add_argument("--max-context", type=int, default=None,
                       help="context length in tokens (default: the size's)")
    build.set_defaults(handler=run_build_demo)

    manifest = models.add_parser("manifest", help="write manifest.json (SHA-256 of every file) for a trusted checkpoint")
    manifest.add_argument("dir", type=Path)
    manifest.set_defaults(handler=run_manifest)

    verify = models.add_parser("verify", help="check a model directory against its manifest and load it")
    verify.add_argument("dir", type=Path)
    verify.set_defaults(handler=run_verify)

    from ledgerlm.cli.model_register_cmd import add_register_parser  # control plane (issue 4)

    add_register_parser(models)

    from ledgerlm.cli.model_import_cmd import add_import_parsers  # real checkpoints (issue 11)

    add_import_parsers(models)

    from ledgerlm.cli.model_rollout_cmd import add_rollout_parsers  # quality gate and aliases (issue 11)

    add_rollout_parsers(models)


def run_build_demo(args: argparse.Namespace) -> int:
    from engine.artifacts.demo_model import SIZES, build_demo_model

    if args.train_steps is not None and args.train_steps < 0:
        raise CliError("--train-steps must be >= 0")
    if args.max_context is not None and args.max_context < 1:
        raise CliError("--max-context must be >= 1")
    steps = SIZES[args.size].default_train_steps if args.train_steps is None else args.train_steps
    print(f"building {args.size} demo model into {args.out} (seed {args.seed}, {steps} training steps)")
    try:
        out = build_demo_model(args.out, size=args.size, train_steps=steps, seed=args.seed,
                               progress=sys.stderr.isatty(), log=print, max_context=args.max_context)
    except FileExistsError as exc:
        raise CliError(str(exc)) from None
    print(f"wrote {out} (manifest.json lists every file's SHA-256)")
    return 0


def run_manifest(args: argparse.Namespace) -> int:
    from engine.artifacts.model_dir import write_manifest

    if not args.dir.is_dir():
        raise CliError(f"{args.dir} is not a directory")
    files = write_manifest(args.dir)
    print(f"wrote {args.dir / 'manifest.json'} ({len(files)} files)")
    return 0


def run_verify(args: argparse.Namespace) -> int:
    from engine.artifacts.model_dir import load_artifacts
    from engine.errors import ArtifactError

    try:
        artifacts = load_artifacts(args.dir)
    except ArtifactError as exc:
        raise CliError(f"refused: {exc}") from None
    d = artifacts.dims
    print(f"ok: {artifacts.config.model_type}, {d.num_layers} layers, hidden {d.hidden_size}, "
          f"{d.num_heads} heads / {d.num_kv_heads} KV heads, vocab {d.vocab_size}, {len(artifacts.checksums)} files")
    return 0
