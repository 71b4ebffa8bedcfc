"""Typed errors raised by the engine library."""
from __future__ import annotations


class EngineError(Exception):
    """Base class of every error the engine raises on purpose."""


class ArtifactError(EngineError):
    """A model directory is unusable: a file is missing, tampered with or unsupported.

    `path` names the offending file (or the directory) so operators can act on it.
    """

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class RequestError(EngineError):
    """A request is invalid for this engine (too long, bad sampling values, duplicate id).

    `field` names the offending request field (a `SamplingParams` name) when there is one.
    """

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field
