"""Slow garbage collections are said in the log (plumbing/telemetry/collections.py)."""
from __future__ import annotations

import gc
import logging

from plumbing.telemetry.collections import log_slow_collections


def test_a_collection_at_or_over_the_threshold_is_logged_with_its_generation(caplog):
    callback = log_slow_collections(slow_s=0.0)
    try:
        with caplog.at_level(logging.WARNING, logger="plumbing.telemetry.collections"):
            gc.collect(2)
    finally:
        gc.callbacks.remove(callback)
    assert any("slow garbage collection generation=2" in r.getMessage() for r in caplog.records)


def test_a_quick_collection_is_not_logged(caplog):
    callback = log_slow_collections(slow_s=60.0)
    try:
        with caplog.at_level(logging.WARNING, logger="plumbing.telemetry.collections"):
            gc.collect(0)
    finally:
        gc.callbacks.remove(callback)
    assert not [r for r in caplog.records if "slow garbage collection" in r.getMessage()]
