"""Every projection by name, built from Settings."""
from __future__ import annotations

from datetime import timedelta

from plumbing.settings import Settings
from projections.base import Projection
from projections.lifecycle import LifecycleProjection
from projections.model_versions import ModelVersionsProjection
from projections.stream_buffer import StreamBufferProjection
from projections.tenants import TenantsProjection


def all_projections(settings: Settings) -> list[Projection]:
    return [
        TenantsProjection(),
        ModelVersionsProjection(),
        LifecycleProjection(),
        StreamBufferProjection(keep_events=settings.resume_buffer_events,
                               keep_after_end=timedelta(seconds=settings.resume_buffer_after_end_s)),
    ]


def select(settings: Settings, only: list[str] | None) -> list[Projection]:
    projections = all_projections(settings)
    if not only:
        return projections
    known = {p.name for p in projections}
    unknown = sorted(set(only) - known)
    if unknown:
        raise ValueError(f"unknown projection(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return [p for p in projections if p.name in only]
