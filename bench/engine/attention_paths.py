"""One decode step's attention on the gather and flex paths (`engine.attention_choice.time_paths`), over a
grid of batch sizes, contexts and model shapes, on this machine's device. One JSON line per point on stdout;
with --json PATH also one document {"attention_paths": [...]}. Usage (the same on a GPU):

    python -m bench.engine.attention_paths [--device cuda] [--block-size 16] [--reps 10] [--json PATH]
"""
from __future__ import annotations

import argparse
import json

from plumbing.compute_threads import passive_compute_threads

passive_compute_threads()  # before torch loads
import torch  # noqa: E402

from engine.attention import AttentionShape  # noqa: E402
from engine.attention_choice import time_paths  # noqa: E402

# name: (heads, KV heads, head dim, layers)
SHAPES = {
    "demo-tiny": (4, 2, 16, 2),
    "demo-small": (8, 2, 64, 8),
    "smollm2-135m": (9, 3, 64, 30),
}


def sweep(device: str, dtype: torch.dtype, block_size: int, reps: int, batches=(1, 8, 32),
          contexts=(256, 1024), shapes=tuple(SHAPES)) -> list[dict]:
    rows = []
    for name in shapes:
        heads, kv_heads, head_dim, layers = SHAPES[name]
        shape = AttentionShape(heads, kv_heads, head_dim, block_size)
        for context in contexts:
            for batch in batches:
                row = {"shape": name, **time_paths(shape, batch, context, torch.device(device), dtype, layers, reps)}
                row["flex_over_gather"] = round(row["flex_step_ms"] / row["gather_step_ms"], 3)
                print(json.dumps(row), flush=True)
                rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, float32 on a CPU")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--json", default=None, help="write the rows here as one JSON document")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype) if args.dtype else torch.bfloat16 if args.device == "cuda" else torch.float32
    rows = sweep(args.device, dtype, args.block_size, args.reps, shapes=tuple(args.shapes.split(",")))
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"attention_paths": rows}, out, indent=1)


if __name__ == "__main__":
    main()
