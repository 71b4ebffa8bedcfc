"""One Apache Kafka 4 node (KRaft, broker+controller) run from Maven-resolved jars.

Alone it is a single-node cluster (`--standalone` quorum); given a `Quorum` it is
one voter of a multi-node cluster (see `infra/kafka_cluster.py`).

Layout under `<home>/kafka/` (or the directory the cluster gives it):
    jars/              every runtime jar (`mvn dependency:copy-dependencies`)
    server.properties  written on each start from the chosen ports
    log4j2.properties  broker logs go to broker.log, not the terminal
    data/              formatted log dirs (meta.properties marks a formatted dir)

A single node also listens with SASL_PLAINTEXT (SCRAM-SHA-256) beside PLAINTEXT:
its principals (`PRINCIPALS`) and their generated passwords are written to a
0600 JSON file before the storage is formatted with `--add-scram`, so the
credentials exist before the broker first opens a port. Storage formatted
before that file existed gets no SASL listener (nobody could log in to it).
"""
from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from plumbing.secrets import write_secret_file
from infra.errors import InfraError
from infra.ports import free_port, is_port_open
from infra.processes import cmdline, is_alive, kill_group, spawn, terminate
from infra.state import ServiceRecord

POM = Path(__file__).parent / "kafka" / "pom.xml"
MAIN_CLASS = "kafka.Kafka"
STORAGE_TOOL = "kafka.tools.StorageTool"
SCRAM_MECHANISM = "SCRAM-SHA-256"
PRINCIPALS = ("admin", "controller", "worker", "gateway", "projector")
SASL_LISTENER = [
    f"sasl.enabled.mechanisms={SCRAM_MECHANISM}",
    f"listener.name.sasl_plaintext.sasl.enabled.mechanisms={SCRAM_MECHANISM}",
    f"listener.name.sasl_plaintext.{SCRAM_MECHANISM.lower()}.sasl.jaas.config="
    "org.apache.kafka.common.security.scram.ScramLoginModule required;",
]
# With a SASL listener the node authorizes every request. Service principals are super users. Everyone else
# (tenants' SCRAM principals, and the PLAINTEXT listener's User:ANONYMOUS, which is also this node talking to
# itself) is held to ACLs where a resource has any; `infra/kafka_acls.py` gives every resource ANONYMOUS needs
# an ACL, so "no ACL found" only applies in the seconds before those exist on a fresh node.
AUTHORIZER = [
    "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    "super.users=" + ";".join(f"User:{name}" for name in PRINCIPALS),
    "allow.everyone.if.no.acl.found=true",
]

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


@dataclass(frozen=True)
class Quorum:
    """The static controller quorum of a multi-node cluster: every node is a voter."""

    cluster_id: str
    controller_ports: tuple[int, ...]  # node i+1 listens for the quorum on controller_ports[i]

    @property
    def voters(self) -> str:
        return ",".join(f"{i}@127.0.0.1:{port}" for i, port in enumerate(self.controller_ports, start=1))

    @property
    def replication(self) -> int:
        return min(3, len(self.controller_ports))


