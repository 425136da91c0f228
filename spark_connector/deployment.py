"""Where the nodes of one Spark application live, and how a piece of code finds its own.

One node runs beside the driver and one in each executor, each in an agent process
(episub.agent) started on first use under a file lock and found over a Unix socket
(docs/how-it-works.md, "Why an agent": Python workers are short-lived, so a node cannot
live in one).

- The driver's agent, classic Spark: started by `register()` in the user's driver process
  and exits when that process is gone. Spark's driver-side Python planners (the streaming
  source's `latestOffset`, the sink's `commit`) run in other processes and reach it by its
  socket.
- The driver's agent, Spark Connect: the client process is not the driver, and cannot reach
  the server's machine, so the first planner process that needs the node starts it
  (`place_driver`, on `register()`'s first control job). Planners are children of the
  server's JVM, which owns the agent: it exits when the server does, or after
  `EXECUTOR_IDLE_TIMEOUT` unused, and a later planner starts it again on the same address.
- An executor's agent is started by the first Python worker of that executor that needs
  it; its owner is the executor's JVM (the nearest `java` ancestor of the worker), so it
  exits when the executor does. Its socket and log are in that host's own temporary
  directory (`agent_dir`, resolved on the executor: hosts do not share the driver's), named
  after that JVM's pid and start time, so every worker of one executor finds the same
  agent, and a reused pid never does; under Connect also after the deployment's id, since
  one server's JVMs serve many sessions.
- Executors join through the driver's node (`Deployment.bootstrap`), the only address
  known before any executor runs; the overlay then links them among themselves, the
  near links by measured RTT.

`Deployment` is plain data, pickled into every reader and writer Spark ships; under
Connect the key travels only inside the data source class the client registers (see
connect.py for what does and does not show it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
import json
import logging
import os
import re
import socket
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from episub.agent import (
    AgentClient,
    AgentError,
    AgentInfo,
    AgentUnavailable,
    AgentWaitExpired,
    ensure_agent,
)
from episub.proto.reserved import CLUSTER_TOPIC

__all__ = [
    "AGENT_TIMEOUT",
    "EXECUTOR_IDLE_TIMEOUT",
    "Deployment",
    "driver_client",
    "executor_client",
    "executor_jvm_pid",
    "executor_owner",
    "executor_socket_path",
    "join_through",
    "local_address_toward",
    "newest_executor_socket",
    "place_driver",
    "shared_executor_client",
]

log = logging.getLogger("spark_connector.deployment")

# How long the driver's node waits for a first neighbour when it joins a data topic through
# outside nodes: one that is not in the topic never sends one, and the driver's node is then
# the topic's first node here (executors join through it), which needs no neighbour. Guess:
# a few handshakes on a loaded LAN; a join that takes longer goes on in the background.
CONTACT_JOIN_TIMEOUT = 2.0

# An executor's agent outlives a stopped query so that a restarted one finds its history
# there; guess: retention's own max_age (600 s), the window a replay could still want.
EXECUTOR_IDLE_TIMEOUT = 600.0
# Longest wait for one agent reply from Spark code: a read may wait on fetches from peers
# (FETCH_TIMEOUT per page, see source.py), and a loaded CI machine is slow.
AGENT_TIMEOUT = 120.0


@dataclass(frozen=True, slots=True)
class Deployment:
    """What every node of one application needs to find the others. Picklable.

    Every field travels together (`to_json`, pickling), so a field added here reaches the
    driver's planners and every executor with no other change."""

    key_hex: str  # the deployment's 32-byte key; "" in the public form (see `public`)
    host: str  # the address nodes listen on and advertise (loopback for local Spark)
    bootstrap: tuple[str, ...]  # the driver node's "host:port"
    driver_socket: str  # "" until the driver's node is placed (Connect: `place_driver`)
    driver_pid: int  # the driver agent's owner: the user's driver process, or Connect's JVM
    # Every agent's --config file, as JSON text (episub.agent.options): "" for the defaults.
    agent_config: str = ""
    signed: bool = False  # every agent runs with --signed (signed publishing)
    # Names this deployment's executor agents where one JVM serves many deployments (a Spark
    # Connect server's sessions): "" for classic Spark, whose executors serve one.
    id: str = ""
    driver_address: str = ""  # where the driver's node listens; a restarted one listens there
    driver_idle_timeout: float | None = None  # None: the driver's agent lives as its owner
    # Nodes outside Spark ("host:port": register(bootstrap=...), and a query's `bootstrap`
    # option): every node of the application joins data topics through them too, and the
    # planners ask them what they hold.
    contacts: tuple[str, ...] = ()
    metrics: bool = False  # every agent serves Prometheus metrics on a free port
    # Fixed ports, for firewalls (register(port=..., executor_ports=...)): the driver's node
    # listens on driver_port (0: any free one); an executor's node on the first free port of
    # executor_ports (low, high), inclusive, on its host (None: any free one).
    driver_port: int = 0
    executor_ports: tuple[int, int] | None = None

    def joins(self) -> tuple[str, ...]:
        """The addresses a node of the application joins a data topic through: the driver's
        node (executors) and the outside contacts (the driver's node skips itself)."""
        return tuple(dict.fromkeys([*self.bootstrap, *self.contacts]))

    @property
    def key(self) -> bytes:
        return bytes.fromhex(self.key_hex)

    def executor_name(self) -> str:
        """What names this deployment's executor agents (socket, log): its id (Connect),
        else a digest of what an executor's node is started with. A JVM can outlive its
        session (local mode: a notebook stops its session and builds another with other
        settings): the next session's tasks must find a node started with their settings,
        not the last session's, which then retires when idle."""
        if self.id:
            return self.id
        started_with = [
            self.key_hex, self.host, self.bootstrap, self.agent_config, self.signed,
            self.metrics, self.executor_ports,
        ]  # fmt: skip
        digest = hashlib.blake2b(json.dumps(started_with).encode(), digest_size=6)
        return digest.hexdigest()

    def public(self) -> Deployment:
        """Everything but the key: what may show in a session's configuration and logs."""
        return dataclasses.replace(self, key_hex="")

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Deployment:
        fields: dict[str, Any] = json.loads(text)
        values: dict[str, Any] = {
            k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()
        }
        return cls(**values)


