"""Engines the device sections build: over the real model's loaded artifacts or a random shape, sized for the
work asked of them, and the attention paths `EngineConfig` offers (when it has an `attention` field)."""
from __future__ import annotations

import dataclasses
import gc

from bench.device.models import LLAMA3_8B, LLAMA3_8B_EIGHTH, Shape, random_artifacts

ATTENTION_VALUES = ("gather", "flex")  # what `auto` picks is one of them (the engine logs which)


def attention_values() -> tuple[str | None, ...]:
    """The attention paths to measure: None when `EngineConfig` has no `attention` field (one path)."""
    from engine.config import EngineConfig

    if "attention" not in {f.name for f in dataclasses.fields(EngineConfig)}:
        return (None,)
    return ATTENTION_VALUES


class ModelSource:
    """One model the sections run: the real directory (artifacts loaded once) or a random shape."""

    def __init__(self, name: str, artifacts_of, shape: Shape | None = None, model_dir=None) -> None:
        self.name, self.shape, self.model_dir = name, shape, model_dir
        self._artifacts_of = artifacts_of

    @classmethod
    def real(cls, real_model) -> "ModelSource":
        from engine.artifacts.model_dir import load_artifacts

        loaded = load_artifacts(real_model.model_dir)
        return cls(real_model.name, lambda dtype, device: loaded, model_dir=real_model.model_dir)

    @classmethod
    def random(cls, ctx) -> "ModelSource":
        """The Llama-3-8B shape on CUDA; its eighth when quick or on a CPU (32 GB of float32 weights is not a
        bench a CPU finishes)."""
        small = ctx.config.quick or ctx.device_dtype()[0].type != "cuda"
        shape = LLAMA3_8B_EIGHTH if small else LLAMA3_8B
        return cls(shape.name, lambda dtype, device: random_artifacts(shape, dtype, device), shape=shape)

    def artifacts(self, dtype, device):
        """The `ModelArtifacts` an engine of this model is built from (the random ones are drawn when read)."""
        return self._artifacts_of(dtype, device)

    def bytes_per_token(self, dtype, device) -> int:
        from engine.kv_cache import kv_bytes_per_token

        d = self.artifacts(dtype, device).dims
        return kv_bytes_per_token(d.num_layers, d.num_kv_heads, d.head_dim, dtype)

    def engine(self, ctx, *, tokens: int | None, max_num_seqs: int, max_num_batched_tokens: int,
               attention: str | None = None, enable_prefix_cache: bool = False, **extra):
        """An engine on the context's device whose pool holds `tokens` (None: sized by `auto`)."""
        from engine.config import EngineConfig
        from engine.engine import Engine
        device, dtype = ctx.device_dtype()
        artifacts = self.artifacts(dtype, device)
        pool = None if tokens is None else tokens * self.bytes_per_token(dtype, device)
        options = dict(kv_cache_bytes=pool, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                       device=str(device), enable_prefix_cache=enable_prefix_cache, **extra)
        if attention is not None:
            options["attention"] = attention
        return Engine(self.model_dir or "", EngineConfig(**options), artifacts=artifacts)


def release(device) -> None:
    """Give an engine's memory back before the next is built (on CUDA the caching allocator keeps it)."""
    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def random_prompt(rng, length: int, vocab: int) -> tuple[int, ...]:
    return tuple(rng.randrange(10, vocab) for _ in range(length))


def drain(engine, request_ids) -> None:
    """Cancel `request_ids` (those still running) and step until the engine is empty."""
    for request_id in request_ids:
        engine.abort(request_id)
    while engine.has_unfinished():
        engine.step()


def peak_memory(device) -> dict:
    import resource

    import torch

    out = {"max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    if device.type == "cuda":
        out.update(max_allocated_bytes=torch.cuda.max_memory_allocated(device),
                   max_reserved_bytes=torch.cuda.max_memory_reserved(device))
    return out
