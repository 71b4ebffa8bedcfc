"""Secret files of a local stack and how secrets are shown.

A secret file is created with mode 0600 from its first byte (O_CREAT with
0o600, then renamed into place): never written world-readable and chmodded
afterwards, when another user may already have opened it.
"""
from __future__ import annotations

import os
import secrets
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

REDACTED = "***"


def write_secret_file(path: Path, text: str) -> None:
    """Write `text` to `path` (mode 0600) atomically: readers see the old file or the whole new one."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


def generated_secret(path: Path) -> str:
    """The secret kept in `path`, made (32 random URL-safe characters) the first time it is asked for."""
    if not path.is_file():
        write_secret_file(path, secrets.token_urlsafe(24) + "\n")
    return path.read_text().strip()


def redact_url(url: str | None) -> str | None:
    """`url` with any password replaced by ***, for status output and logs."""
    if not url:
        return url
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=f"{user}:{REDACTED}@{host}"))