def agent_dir() -> str:
    """This host's directory of this user's for agent sockets and logs, under this process's
    `$TMPDIR` (short: a socket path is <108 bytes). Each node's code resolves its own: an
    executor on another host has its own temporary directory, and the driver's path may not
    exist there."""
    path = os.path.join(tempfile.gettempdir(), f"episub-{os.getuid()}")
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


def agent_config_file(directory: str, config: str) -> str | None:
    """The file holding agent config `config` on this host (written once, atomically, named
    after its content), for ensure_agent's config_file; None for the defaults."""
    if not config:
        return None
    digest = hashlib.blake2b(config.encode(), digest_size=12).hexdigest()
    path = os.path.join(directory, f"config-{digest}.json")
    if not os.path.exists(path):
        fd, temporary = tempfile.mkstemp(dir=directory, suffix=".json.tmp")
        with os.fdopen(fd, "w") as f:
            f.write(config)
        os.replace(temporary, path)  # agents never read a half-written file
    return path


def start_driver_agent(
    key: bytes,
    host: str,
    agent_config: str = "",
    signed: bool = False,
    contacts: tuple[str, ...] = (),
    metrics: bool = False,
    driver_port: int = 0,
    executor_ports: tuple[int, int] | None = None,
) -> Deployment:
    """The driver's agent (started if needed), owned by this process (classic Spark)."""
    directory = agent_dir()
    draft = Deployment(
        key_hex=key.hex(),
        host=host,
        bootstrap=(),
        driver_socket=os.path.join(directory, f"driver-{os.getpid()}.sock"),
        driver_pid=os.getpid(),
        agent_config=agent_config,
        signed=signed,
        contacts=contacts,
        metrics=metrics,
        driver_port=driver_port,
        executor_ports=executor_ports,
    )
    return _joined_driver(draft)


def place_driver(deployment: Deployment) -> Deployment:
    """Spark Connect: the deployment with its driver's node placed beside the server (started
    if needed), for a planner process, whose nearest `java` ancestor is the server's JVM:
    the agent's owner. A placed deployment is returned as it is."""
    if deployment.driver_socket:
        return deployment
    owner = executor_jvm_pid()
    if owner is None:
        raise RuntimeError(
            "the episub driver's node can only be placed from a Spark planner process (one "
            "under the Spark Connect server's JVM); call spark_connector.register(spark)"
        )
    directory = agent_dir()
    draft = dataclasses.replace(
        deployment,
        driver_socket=_owned_path(directory, "driver", owner, deployment.id, ".sock"),
        driver_pid=owner,
    )
    return _joined_driver(draft)


