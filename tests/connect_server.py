"""A Spark Connect server from the pip package, on loopback, for the Connect tests.

`ConnectServer.start` runs `spark-submit --class ...SparkConnectServer` (what the package's
`sbin/start-connect-server.sh` runs, without its daemonising) as a child process, in a
directory of its own: its TMPDIR, so the episub agents its planners and executors start put
their sockets in `agent_dir`, apart from any other Spark's; its log; its event log
(uncompressed: what Spark's UI and history server show is built from these events). The
Python of its workers is this test run's.

`stop` ends it by its pid (spark-submit execs the JVM, so the child's pid is the server's),
then waits for every agent it had started to notice that its owner is gone, and kills any
left: every process the fixture caused is gone after it, and an agent that outlived the
server is reported.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pyspark

from tests.proc_helpers import is_alive

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
START_LIMIT = 180.0  # s: a JVM and the Connect service start in ~15 s; a loaded CI is slower
STOP_LIMIT = 60.0  # s: Spark's shutdown hooks
AGENT_EXIT_LIMIT = 30.0  # s: agents check their owner every second (lifetime.WATCH_INTERVAL)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def agent_processes() -> dict[int, list[str]]:
    """Every running `episub ... agent` process: pid -> its command line."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                args = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if "episub.cli" in args and "agent" in args:
            out[int(entry)] = args
    return out


def argument(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args[:-1] else None


class ConnectServer:
    def __init__(self, directory: Path, master: str = "local[2]") -> None:
        self.dir = directory
        self.tmp = directory / "tmp"
        self.tmp.mkdir()
        self.events = directory / "events"
        self.events.mkdir()
        self.log_path = directory / "server.log"
        self.port = free_port()
        self.url = f"sc://127.0.0.1:{self.port}"
        spark_submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
        root = str(Path(__file__).resolve().parent.parent)
        env = {
            key: value
            for key, value in os.environ.items()
            if key not in ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE")
        }
        env.update(PYSPARK_PYTHON=sys.executable, TMPDIR=str(self.tmp), PYTHONPATH=root)
        confs = {
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.driver.host": "127.0.0.1",
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "2",
            "spark.local.dir": str(self.tmp),
            "spark.sql.warehouse.dir": str(directory / "warehouse"),
            "spark.eventLog.enabled": "true",
            "spark.eventLog.dir": str(self.events),
            "spark.eventLog.compress": "false",
        }
        command = [str(spark_submit), "--master", master, "--class", SERVER_CLASS]
        for name, value in confs.items():
            command += ["--conf", f"{name}={value}"]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=env, cwd=directory,
            )  # fmt: skip
        self.pid = self.process.pid  # spark-submit execs the JVM: this is the server
        self._wait_listening()

    @property
    def agent_dir(self) -> Path:
        return self.tmp / f"episub-{os.getuid()}"

    def _wait_listening(self) -> None:
        deadline = time.monotonic() + START_LIMIT
        while True:
            if self.process.poll() is not None:
                raise AssertionError(
                    f"the Connect server exited ({self.process.returncode}): {self.log_tail()}"
                )
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            if time.monotonic() > deadline:
                self.process.kill()
                raise AssertionError(f"no Connect server within {START_LIMIT} s")
            time.sleep(0.2)  # a port that starts to accept sends no event

    def log_tail(self, size: int = 3000) -> str:
        return self.log_path.read_bytes()[-size:].decode(errors="replace")

    def agents(self) -> dict[int, list[str]]:
        """The agents this server's processes started: their sockets are in agent_dir."""
        prefix = str(self.agent_dir) + os.sep
        return {
            pid: args
            for pid, args in agent_processes().items()
            if (argument(args, "--socket") or "").startswith(prefix)
        }

    def log_files(self) -> list[Path]:
        """The server's log, its event log, and every agent's log."""
        return [self.log_path, *self.events.rglob("*"), *self.agent_dir.glob("*.log")]

    def stop(self) -> list[int]:
        """Stop the server by its pid, then wait for its agents to go; kills and returns
        the pids of agents that outlived it."""
        agents = list(self.agents())
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGTERM)
        try:
            self.process.wait(STOP_LIMIT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        left = []
        deadline = time.monotonic() + AGENT_EXIT_LIMIT
        for pid in agents:
            try:
                fd = os.pidfd_open(pid)
            except ProcessLookupError:
                continue
            try:
                gone, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            finally:
                os.close(fd)
            if not gone and is_alive(pid):
                left.append(pid)
                os.kill(pid, signal.SIGKILL)
        return left
