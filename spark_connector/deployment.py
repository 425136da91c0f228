"""Where the nodes of one Spark application live, and how a piece of code finds its own.

One node runs beside the driver and one in each executor, each in an agent process
(episub.agent) started on first use under a file lock and found over a Unix socket
(DESIGN.md, "Spark facts": Python workers are short-lived, so a node cannot live in one).

- The driver's agent is started by `register()` in the user's driver process and exits
  when that process is gone. Spark's driver-side Python planners (the streaming source's
  `latestOffset`, the sink's `commit`) run in other processes and reach it by its socket.
- An executor's agent is started by the first Python worker of that executor that needs
  it; its owner is the executor's JVM (the nearest `java` ancestor of the worker), so it
  exits when the executor does. Its socket is named after that JVM's pid and start time,
  so every worker of one executor finds the same agent, and a reused pid never does.
- Executors join through the driver's node (`Deployment.bootstrap`), the only address
  known before any executor runs; the overlay then links them among themselves, the
  near links by measured RTT.

`Deployment` is plain data, pickled into every reader and writer Spark ships.
"""

from __future__ import annotations

import hashlib
import os
import socket
import tempfile
from dataclasses import dataclass

from episub.agent import AgentClient, ensure_agent

__all__ = [
    "AGENT_TIMEOUT",
    "CLUSTER_TOPIC",
    "EXECUTOR_IDLE_TIMEOUT",
    "Deployment",
    "driver_client",
    "executor_client",
    "executor_jvm_pid",
    "executor_owner",
    "executor_socket_path",
    "local_address_toward",
]

# Every node of the application joins this topic as soon as it starts, so the overlay (and
# its RTT measurements) exists before any query runs; introspection and live configuration
# ride on it.
CLUSTER_TOPIC = "_episub.cluster"
# An executor's agent outlives a stopped query so that a restarted one finds its history
# there; guess: retention's own max_age (600 s), the window a replay could still want.
EXECUTOR_IDLE_TIMEOUT = 600.0
# Longest wait for one agent reply from Spark code: a read may wait on fetches from peers
# (FETCH_TIMEOUT per page, see source.py), and a loaded CI machine is slow.
AGENT_TIMEOUT = 120.0


@dataclass(frozen=True, slots=True)
class Deployment:
    """What every node of one application needs to find the others. Picklable."""

    key_hex: str  # the deployment's 32-byte key; travels only inside pickled tasks
    host: str  # the address nodes listen on and advertise (loopback for local Spark)
    bootstrap: tuple[str, ...]  # the driver node's "host:port"
    driver_socket: str
    driver_pid: int  # the user's driver process: the driver agent's owner
    agent_dir: str  # where executor agents put their sockets and logs
    # Every agent's --config file, as JSON text (episub.agent.options): "" for the defaults.
    agent_config: str = ""
    signed: bool = False  # every agent runs with --signed (signed publishing)

    @property
    def key(self) -> bytes:
        return bytes.fromhex(self.key_hex)


def agent_dir() -> str:
    """A directory of this user's, for agent sockets (short: a socket path is <108 bytes)."""
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
    key: bytes, host: str, agent_config: str = "", signed: bool = False
) -> Deployment:
    """The driver's agent (started if needed), owned by this process."""
    directory = agent_dir()
    socket_path = os.path.join(directory, f"driver-{os.getpid()}.sock")
    info = ensure_agent(
        socket_path, key=key, listen=f"{host}:0", owner_pid=os.getpid(), idle_timeout=None,
        config_file=agent_config_file(directory, agent_config), sign=signed,
    )  # fmt: skip
    with AgentClient(socket_path, timeout=AGENT_TIMEOUT) as client:
        client.join(CLUSTER_TOPIC)
    return Deployment(
        key_hex=key.hex(),
        host=host,
        bootstrap=(info.address,),
        driver_socket=socket_path,
        driver_pid=os.getpid(),
        agent_dir=directory,
        agent_config=agent_config,
        signed=signed,
    )


def driver_client(deployment: Deployment) -> AgentClient:
    """A client of the driver's agent, for Spark's driver-side planners."""
    ensure_agent(
        deployment.driver_socket,
        key=deployment.key,
        listen=f"{deployment.host}:0",
        owner_pid=deployment.driver_pid,
        idle_timeout=None,
        config_file=agent_config_file(deployment.agent_dir, deployment.agent_config),
        sign=deployment.signed,
    )
    return AgentClient(deployment.driver_socket, timeout=AGENT_TIMEOUT)


def executor_owner() -> int:
    """The process an executor agent serves: the executor's JVM (else this one's parent)."""
    jvm = executor_jvm_pid()
    return jvm if jvm is not None else os.getppid()


def executor_socket_path(directory: str, owner: int) -> str:
    """Named after the owner's pid and start time, so a reused pid never finds it."""
    stat = _proc_stat(owner)
    start_time = stat[2] if stat is not None else 0
    return os.path.join(directory, f"exec-{owner}-{start_time}.sock")


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
    """A client of this executor's agent, started if it is not running yet."""
    owner = executor_owner()
    socket_path = executor_socket_path(deployment.agent_dir, owner)
    os.makedirs(deployment.agent_dir, mode=0o700, exist_ok=True)
    ensure_agent(
        socket_path,
        key=deployment.key,
        listen=f"{_bracketed(local_address_toward(deployment.host))}:0",
        bootstrap=deployment.bootstrap,
        owner_pid=owner,
        idle_timeout=EXECUTOR_IDLE_TIMEOUT,
        config_file=agent_config_file(deployment.agent_dir, deployment.agent_config),
        sign=deployment.signed,
    )
    client = AgentClient(socket_path, timeout=AGENT_TIMEOUT)
    try:
        client.join(CLUSTER_TOPIC)  # a no-op once joined
    except BaseException:
        client.close()
        raise
    return client


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
