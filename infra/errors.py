"""Typed failures of the local service manager; the CLI prints them as one line."""


class InfraError(Exception):
    """A local service could not be prepared, started, stopped or reached."""
