"""A single-node Apache Kafka 4 (KRaft, broker+controller) run from Maven-resolved jars.

Layout under `<home>/kafka/`:
    jars/              every runtime jar (`mvn dependency:copy-dependencies`)
    server.properties  written on each start from the chosen ports
    log4j2.properties  broker logs go to broker.log, not the terminal
    data/              formatted log dirs (meta.properties marks a formatted dir)
"""
from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from infra.errors import InfraError
from infra.ports import free_port, is_port_open
from infra.processes import cmdline, is_alive, spawn, terminate
from infra.state import ServiceRecord

POM = Path(__file__).parent / "kafka" / "pom.xml"
MAIN_CLASS = "kafka.Kafka"
STORAGE_TOOL = "kafka.tools.StorageTool"

LOG4J2 = """\
status = warn
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = FILE
logger.kafka.name = kafka
logger.kafka.level = WARN
logger.apache.name = org.apache.kafka
logger.apache.level = WARN
"""


class KafkaNode:
    """Resolves, formats, starts and stops the local broker; knows nothing of topics."""

    def __init__(self, home: Path, heap: str = "768m", jars: Path | None = None) -> None:
        self.dir = home / "kafka"
        self.jars = jars or home / "kafka-jars"
        self.heap = heap

    # -- preparation -------------------------------------------------------
    def java(self) -> str:
        java = shutil.which("java")
        if java is None:
            raise InfraError("Java not found: Kafka 4 needs Java 17+ on PATH (apt-get install openjdk-17-jre-headless)")
        version = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
        major = _java_major(version)
        if major is not None and major < 17:
            raise InfraError(f"Java {major} found at {java}: Kafka 4 needs Java 17 or newer")
        return java

    def resolve_jars(self) -> None:
        if self.jars.is_dir() and any(self.jars.glob("kafka_2.13-*.jar")):
            return
        mvn = shutil.which("mvn")
        if mvn is None:
            raise InfraError("Maven (mvn) not found: it resolves the Kafka jars (apt-get install maven)")
        self.jars.mkdir(parents=True, exist_ok=True)
        result = subprocess.run(
            [mvn, "-q", "-B", "-f", str(POM), "dependency:copy-dependencies",
             f"-DoutputDirectory={self.jars}", "-DincludeScope=runtime"],
            capture_output=True, text=True,
        )
        if result.returncode != 0 or not any(self.jars.glob("kafka_2.13-*.jar")):
            raise InfraError(f"resolving Kafka jars with Maven failed:\n{result.stdout[-2000:]}{result.stderr[-2000:]}")

    def _classpath(self) -> str:
        return str(self.jars / "*")

    def _write_configs(self, port: int, controller_port: int) -> Path:
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "log4j2.properties").write_text(LOG4J2.format(log=self.dir / "broker.log"))
        props = self.dir / "server.properties"
        props.write_text("\n".join([
            "process.roles=broker,controller",
            "node.id=1",
            f"listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{port}",
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=PLAINTEXT",
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            f"controller.quorum.bootstrap.servers=127.0.0.1:{controller_port}",
            f"log.dirs={self.dir / 'data'}",
            "num.partitions=6",
            "offsets.topic.replication.factor=1",
            "offsets.topic.num.partitions=6",
            "transaction.state.log.replication.factor=1",
            "transaction.state.log.min.isr=1",
            "transaction.state.log.num.partitions=6",
            "share.coordinator.state.topic.replication.factor=1",
            "share.coordinator.state.topic.min.isr=1",
            "group.initial.rebalance.delay.ms=0",
            "auto.create.topics.enable=false",
            "log.cleaner.backoff.ms=1000",
            "",
        ]))
        return props

    def _format(self, java: str, props: Path) -> None:
        if (self.dir / "data" / "meta.properties").exists():
            return
        cluster_id = self._run_tool(java, ["random-uuid"]).strip().splitlines()[-1]
        self._run_tool(java, ["format", "--standalone", "-t", cluster_id, "-c", str(props)])

    def _run_tool(self, java: str, args: list[str]) -> str:
        result = subprocess.run(
            [java, f"-Dlog4j2.configurationFile={self.dir / 'log4j2.properties'}", "-cp", self._classpath(),
             STORAGE_TOOL, *args],
            capture_output=True, text=True,
        )
        if result.returncode != 0:
            raise InfraError(f"Kafka storage tool `{args[0]}` failed (exit {result.returncode}): "
                             f"{(result.stderr or result.stdout).strip()[-1500:]}")
        return result.stdout

    # -- lifecycle ---------------------------------------------------------
    def is_ours_running(self, record: ServiceRecord) -> bool:
        return bool(record.pid) and is_alive(record.pid) and MAIN_CLASS in cmdline(record.pid)

    def start(self, record: ServiceRecord, port: int | None, controller_port: int | None,
              timeout_s: float) -> ServiceRecord:
        """Start the broker (idempotent) and wait until its port answers."""
        if self.is_ours_running(record):
            return record
        java = self.java()
        # A configured port must be free; a remembered or default one is only a preference.
        port = _claim(port, record.port or 19092, "Kafka broker", "LEDGERLM_KAFKA_PORT")
        controller_port = _claim(controller_port, int(record.extra.get("controller_port", 0)) or 19093,
                                 "Kafka controller", "LEDGERLM_KAFKA_CONTROLLER_PORT", avoid=port)
        self.resolve_jars()
        props = self._write_configs(port, controller_port)
        self._format(java, props)
        pid = spawn(
            [java, f"-Xmx{self.heap}", f"-Xms{self.heap}", "-XX:+UseG1GC", "-Djava.awt.headless=true",
             f"-Dlog4j2.configurationFile={self.dir / 'log4j2.properties'}", "-cp", self._classpath(),
             MAIN_CLASS, str(props)],
            self.dir / "stdout.log",
        )
        started = ServiceRecord(pid=pid, port=port, extra={"controller_port": controller_port})
        deadline = time.monotonic() + timeout_s
        while not is_port_open(port):
            if not is_alive(pid):
                raise InfraError(f"Kafka broker exited during start-up; see {self.dir / 'stdout.log'} and "
                                 f"{self.dir / 'broker.log'}:\n{_tail(self.dir / 'stdout.log')}")
            if time.monotonic() > deadline:
                terminate(pid)
                raise InfraError(f"Kafka broker did not open port {port} within {timeout_s:.0f}s")
            time.sleep(0.2)
        return started

    def stop(self, record: ServiceRecord) -> bool:
        if not self.is_ours_running(record):
            return False
        terminate(record.pid)  # type: ignore[arg-type]
        return True


def _claim(port: int | None, default: int, what: str, env: str, avoid: int | None = None) -> int:
    if port is not None:
        if is_port_open(port):
            raise InfraError(f"port {port} for the {what} is taken by another process; free it or set {env}")
        return port
    chosen = free_port(default)
    return free_port(0) if chosen == avoid else chosen


def _java_major(version_text: str) -> int | None:
    for token in version_text.replace('"', " ").split():
        head = token.split(".")[0]
        if head.isdigit() and token.count(".") >= 1:
            return 8 if head == "1" else int(head)
    return None


def _tail(path: Path, chars: int = 1500) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""
