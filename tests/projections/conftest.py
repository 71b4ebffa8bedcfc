"""Helpers for projection tests: publish synthetic lifecycles, project them, read the rows back."""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from plumbing.kafka.clients import publish
from plumbing.settings import Settings
from projections.lifecycle import LifecycleProjection
from projections.runtime import Projector
from projections.stream_buffer import StreamBufferProjection
from schemas.lifecycle import Admitted, AttemptStarted, Completed, Failed, Interrupted, UsageReported
from schemas.stream import StreamFinished, TokensEmitted
from schemas.topics import GENERATIONS, TOKENS
from schemas.values import Usage

HASH = "cd" * 32


@dataclass
class Gen:
    """Factory for one synthetic generation's events, with increasing event times."""

    tenant_id: str
    generation_id: str
    clock: datetime = field(default_factory=lambda: datetime.now(UTC))

    def _at(self) -> datetime:
        self.clock += timedelta(milliseconds=10)
        return self.clock

    def admitted(self, input_tokens: int = 40, max_output_tokens: int = 200) -> Admitted:
        return Admitted(tenant_id=self.tenant_id, generation_id=self.generation_id, epoch=1,
                        request_id=f"req-{self.generation_id}", model_version="demo@1", input_tokens=input_tokens,
                        max_output_tokens=max_output_tokens, reserved_tokens=input_tokens + max_output_tokens,
                        payload_hash=HASH, occurred_at=self._at())

    def started(self, epoch: int = 1, worker: str = "worker-a") -> AttemptStarted:
        return AttemptStarted(tenant_id=self.tenant_id, generation_id=self.generation_id, epoch=epoch,
                              worker_id=worker, occurred_at=self._at())

    def report(self, seq: int, output: int, input_tokens: int = 40, epoch: int = 1, cached: int = 16,
               recompute: int = 0) -> UsageReported:
        return UsageReported(tenant_id=self.tenant_id, generation_id=self.generation_id, epoch=epoch,
                             report_seq=seq, occurred_at=self._at(),
                             usage=Usage(processed_input_tokens=input_tokens, cached_input_tokens=cached,
                                         generated_output_tokens=output, recompute_tokens=recompute))

    def completed(self, output: int, epoch: int = 1, input_tokens: int = 40) -> Completed:
        return Completed(tenant_id=self.tenant_id, generation_id=self.generation_id, epoch=epoch,
                         finish_reason="stop", occurred_at=self._at(),
                         usage=Usage(processed_input_tokens=input_tokens, cached_input_tokens=16,
                                     generated_output_tokens=output))

    def failed(self, output: int, epoch: int = 1, input_tokens: int = 40) -> Failed:
        return Failed(tenant_id=self.tenant_id, generation_id=self.generation_id, epoch=epoch,
                      occurred_at=self._at(), reason="RuntimeError",
                      usage=Usage(processed_input_tokens=input_tokens, cached_input_tokens=16,
                                  generated_output_tokens=output))

    def interrupted(self, epoch: int = 1) -> Interrupted:
        return Interrupted(tenant_id=self.tenant_id, generation_id=self.generation_id, epoch=epoch,
                           worker_id="worker-a", occurred_at=self._at())

    def tokens(self, seq: int, token_count: int, epoch: int = 1, n: int = 1) -> TokensEmitted:
        return TokensEmitted(tenant_id=self.tenant_id, generation_id=self.generation_id, epoch=epoch, seq=seq,
                             token_ids=tuple(range(n)), text_delta="x" * n, token_count=token_count,
                             occurred_at=self._at())

    def finished(self, seq: int, reason: str = "completed", epoch: int = 1, output: int = 0,
                 at: datetime | None = None) -> StreamFinished:
        return StreamFinished(tenant_id=self.tenant_id, generation_id=self.generation_id, epoch=epoch, seq=seq,
                              reason=reason, usage=Usage(generated_output_tokens=output),
                              usage_label="interrupted" if reason == "interrupted" else "final",
                              occurred_at=at or self._at())


@pytest.fixture
def gen() -> Gen:
    return Gen(tenant_id=f"tenant-{uuid.uuid4().hex[:8]}", generation_id=f"gen-{uuid.uuid4().hex[:12]}")


@pytest.fixture
def emit(producer):
    async def emit_all(*events):
        for event in events:
            topic = TOKENS if isinstance(event, (TokensEmitted, StreamFinished)) else GENERATIONS
            await publish(producer, topic, event)
    return emit_all


@pytest.fixture
async def projection_db(bootstrap, topics, scratch_database_url):
    """A database of this test's own whose projections start at the current end of the log.

    Other tests and other processes (a running projector, the benchmarks) write to the same
    topics; starting at the end keeps their events out of this test's rows and counts.
    """
    from plumbing.kafka.clients import make_consumer, partitions_of
    from projections.offsets import advance
    from projections.registry import all_projections

    consumer = make_consumer(bootstrap)
    await consumer.start()
    try:
        with psycopg.connect(scratch_database_url) as conn:
            for projection in all_projections(Settings()):
                ends = await consumer.end_offsets(await partitions_of(consumer, projection.topic))
                for tp, end in ends.items():
                    advance(conn, projection.name, tp.topic, tp.partition, None, end)
    finally:
        await consumer.stop()
    return scratch_database_url


@pytest.fixture
def conn(projection_db):
    with psycopg.connect(projection_db, autocommit=True) as connection:
        yield connection


@pytest.fixture
def project(bootstrap, projection_db):
    async def run(*projections):
        projector = Projector(bootstrap, projection_db,
                              projections or [LifecycleProjection(), StreamBufferProjection(keep_events=8)])
        try:
            return await projector.catch_up()
        finally:
            projector.close()
    return run


def one(conn: psycopg.Connection, sql: str, *params):
    return conn.execute(sql, params).fetchone()


def all_rows(conn: psycopg.Connection, sql: str, *params):
    return conn.execute(sql, params).fetchall()


@pytest.fixture(scope="session")
def projection_settings() -> Settings:
    return Settings()


@pytest.fixture
def scratch_database_url(scratch_database):
    """A fresh, migrated database: for tests whose projections must not see other tests' rows."""
    from migrations import runner

    runner.upgrade(scratch_database)
    return scratch_database


@pytest.fixture(scope="session")
def stripe_mock():
    """Stripe's own API mock (infra/scripts/stripe-mock.sh installs it into <home>/bin): its base URL.

    It validates every request against Stripe's OpenAPI spec. It cannot be skipped: no binary, or one that
    does not answer, fails the session's export tests with the reason."""
    import socket
    import subprocess

    from plumbing.settings import REPO_ROOT
    from tests.waiting import wait_until_sync

    bin_dir = Settings().home / "bin"
    installed = subprocess.run(["bash", str(REPO_ROOT / "infra/scripts/stripe-mock.sh"), str(bin_dir)],
                               capture_output=True, text=True)
    assert installed.returncode == 0, f"stripe-mock could not be installed: {installed.stderr.strip()}"
    from infra.ports import listen_port as free_port

    port = free_port()
    process = subprocess.Popen([str(bin_dir / "stripe-mock"), "-http-addr", f"127.0.0.1:{port}",
                                "-https-addr", f"127.0.0.1:{free_port()}"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def answers() -> bool:
        assert process.poll() is None, f"stripe-mock exited: {process.stderr.read().decode()[-500:]}"
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            return False

    try:
        wait_until_sync(answers, 30, "stripe-mock listening", step_s=0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(10)
