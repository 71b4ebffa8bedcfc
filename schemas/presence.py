"""Presence on `llm.presence` (key: generation id): how many subscribers one gateway has for one generation.

A gateway writes one when its count goes from 0 to 1 and back to 0, so every gateway knows whether a
generation is watched anywhere before it cancels it for nobody watching (the disconnect grace).
"""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from schemas.envelope import Envelope


class WatchersChanged(Envelope):
    type: Literal["WatchersChanged"] = "WatchersChanged"
    generation_id: str = Field(min_length=1, max_length=128)
    gateway_id: str = Field(min_length=1, max_length=128)
    watchers: int = Field(ge=0)
    ended: bool = False  # the last subscriber left after the final event: nothing is left to cancel