def _joined_driver(draft: Deployment) -> Deployment:
    """`draft` with its driver's node started and in CLUSTER_TOPIC, and its address known."""
    info = _ensure_driver(draft)
    with AgentClient(draft.driver_socket, timeout=AGENT_TIMEOUT) as client:
        client.join(CLUSTER_TOPIC)
    return dataclasses.replace(draft, bootstrap=(info.address,), driver_address=info.address)


def driver_client(deployment: Deployment) -> AgentClient:
    """A client of the driver's agent, for Spark's driver-side planners. A public deployment
    (no key: a Connect server's foreachBatch process, see config.py) only attaches to it."""
    if not deployment.key_hex:
        return _running_agent(
            deployment.driver_socket, "the driver's", "the planners of this session's queries"
        )
    checked = (deployment.driver_socket, deployment.signed)
    if checked in _driver_agents_checked:
        # This process has checked the agent there already (its signing setting; started
        # it if need be): a connection that succeeds reaches it, and one that fails means
        # it went away, which `_ensure_driver` mends. Checking it again per call cost each
        # cfg.set an inspect() round trip, about half of its time.
        with contextlib.suppress(AgentUnavailable):
            return AgentClient(deployment.driver_socket, timeout=AGENT_TIMEOUT)
        _driver_agents_checked.discard(checked)
    _ensure_driver(deployment)
    client = AgentClient(deployment.driver_socket, timeout=AGENT_TIMEOUT)
    _driver_agents_checked.add(checked)
    return client


# (driver socket, signed) of the driver agents this process has checked (driver_client).
_driver_agents_checked: set[tuple[str, bool]] = set()


def _ensure_driver(deployment: Deployment) -> AgentInfo:
    """The driver's agent, started if it is not running: on its old address if it had one,
    since executors' nodes know it by that address (their bootstrap)."""
    directory = os.path.dirname(deployment.driver_socket)
    config_file = agent_config_file(directory, deployment.agent_config)

    def ensure(listen: str) -> AgentInfo:
        return ensure_agent(
            deployment.driver_socket, key=deployment.key, listen=listen,
            owner_pid=deployment.driver_pid, idle_timeout=deployment.driver_idle_timeout,
            config_file=config_file, sign=deployment.signed,
            metrics_port=0 if deployment.metrics else None,
        )  # fmt: skip

    if deployment.driver_address:
        try:
            return ensure(deployment.driver_address)
        except AgentUnavailable as exc:
            if deployment.driver_port:
                raise  # a fixed port is the firewall's: no other will do
            log.warning(
                "the driver's episub node cannot listen on %s again (%s); it starts on a new "
                "port, which executors' nodes learn only from the next query's plan",
                deployment.driver_address, exc,
            )  # fmt: skip
    return ensure(f"{_bracketed(deployment.host)}:{deployment.driver_port}")


def executor_owner() -> int:
    """The process an executor agent serves: the executor's JVM (else this one's parent)."""
    jvm = executor_jvm_pid()
    return jvm if jvm is not None else os.getppid()


def executor_socket_path(directory: str, owner: int, name: str) -> str:
    """Named after the owner's pid and start time, so a reused pid never finds it, and the
    deployment's `executor_name`."""
    return _owned_path(directory, "exec", owner, name, ".sock")


def newest_executor_socket(directory: str, owner: int) -> str | None:
    """The socket of the agent this executor started last, whatever its deployment: for a
    task that carries none (its job was started from another thread)."""
    prefix = os.path.basename(_owned_path(directory, "exec", owner, "", ""))
    found = []
    with contextlib.suppress(FileNotFoundError), os.scandir(directory) as entries:
        for entry in entries:
            if entry.name.startswith(prefix + "-") and entry.name.endswith(".sock"):
                with contextlib.suppress(FileNotFoundError):
                    found.append((entry.stat().st_mtime, entry.path))
    return max(found)[1] if found else None


