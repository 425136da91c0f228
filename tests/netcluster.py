"""Emulated hosts on this Linux machine: a Spark standalone cluster whose worker hosts each
have their own network, pids and temporary directory, as separate machines have.

What `NetCluster` builds (all of it removed again at teardown, even when a test failed):
- a bridge `episub-br` in the root namespace holding SUBNET.1/24 (a /24 nothing else here
  uses), where the Spark master and the test's driver listen;
- per worker host i: network namespace `episub-hI`, joined to the bridge by a veth pair
  (root side `episub-vI`, host side `eth0`) holding SUBNET.(10+i)/24, with its loopback up
  and no default route: a host reaches the /24 and its own loopback, nothing else;
- in it, `unshare --pid --fork --kill-child --mount-proc` runs the host's first process, a
  Spark worker with 1 core: the host has its own pids (they repeat across hosts, as in
  containers) and its own `$TMPDIR`. When that first process dies, the kernel kills every
  process of the host's pid namespace: its executor, Python workers and episub agents.

`cut(host)` / `restore(host)` set the root side of the host's veth down / up: a pulled cable
(new connections fail with "No route to host", established ones stall until restored).

Runs only as root with `ip` and `unshare` (`unavailable()` says why not, for a skip). One
cluster at a time on this machine (a lock file), since the names and the /24 are fixed;
leftovers of a run that was killed outright are removed before a new one is built.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pyspark

SUBNET = "10.213.7"  # a private /24 of its own; no route leads out of it
DRIVER_ADDRESS = f"{SUBNET}.1"  # the bridge: the driver and the master
BRIDGE = "episub-br"
NETNS_PREFIX = "episub-h"
VETH_PREFIX = "episub-v"
LOCK_PATH = "/tmp/episub-netcluster.lock"
LOCK_WAIT = 300.0  # s: another run of this module holding the cluster
START_LIMIT = 180.0  # s: a JVM starts in seconds; six developers share two cores
STOP_LIMIT = 30.0  # s: a process killed by SIGKILL (D state aside) goes at once
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
# A master drops a worker silent for spark.worker.timeout (60 s by default) and its
# executor with it; the tests cut hosts off for up to 60 s and want the executor back.
WORKER_TIMEOUT_S = 300
DAEMON_MEMORY = "256m"  # master and worker JVMs (default 1g): they only route


def unavailable() -> str | None:
    """Why emulated hosts cannot be made here (for a skip), or None."""
    if os.geteuid() != 0:
        return "emulated hosts need root (network and pid namespaces)"
    for tool in ("ip", "unshare", "nsenter"):
        if shutil.which(tool) is None:
            return f"emulated hosts need the {tool!r} command"
    probe = f"{NETNS_PREFIX}probe"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot make a network namespace: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


def _free_port(address: str) -> int:
    with socket.socket() as probe:
        probe.bind((address, 0))
        return int(probe.getsockname()[1])


def _kill_and_reap(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@dataclass
class Host:
    """One emulated worker host."""

    index: int
    dir: Path  # its files: tmp/ (its $TMPDIR), work/ (Spark's), worker.log

    @property
    def name(self) -> str:
        return f"{NETNS_PREFIX}{self.index}"

    @property
    def veth(self) -> str:  # the root namespace's end of its cable
        return f"{VETH_PREFIX}{self.index}"

    @property
    def address(self) -> str:
        return f"{SUBNET}.{10 + self.index}"

    @property
    def tmp(self) -> Path:
        return self.dir / "tmp"

    @property
    def agent_dir(self) -> Path:
        """Where this host's episub agents put their sockets and logs (its $TMPDIR's)."""
        return self.tmp / f"episub-{os.getuid()}"

    worker: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def pids(self) -> list[int]:
        """Every process in this host's network namespace, as the root namespace sees them."""
        done = _ip("netns", "pids", self.name, check=False)
        return [int(p) for p in done.stdout.split()]


