"""A private PostgreSQL cluster from Debian's package, under `<home>/postgres/`.

PostgreSQL refuses to run as root, so when we are root the cluster belongs to
the `postgres` system user (created by the Debian package) and every server
binary runs through `runuser`.

Every connection, over TCP or the socket, authenticates with scram-sha-256 as
`postgres` with a password generated at initdb and kept in
`<home>/credentials/postgres-password` (mode 0600). fsync stays on: a crash of
the machine must not corrupt the projections' offsets.
"""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import time
from pathlib import Path

from plumbing.secrets import generated_secret
from infra.errors import InfraError
from infra.ports import free_port, is_port_open
from infra.processes import is_alive
from infra.state import ServiceRecord

OS_USER = "postgres"
HBA = """\
# written by ledgerlm (infra/postgres_node.py): passwords on every connection
local   all   all                  scram-sha-256
host    all   all   127.0.0.1/32   scram-sha-256
host    all   all   ::1/128        scram-sha-256
"""


class PostgresNode:
    def __init__(self, home: Path, database: str) -> None:
        self.dir = home / "postgres"
        self.data = self.dir / "data"
        self.database = database
        self.password_file = home / "credentials" / "postgres-password"

    def password(self) -> str:
        return generated_secret(self.password_file)

    def bin_dir(self) -> Path:
        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=_major_of)
        if not found:
            self._install()
            found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=_major_of)
        if not found:
            raise InfraError("PostgreSQL server binaries not found after apt-get install postgresql")
        return Path(found[-1]).parent

    def _install(self) -> None:
        if os.geteuid() != 0:
            raise InfraError("PostgreSQL is not installed and we are not root: run `sudo apt-get install -y postgresql`")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for argv in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "postgresql"]):
            result = subprocess.run(argv, capture_output=True, text=True, env=env)
            if result.returncode != 0:
                raise InfraError(f"`{' '.join(argv)}` failed: {result.stderr.strip()[-1500:]}")

    def _as_owner(self, argv: list[str]) -> list[str]:
        return ["runuser", "-u", OS_USER, "--", *argv] if os.geteuid() == 0 else argv

    def _run(self, argv: list[str], what: str) -> str:
        result = subprocess.run(self._as_owner(argv), capture_output=True, text=True)
        if result.returncode != 0:
            raise InfraError(f"PostgreSQL {what} failed (exit {result.returncode}): "
                             f"{(result.stderr or result.stdout).strip()[-1500:]}")
        return result.stdout

    def _prepare_dirs(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.dir, OS_USER, OS_USER)
            # The owner must be able to walk down to its data directory.
            for parent in self.dir.parents:
                if parent == Path("/"):
                    break
                parent.chmod(parent.stat().st_mode | 0o011)

    def _initdb(self, bin_dir: Path) -> None:
        if (self.data / "PG_VERSION").exists():
            return
        self._prepare_dirs()
        # initdb reads the password from a file its (non-root) user can open: a 0600 copy, removed at once.
        pwfile = self.dir / "initdb-password"
        pwfile.unlink(missing_ok=True)
        fd = os.open(pwfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(self.password() + "\n")
        if os.geteuid() == 0:
            shutil.chown(pwfile, OS_USER, OS_USER)
        try:
            self._run([str(bin_dir / "initdb"), "-D", str(self.data), "--auth=scram-sha-256", "-U", "postgres",
                       f"--pwfile={pwfile}", "-E", "UTF8", "--no-instructions"], "initdb")
        finally:
            pwfile.unlink(missing_ok=True)

    def server_pid(self) -> int | None:
        pid_file = self.data / "postmaster.pid"
        try:
            pid = int(pid_file.read_text().splitlines()[0])
        except (OSError, ValueError, IndexError):
            return None
        return pid if is_alive(pid) else None

    def start(self, record: ServiceRecord, port: int | None, timeout_s: float) -> ServiceRecord:
        """Start the cluster (idempotent), wait for `SELECT 1`, create the database."""
        running = self.server_pid()
        if running and record.port:
            return ServiceRecord(pid=running, port=record.port)
        bin_dir = self.bin_dir()
        self._initdb(bin_dir)
        if port is not None and is_port_open(port):
            raise InfraError(f"port {port} for PostgreSQL is taken by another process; free it or set LEDGERLM_POSTGRES_PORT")
        port = port or free_port(record.port or 55432)
        self._run([str(bin_dir / "pg_ctl"), "-D", str(self.data), "-l", str(self.dir / "server.log"), "-w",
                   "-t", str(int(timeout_s)), "-o",
                   f"-p {port} -k {self.dir} -c listen_addresses=127.0.0.1 -c max_connections=200",
                   "start"], "start")
        started = ServiceRecord(pid=self.server_pid(), port=port)
        self._wait_ready(port, timeout_s)
        self._require_passwords(port, bin_dir)
        self._ensure_database(port)
        return started

    def _psql(self, port: int, sql: str, database: str = "postgres") -> str:
        psql = shutil.which("psql") or str(self.bin_dir() / "psql")
        result = subprocess.run(
            [psql, "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "-d", database, "-tA", "-v", "ON_ERROR_STOP=1"],
            input=sql, capture_output=True, text=True, env={**os.environ, "PGPASSWORD": self.password()},
        )
        if result.returncode != 0:
            raise InfraError(f"psql failed: {result.stderr.strip()}")
        return result.stdout.strip()

    def _wait_ready(self, port: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if self._psql(port, "SELECT 1") == "1":
                    return
            except InfraError:
                if time.monotonic() > deadline:
                    raise InfraError(f"PostgreSQL did not answer SELECT 1 on port {port}; see {self.dir / 'server.log'}")
            time.sleep(0.2)

    def _require_passwords(self, port: int, bin_dir: Path) -> None:
        """A cluster made before passwords (initdb -A trust) gets the generated password and our pg_hba."""
        hba = self.data / "pg_hba.conf"
        if hba.read_text() == HBA:
            return
        # Still trust: the role needs no password yet to be given one. The literal is ours (URL-safe), and goes
        # to psql on stdin, never on a command line other users can read.
        self._psql(port, f"ALTER ROLE postgres PASSWORD '{self.password()}'")
        hba.write_text(HBA)
        self._run([str(bin_dir / "pg_ctl"), "-D", str(self.data), "reload"], "reload")

    def _ensure_database(self, port: int) -> None:
        exists = self._psql(port, f"SELECT 1 FROM pg_database WHERE datname = '{self.database}'")
        if exists != "1":
            self._psql(port, f'CREATE DATABASE "{self.database}"')

    def stop(self, record: ServiceRecord) -> bool:
        if not self.server_pid():
            return False
        self._run([str(self.bin_dir() / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop"], "stop")
        return True

    def url(self, port: int) -> str:
        """The libpq URL, password included: a secret (`redact_url` before showing it)."""
        return f"postgresql://postgres:{self.password()}@127.0.0.1:{port}/{self.database}"


def _major_of(path: str) -> int:
    part = Path(path).parent.parent.name
    return int(part) if part.isdigit() else 0