def _owned_path(directory: str, role: str, owner: int, deployment_id: str, suffix: str) -> str:
    stat = _proc_stat(owner)
    start_time = stat[2] if stat is not None else 0
    name = f"{role}-{owner}-{start_time}" + (f"-{deployment_id}" if deployment_id else "")
    return os.path.join(directory, name + suffix)


def local_address_toward(host: str) -> str:
    """This host's address on the interface that reaches `host`: where an executor's node
    listens, so that the driver's node and the other executors can dial it back.

    `deployment.host` is the driver's address; on a cluster an executor cannot bind it.
    A connected UDP socket sends nothing; it only makes the kernel choose the route.
    """
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, 9, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.connect(address)
            return str(probe.getsockname()[0])
    except OSError:
        return host  # no route known: the driver's own address is the best guess left


def executor_client(deployment: Deployment) -> AgentClient:
    """A client of this executor's agent, started if it is not running yet.

    A public deployment (no key: what a Connect session's tasks find in their job
    properties, see connect.py) can start one only from the copy a keyed task left here."""
    owner = executor_owner()
    directory = agent_dir()
    socket_path = executor_socket_path(directory, owner, deployment.executor_name())
    if not deployment.key_hex:
        kept = _kept_deployment(socket_path)
        if kept is None:
            return _running_agent(
                socket_path, "this executor's", "tasks of an episub query or of cluster_config"
            )
        deployment = kept
    elif deployment.id:
        _keep_deployment(socket_path, deployment)
    keyed = deployment

    def ensure(listen: str) -> AgentInfo:
        return ensure_agent(
            socket_path,
            key=keyed.key,
            listen=listen,
            bootstrap=keyed.bootstrap,
            owner_pid=owner,
            owner_files=(_kept_path(socket_path),) if keyed.id else (),
            idle_timeout=EXECUTOR_IDLE_TIMEOUT,
            config_file=agent_config_file(directory, keyed.agent_config),
            sign=keyed.signed,
            metrics_port=0 if keyed.metrics else None,
        )

    host = local_address_toward(deployment.host)
    if deployment.executor_ports is None:
        ensure(f"{_bracketed(host)}:0")
    else:
        _ensure_in_range(ensure, host, deployment.executor_ports)
    client = AgentClient(socket_path, timeout=AGENT_TIMEOUT)
    try:
        client.join(CLUSTER_TOPIC)  # a no-op once joined
    except BaseException:
        client.close()
        raise
    return client


def _ensure_in_range(
    ensure: Callable[[str], AgentInfo], host: str, ports: tuple[int, int]
) -> AgentInfo:
    """This executor's agent (attached to, or started on the first free port of `ports`:
    the executors of one host share the range, a port each)."""
    low, high = ports
    # A running agent is attached to whatever port is asked, so the first free one does;
    # none free: this executor's agent may hold the last one (ensure attaches to it).
    free = (port for port in range(low, high + 1) if _port_free(host, port))
    for port in itertools.chain(free, [low]):
        try:
            return ensure(f"{_bracketed(host)}:{port}")
        except AgentUnavailable:
            continue  # taken between the look and the agent's bind: the next one
    raise AgentUnavailable(
        f"no port of spark.episub.executorPorts {low}-{high} is free on {host} for this "
        "executor's episub node: give a range with a port for every executor of a host"
    )


def _port_free(host: str, port: int) -> bool:
    """Can a listener bind `host:port` now? (As the agent's does, with SO_REUSEADDR.)"""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.create_server((host, port), family=family):
            return True
    except OSError:
        return False


# This process's client of its executor's agent, by socket path: Spark reuses a Python
# worker for task after task, so tasks share one connection (no new socket, agent check and
# ensure_agent lock per task). A client that failed is dropped and made again.
_SHARED: dict[str, AgentClient] = {}


@contextlib.contextmanager
def shared_executor_client(deployment: Deployment) -> Iterator[AgentClient]:
    """This worker's client of its executor's agent (started if needed), kept open for the
    tasks after this one; on any error it is closed, and the next task connects again."""
    owner = executor_owner()
    path = executor_socket_path(agent_dir(), owner, deployment.executor_name())
    client = _SHARED.pop(path, None)
    if client is not None:
        try:
            client.join(CLUSTER_TOPIC)  # one round trip: is the agent still there?
        except (AgentUnavailable, AgentError, OSError):
            client.close()
            client = None
    if client is None:
        client = executor_client(deployment)
    try:
        yield client
    except BaseException:
        client.close()
        raise
    if not client.closed:
        _SHARED[path] = client