class NetCluster:
    """A Spark standalone master on the bridge and one 1-core worker per emulated host;
    `master_url` is what a driver in this (root) namespace connects to, with
    `spark.driver.host` = DRIVER_ADDRESS. Use as a context manager."""

    def __init__(self, directory: Path, workers: int) -> None:
        self.dir = directory
        self.hosts = [Host(i, directory / f"h{i}") for i in range(1, workers + 1)]
        self.master: subprocess.Popen[bytes] | None = None
        self.master_url = ""
        self.master_ui = ""
        self.stragglers: list[int] = []  # processes left in a host after its first one died
        self._lock_fd = -1

    # -- building -------------------------------------------------------------------------

    def __enter__(self) -> NetCluster:
        self._lock()
        try:
            remove_leftovers()
            self._network()
            self._master()
            for host in self.hosts:
                self._worker(host)
            self._wait_workers()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _lock(self) -> None:
        self._lock_fd = os.open(LOCK_PATH, os.O_RDWR | os.O_CREAT, 0o600)
        deadline = time.monotonic() + LOCK_WAIT
        while True:
            try:
                fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{LOCK_PATH} held for {LOCK_WAIT} s") from None
                time.sleep(0.5)  # another run's cluster: no event to wait on

    def _network(self) -> None:
        _ip("link", "add", BRIDGE, "type", "bridge")
        _ip("addr", "add", f"{DRIVER_ADDRESS}/24", "dev", BRIDGE)
        _ip("link", "set", BRIDGE, "up")
        for host in self.hosts:
            for sub in ("tmp", "work"):
                (host.dir / sub).mkdir(parents=True)
            _ip("netns", "add", host.name)
            _ip("link", "add", host.veth, "type", "veth", "peer", "name", "eth0",
                "netns", host.name)  # fmt: skip
            _ip("link", "set", host.veth, "master", BRIDGE)
            _ip("link", "set", host.veth, "up")
            _ip("-n", host.name, "addr", "add", f"{host.address}/24", "dev", "eth0")
            _ip("-n", host.name, "link", "set", "eth0", "up")
            _ip("-n", host.name, "link", "set", "lo", "up")

    def _spark_env(self, **extra: str) -> dict[str, str]:
        root = str(Path(__file__).resolve().parent.parent)
        env = {
            k: v for k, v in os.environ.items() if k not in ("SPARK_REMOTE", "PYSPARK_GATEWAY_PORT")
        }
        env.update(
            PYSPARK_PYTHON=sys.executable,
            PYTHONPATH=root,
            SPARK_DAEMON_MEMORY=DAEMON_MEMORY,
            SPARK_NO_DAEMONIZE="1",
            **extra,
        )
        return env

    def _master(self) -> None:
        port = _free_port(DRIVER_ADDRESS)
        ui_port = _free_port(DRIVER_ADDRESS)
        command = [spark_class(), MASTER_CLASS, "--host", DRIVER_ADDRESS,
                   "--port", str(port), "--webui-port", str(ui_port)]  # fmt: skip
        env = self._spark_env(
            SPARK_LOCAL_IP=DRIVER_ADDRESS,
            SPARK_MASTER_OPTS=f"-Dspark.worker.timeout={WORKER_TIMEOUT_S}",
            TMPDIR=str(self.dir),
        )
        with open(self.dir / "master.log", "wb") as log:
            self.master = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=env, cwd=self.dir,
            )  # fmt: skip
        self.master_url = f"spark://{DRIVER_ADDRESS}:{port}"
        self.master_ui = f"http://{DRIVER_ADDRESS}:{ui_port}/json/"

    def _worker(self, host: Host) -> None:
        command = ["ip", "netns", "exec", host.name,
                   "unshare", "--pid", "--fork", "--kill-child", "--mount-proc",
                   spark_class(), WORKER_CLASS, "--host", host.address, "--cores", "1",
                   "--memory", "1g", "--work-dir", str(host.dir / "work"),
                   self.master_url]  # fmt: skip
        env = self._spark_env(SPARK_LOCAL_IP=host.address, TMPDIR=str(host.tmp))
        with open(host.dir / "worker.log", "wb") as log:
            host.worker = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=env, cwd=host.dir,
            )  # fmt: skip

    def _wait_workers(self) -> None:
        deadline = time.monotonic() + START_LIMIT
        while self.alive_workers() < len(self.hosts):
            for name, proc in [("master", self.master)] + [(h.name, h.worker) for h in self.hosts]:
                if proc is not None and proc.poll() is not None:
                    raise RuntimeError(f"{name} exited ({proc.returncode}): {self.log_tails()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"workers not registered in {START_LIMIT} s: {self.log_tails()}")
            time.sleep(0.5)  # the master's state has no event to wait on

    def alive_workers(self) -> int:
        """How many workers the master counts alive (0 while it is not up yet)."""
        try:
            with urllib.request.urlopen(self.master_ui, timeout=5) as answer:
                state = json.loads(answer.read())
        except OSError:
            return 0
        return sum(1 for w in state.get("workers", []) if w.get("state") == "ALIVE")

    def log_tails(self, size: int = 1500) -> str:
        logs = [self.dir / "master.log", *(h.dir / "worker.log" for h in self.hosts)]
        return "\n".join(
            f"--- {p.name} ({p.parent.name}): {p.read_bytes()[-size:].decode(errors='replace')}"
            for p in logs
            if p.exists()
        )

    # -- faults -----------------------------------------------------------------------------

    def cut(self, host: Host) -> None:
        _ip("link", "set", host.veth, "down")

    def restore(self, host: Host) -> None:
        _ip("link", "set", host.veth, "up")

    # -- teardown ---------------------------------------------------------------------------

    def close(self) -> None:
        """Every process started here, by pid (a host's first process takes its whole pid
        namespace with it), then the namespaces, links and bridge; then the lock."""
        try:
            started = [h.worker for h in self.hosts if h.worker is not None]
            if self.master is not None:
                started.append(self.master)
            _kill_and_reap([p.pid for p in started])
            for proc in started:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(STOP_LIMIT)
            # A pid namespace ends with its first process: the kernel kills the rest, which
            # takes a moment; what is still there after STOP_LIMIT is reported and killed.
            deadline = time.monotonic() + STOP_LIMIT
            while any(h.pids() for h in self.hosts) and time.monotonic() < deadline:
                time.sleep(0.1)  # no event tells when a namespace's last process is gone
            for host in self.hosts:
                left = host.pids()
                self.stragglers += left
                _kill_and_reap(left)
            remove_leftovers()
        finally:
            if self._lock_fd >= 0:
                os.close(self._lock_fd)
                self._lock_fd = -1


def spark_class() -> str:
    return str(Path(pyspark.__file__).parent / "bin" / "spark-class")


def remove_leftovers() -> None:
    """The namespaces, links and bridge of a cluster (this run's, or a killed run's), with
    any process still in a host's namespace; each name is ours (the fixed prefixes)."""
    listed = _ip("netns", "list", check=False).stdout.split("\n")
    for line in listed:
        name = line.split(" ")[0]
        if name.startswith(NETNS_PREFIX):
            pids = _ip("netns", "pids", name, check=False).stdout.split()
            _kill_and_reap([int(p) for p in pids])
            _ip("netns", "del", name, check=False)
    _kill_and_reap(_masters_left())
    links = json.loads(_ip("-j", "link", "show", check=False).stdout or "[]")
    for link in links:
        name = link.get("ifname", "")
        if name == BRIDGE or name.startswith(VETH_PREFIX):
            _ip("link", "del", name, check=False)


def _masters_left() -> list[int]:
    """Spark masters a killed run left on the bridge's address (this run's is gone)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                args = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if MASTER_CLASS in args and DRIVER_ADDRESS in args:
            found.append(int(entry))
    return found


def leftovers() -> list[str]:
    """What a closed cluster must not have left: its namespaces and links."""
    names = [line.split(" ")[0] for line in _ip("netns", "list").stdout.splitlines()]
    links = [link.get("ifname", "") for link in json.loads(_ip("-j", "link", "show").stdout)]
    return [n for n in names if n.startswith(NETNS_PREFIX)] + [
        n for n in links if n == BRIDGE or n.startswith(VETH_PREFIX)
    ]