class KafkaNode:
    """Resolves, formats, starts and stops one local broker; knows nothing of topics."""

    def __init__(self, home: Path, heap: str = "768m", jars: Path | None = None, node_id: int = 1,
                 directory: Path | None = None, scram_file: Path | None = None) -> None:
        self.dir = directory or home / "kafka"
        self.scram_file = scram_file  # where a SASL listener's credentials live; None: PLAINTEXT only
        self.jars = jars or home / "kafka-jars"
        self.heap = heap
        self.node_id = node_id

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

    def scram_passwords(self) -> dict[str, str]:
        """principal -> password of the SASL listener ({} when it has none)."""
        if self.scram_file is None or not self.scram_file.is_file():
            return {}
        return json.loads(self.scram_file.read_text())["passwords"]

    def _sasl_enabled(self) -> bool:
        formatted = (self.dir / "data" / "meta.properties").exists()
        return self.scram_file is not None and (self.scram_file.is_file() or not formatted)

    def _write_configs(self, port: int, controller_port: int, quorum: Quorum | None,
                       sasl_port: int | None = None) -> Path:
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "log4j2.properties").write_text(LOG4J2.format(log=self.dir / "broker.log"))
        replication, min_isr = (quorum.replication, min(2, quorum.replication)) if quorum else (1, 1)
        voters = (f"controller.quorum.voters={quorum.voters}" if quorum
                  else f"controller.quorum.bootstrap.servers=127.0.0.1:{controller_port}")
        props = self.dir / "server.properties"
        sasl = f",SASL_PLAINTEXT://127.0.0.1:{sasl_port}" if sasl_port else ""
        props.write_text("\n".join([
            "process.roles=broker,controller",
            f"node.id={self.node_id}",
            f"listeners=PLAINTEXT://127.0.0.1:{port}{sasl},CONTROLLER://127.0.0.1:{controller_port}",
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{port}{sasl}",
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=PLAINTEXT",
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT,CONTROLLER:PLAINTEXT",
            *(SASL_LISTENER + AUTHORIZER if sasl_port else []),
            voters,
            f"log.dirs={self.dir / 'data'}",
            "num.partitions=6",
            f"default.replication.factor={replication}",
            f"offsets.topic.replication.factor={replication}",
            "offsets.topic.num.partitions=6",
            f"transaction.state.log.replication.factor={replication}",
            f"transaction.state.log.min.isr={min_isr}",
            "transaction.state.log.num.partitions=6",
            f"share.coordinator.state.topic.replication.factor={replication}",
            f"share.coordinator.state.topic.min.isr={min_isr}",
            "group.initial.rebalance.delay.ms=0",
            "auto.create.topics.enable=false",
            "log.cleaner.backoff.ms=1000",
            "",
        ]))
        return props

    def _format(self, java: str, props: Path, quorum: Quorum | None) -> None:
        if (self.dir / "data" / "meta.properties").exists():
            return
        if quorum is None:
            self._run_tool(java, ["format", "--standalone", f"--cluster-id={self.random_cluster_id(java)}",
                                  "-c", str(props), *self._scram_arguments()])
        else:  # the voters are static (controller.quorum.voters): no --standalone / --initial-controllers
            self._run_tool(java, ["format", f"--cluster-id={quorum.cluster_id}", "-c", str(props)])

    def _scram_arguments(self) -> list[str]:
        """`--add-scram` for each principal, with passwords generated now (URL-safe: no `,` `]` `=` to escape).

        The storage tool takes them only as arguments: they are on its command line for the second it runs."""
        if self.scram_file is None:
            return []
        passwords = {name: secrets.token_urlsafe(24) for name in PRINCIPALS}
        write_secret_file(self.scram_file, json.dumps({"mechanism": SCRAM_MECHANISM, "passwords": passwords}))
        return [arg for name, password in passwords.items()
                for arg in ("--add-scram", f"{SCRAM_MECHANISM}=[name={name},password={password}]")]

    def random_cluster_id(self, java: str | None = None) -> str:
        return self._run_tool(java or self.java(), ["random-uuid"]).strip().splitlines()[-1]

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
        """Start the single-node broker (idempotent) and wait until its port answers."""
        if self.is_ours_running(record):
            return record
        # A configured port must be free; a remembered or default one is only a preference.
        port = _claim(port, record.port or 19092, "Kafka broker", "LEDGERLM_KAFKA_PORT")
        controller_port = _claim(controller_port, int(record.extra.get("controller_port", 0)) or 19093,
                                 "Kafka controller", "LEDGERLM_KAFKA_CONTROLLER_PORT", avoid=port)
        sasl_port = None
        if self._sasl_enabled():
            sasl_port = _claim(None, int(record.extra.get("sasl_port", 0)) or 19094, "Kafka SASL listener", "",
                               avoid=port)
            sasl_port = free_port(0) if sasl_port == controller_port else sasl_port
        started = self.launch(port, controller_port, None, sasl_port)
        self.wait_listening(started, timeout_s)
        return started

    def launch(self, port: int, controller_port: int, quorum: Quorum | None,
               sasl_port: int | None = None) -> ServiceRecord:
        """Format (once) and spawn the JVM without waiting: a cluster node opens its broker port only
        once a majority of the quorum is up, so a cluster launches every node before waiting on any."""
        java = self.java()
        self.resolve_jars()
        props = self._write_configs(port, controller_port, quorum, sasl_port)
        self._format(java, props, quorum)
        pid = spawn(
            [java, f"-Xmx{self.heap}", f"-Xms{self.heap}", "-XX:+UseG1GC", "-Djava.awt.headless=true",
             f"-Dlog4j2.configurationFile={self.dir / 'log4j2.properties'}", "-cp", self._classpath(),
             MAIN_CLASS, str(props)],
            self.dir / "stdout.log",
        )
        extra: dict[str, int | str] = {"controller_port": controller_port}
        if sasl_port:
            extra["sasl_port"] = sasl_port
        return ServiceRecord(pid=pid, port=port, extra=extra)

    def wait_listening(self, record: ServiceRecord, timeout_s: float) -> None:
        """Wait until the broker port answers; a node that died or never opened it is stopped and named."""
        assert record.pid and record.port
        deadline = time.monotonic() + timeout_s
        while not is_port_open(record.port):
            if not is_alive(record.pid):
                raise InfraError(f"Kafka broker {self.node_id} exited during start-up; see {self.dir / 'stdout.log'} "
                                 f"and {self.dir / 'broker.log'}:\n{_tail(self.dir / 'stdout.log')}")
            if time.monotonic() > deadline:
                terminate(record.pid)
                raise InfraError(f"Kafka broker {self.node_id} did not open port {record.port} within "
                                 f"{timeout_s:.0f}s")
            time.sleep(0.2)

    def stop(self, record: ServiceRecord) -> bool:
        if not self.is_ours_running(record):
            return False
        terminate(record.pid)  # type: ignore[arg-type]
        return True

    def kill(self, record: ServiceRecord) -> bool:
        """SIGKILL the broker (a crash: no controlled shutdown, no flush)."""
        if not self.is_ours_running(record):
            return False
        kill_group(record.pid)  # type: ignore[arg-type]
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