# Under Connect a task's only trace of its deployment that reaches every task (a UDF's too)
# is the session's configuration, which Spark writes unredacted to its event log, so it
# carries the public form. A task that has the key (a reader, a writer, a control job)
# leaves the deployment beside the agent it starts, in a file only this user can read, as
# safe as the agent's socket next to it (which gives the node's powers to whoever opens
# it): a UDF's `config.get` can then start the agent again after it retired or died. The
# agent removes it when its executor is gone; a copy left by a killed agent goes the next
# time a copy is kept in that directory.
_KEPT_SUFFIX = ".deployment"
_KEPT_NAME = re.compile(r"exec-(\d+)-(\d+)-[0-9a-f]+\.deployment")


def _kept_path(socket_path: str) -> str:
    return socket_path.removesuffix(".sock") + _KEPT_SUFFIX


def _kept_deployment(socket_path: str) -> Deployment | None:
    try:
        with open(_kept_path(socket_path)) as f:
            return Deployment.from_json(f.read())
    except FileNotFoundError:
        return None


def _keep_deployment(socket_path: str, deployment: Deployment) -> None:
    path = _kept_path(socket_path)
    if os.path.exists(path):
        return
    directory = os.path.dirname(path)
    fd, temporary = tempfile.mkstemp(dir=directory, suffix=".tmp")  # mode 0600
    with os.fdopen(fd, "w") as f:
        f.write(deployment.to_json())
    os.replace(temporary, path)
    _forget_dead_owners(directory)


def _forget_dead_owners(directory: str) -> None:
    """Remove kept deployments of executors that are gone (pid gone, or reused)."""
    for name in os.listdir(directory):
        match = _KEPT_NAME.fullmatch(name)
        if match is None:
            continue
        stat = _proc_stat(int(match[1]))
        if stat is None or stat[2] != int(match[2]):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(directory, name))


def _running_agent(socket_path: str, whose: str, keyed: str) -> AgentClient:
    """The agent at `socket_path`, for code that has no key to start one."""
    if not os.path.exists(socket_path):
        raise AgentUnavailable(
            f"{whose} episub agent is not running ({socket_path} is missing), and this "
            f"process cannot start one: only {keyed} carry the key. Call "
            "spark_connector.cluster_config(spark) before starting the job"
        )
    return AgentClient(socket_path, timeout=AGENT_TIMEOUT)


def executor_jvm_pid() -> int | None:
    """The pid of the nearest `java` process above this one (the executor's JVM), or None
    (not under a JVM, or no /proc)."""
    pid = os.getpid()
    for _ in range(16):  # a worker sits two or three levels under its JVM
        stat = _proc_stat(pid)
        if stat is None:
            return None
        comm, ppid, _ = stat
        if comm == "java" and pid != os.getpid():
            return pid
        if ppid <= 1:
            return None
        pid = ppid
    return None


def _proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(command name, parent pid, start time in ticks) from /proc/PID/stat."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    comm = data[data.index(b"(") + 1 : data.rindex(b")")].decode("utf-8", "replace")
    fields = data[data.rindex(b")") + 2 :].split()
    return comm, int(fields[1]), int(fields[19])


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def join_through(client: AgentClient, topic: str, addresses: Any, *, history: bool = False) -> None:
    """The driver's node joins `topic` through `addresses` (outside contacts, nodes that
    answered a planning before) if it is not in it yet. None of them bringing a neighbour
    in time is no error: the node is joined all the same, keeps trying them, and is where
    executors join (a sink writing a topic the outside nodes do not follow, for one).

    `history`: also copy what the neighbours retained from before the join. A reader's
    planner asks what nodes hold and reads no rows itself: none. A sink's commit joins
    after its tasks published, and its acks count on the driver's node holding their rows."""
    try:
        client.join(topic, list(addresses), timeout=CONTACT_JOIN_TIMEOUT, history=history)
    except AgentWaitExpired as exc:
        log.info("topic %r: %s", topic, exc)
