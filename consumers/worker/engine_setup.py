"""The worker's engine: built from Settings for a registered version, its files checked against the version."""
from __future__ import annotations

import logging
import os

from plumbing.settings import Settings
from schemas.registry_events import ModelVersionRegistered

log = logging.getLogger(__name__)


def engine_config(settings: Settings, checksums=None, weights: dict[str, float] | None = None):
    """The worker's engine settings: pool size (`auto` or bytes), reservation policy, limits."""
    from engine.config import EngineConfig
    from engine.kv_sizing import MemoryPolicy

    return EngineConfig(kv_cache_bytes=settings.worker_kv_pool_bytes,
                        reservation=settings.worker_reservation,
                        free_block_watermark=settings.worker_free_block_watermark,
                        max_num_seqs=settings.worker_max_num_seqs,
                        batch_step_tokens=settings.worker_batch_step_tokens,
                        max_model_len=settings.worker_max_model_len, device=settings.worker_device,
                        tenant_weights=weights if weights is not None else {}, expected_checksums=checksums,
                        memory=MemoryPolicy(gpu_fraction=settings.worker_memory_fraction,
                                            cpu_share=settings.worker_cpu_kv_share,
                                            cpu_cap_bytes=settings.worker_cpu_kv_cap_bytes))


def load_engine(settings: Settings, model: ModelVersionRegistered, model_dir: str | None = None,
                weights: dict[str, float] | None = None):
    """The engine for a registered version; the files must match the registered checksums.

    Refuses (EngineError) a pool that cannot hold one request of the engine's max_model_len.
    """
    from engine.engine import Engine
    from engine.kv_sizing import check_holds_one_request

    engine = Engine(model_dir or model.source_uri, engine_config(settings, model.checksums, weights))
    if engine.device.type == "cpu":
        import torch

        if settings.worker_cpu_threads is not None:
            torch.set_num_threads(settings.worker_cpu_threads)
        log.info("engine cpu threads=%d wait_policy=%s", torch.get_num_threads(),
                 os.environ.get("OMP_WAIT_POLICY", "default"))
    check_holds_one_request(engine.kv_spec.num_blocks, engine.config.block_size, engine.max_model_len,
                            engine.kv_size.how)
    log.info("kv pool bytes=%d blocks=%d tokens=%d how=%s", engine.kv_spec.num_blocks * engine.config.block_size
             * engine.kv_spec.bytes_per_token, engine.kv_spec.num_blocks,
             engine.kv_spec.num_blocks * engine.config.block_size, engine.kv_size.how)
    return engine
