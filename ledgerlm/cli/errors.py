"""The CLI's one user-facing error type."""


class CliError(Exception):
    """A user-facing failure: printed as one line, exit code 2."""
