"""Real OS processes for the agent, CLI and multi-process tests, and their cleanup.

`processes` (a pytest fixture, via `Processes`) starts `episub` commands and Python snippets
as child processes, reads their output lines with a bound on every wait, and, at teardown,
kills every process it started, and every pid a test registered (agents that
`ensure_agent` started detached), by PID; then it fails the test if any of them logged a
core error (their stderr files, and agents' SOCKET.log, in its directory). Nothing here
waits with a fixed sleep: a wait is for a line, a socket, a process exit (pidfd), or a
polled condition with a deadline.

Timeouts only bound a wait so a broken build fails instead of hanging; no assertion
depends on how long anything took.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from episub.agent import AgentClient
from episub.agent.lifetime import OwnerProcess

KEY = bytes(range(32))
KEY_HEX = KEY.hex()
TOPIC = "t"
WAIT = 60.0  # bound on any single wait; a failing build stops here instead of hanging

# Membership timers ~10x the defaults' pace (as tests/net_helpers.fast_config), so overlays
# of a dozen processes form and optimise in seconds. Broadcast keeps its defaults: with
# fast_config's gap timers (0.5 s, then 6 retries 0.2 s apart) a node of a dozen busy
# processes on 2 cores gave up on a gap (DataLost) before the late copy came, about one run
# in six; the defaults wait ~4 s.
FAST_CONFIG: dict[str, Any] = {
    "membership": {
        "stabilize_interval": 0.2,
        "optimize_interval": 0.5,
        "shuffle_interval": 3.0,
        "ping_interval": 0.5,
        "passive_probe_interval": 0.2,
        "ping_timeout": 2.0,
        "neighbor_request_timeout": 1.0,
        "join_retry_interval": 0.5,
    },
}


def env() -> dict[str, str]:
    """The children's environment: the test key, and this checkout first on the path."""
    root = str(Path(__file__).resolve().parent.parent)
    path = os.environ.get("PYTHONPATH")
    return {
        **os.environ,
        "EPISUB_KEY": KEY_HEX,
        "PYTHONPATH": root if not path else f"{root}{os.pathsep}{path}",
    }


class Proc:
    """A child process with line-by-line access to its stdout, each read bounded."""

    def __init__(self, popen: subprocess.Popen[bytes], name: str, stderr_path: Path) -> None:
        self.popen = popen
        self.name = name
        self.pid = popen.pid
        self.stderr_path = stderr_path
        self._buffer = b""

    def read_line(self, timeout: float = WAIT) -> str:
        """The next stdout line (without newline); AssertionError on EOF or timeout."""
        assert self.popen.stdout is not None
        fd = self.popen.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            ready, _, _ = select.select([fd], [], [], max(0.0, remaining))
            if not ready:
                raise AssertionError(f"{self.name}: no line within {timeout} s")
            chunk = os.read(fd, 65536)
            if not chunk:
                raise AssertionError(
                    f"{self.name} ended (status {self.popen.wait()}) before a line; "
                    f"stderr: {self.stderr_text()}"
                )
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()

    def write_line(self, text: str) -> None:
        assert self.popen.stdin is not None
        self.popen.stdin.write(text.encode() + b"\n")
        self.popen.stdin.flush()

    def wait(self, timeout: float = WAIT) -> int:
        return self.popen.wait(timeout)

    def stderr_text(self) -> str:
        """What the process has written on stderr so far."""
        return self.stderr_path.read_bytes().decode(errors="replace")


def wait_process_gone(pid: int, timeout: float = WAIT) -> None:
    """Wait for `pid` (not necessarily our child) to end: a pidfd becomes readable then."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        ready, _, _ = select.select([fd], [], [], timeout)
        assert ready, f"process {pid} still running after {timeout} s"
    finally:
        os.close(fd)


def is_alive(pid: int) -> bool:
    try:
        return OwnerProcess(pid).alive()
    except ValueError:
        return False


def wait_until(predicate: Callable[[], bool], timeout: float = WAIT, what: str = "it") -> None:
    """Poll where no event exists (an overlay converging); fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout} s")
        time.sleep(0.05)


class Processes:
    """Starts processes for one test; `kill_all` (the fixture's teardown) ends them all."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.procs: list[Proc] = []
        self.pids: list[int] = []  # started elsewhere (detached agents), killed here too
        self._count = 0

    def start(
        self,
        args: Sequence[str],
        *,
        name: str | None = None,
        stdin: bool = False,
        merge_stderr: bool = False,
    ) -> Proc:
        self._count += 1
        name = name or f"proc{self._count}"
        stderr_path = self.dir / f"{name}.stderr"
        with open(stderr_path, "wb") as err:  # a file: a pipe nobody reads could fill up
            popen = subprocess.Popen(
                list(args),
                stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT if merge_stderr else err,
                env=env(),
            )
        proc = Proc(popen, name, stderr_path)
        self.procs.append(proc)
        return proc

    def episub(
        self, *args: str, name: str | None = None, stdin: bool = False, merge_stderr: bool = False
    ) -> Proc:
        command = [sys.executable, "-m", "episub.cli", *args]
        return self.start(command, name=name, stdin=stdin, merge_stderr=merge_stderr)

    def python(self, code: str, *args: str, name: str | None = None, stdin: bool = False) -> Proc:
        return self.start([sys.executable, "-c", code, *args], name=name, stdin=stdin)

    def config_file(self, overrides: dict[str, Any] | None = None) -> str:
        """FAST_CONFIG, with `overrides` merged per section, as a file for --config."""
        config = json.loads(json.dumps(FAST_CONFIG))
        for section, values in (overrides or {}).items():
            config.setdefault(section, {}).update(values)
        path = self.dir / f"config{self._count}.json"
        path.write_text(json.dumps(config))
        return str(path)

    def kill_all(self) -> None:
        for proc in self.procs:
            if proc.popen.poll() is None:
                proc.popen.kill()
        for pid in self.pids:
            if is_alive(pid):
                os.kill(pid, signal.SIGKILL)
        for proc in self.procs:
            # Unkillable (D state) after 10 s: nothing more a test can do.
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(10)
            for stream in (proc.popen.stdin, proc.popen.stdout):
                if stream is not None:
                    stream.close()


def socket_dir() -> str:
    """A short directory for Unix sockets (a socket path has at most 107 bytes)."""
    return tempfile.mkdtemp(prefix="ep-", dir="/tmp")


# What a node's runtime logs when its core fails (episub/net/runtime.py): contained, so
# the process lives on, and only its log tells.
CORE_ERROR_MARK = b"episub core error"


def core_errors_logged(directory: Path) -> list[str]:
    """Lines of the processes' stderr files and agents' logs (SOCKET.log) in `directory`
    that report a core error."""
    found = []
    for path in sorted([*directory.glob("*.stderr"), *directory.glob("*.log")]):
        for line in path.read_bytes().splitlines():
            if CORE_ERROR_MARK in line:
                found.append(f"{path.name}: {line.decode(errors='replace')}")
    return found


@pytest.fixture
def processes() -> Iterator[Processes]:
    directory = Path(socket_dir())
    group = Processes(directory)
    try:
        yield group
        group.kill_all()
        logged = core_errors_logged(directory)
        assert not logged, "core errors in the processes' logs:\n" + "\n".join(logged)
    finally:
        group.kill_all()
        shutil.rmtree(directory, ignore_errors=True)


def start_node(
    processes: Processes,
    name: str,
    *,
    bootstrap: Sequence[str] = (),
    config: str | None = None,
    link_delay: str | None = None,
    listen: str = "127.0.0.1:0",
    topics: Sequence[str] = (TOPIC,),
    signed: bool = False,
) -> Proc:
    """An `episub node` serving its agent socket at dir/NAME.sock; not waited for."""
    args = ["node", "--listen", listen, "--socket", str(processes.dir / f"{name}.sock")]
    if signed:
        args.append("--signed")
    for address in bootstrap:
        args += ["--bootstrap", address]
    for topic in topics:
        args += ["--topic", topic]
    if config is not None:
        args += ["--config", config]
    if link_delay is not None:
        args += ["--link-delay", link_delay]
    return processes.episub(*args, name=name)


def node_ready(proc: Proc) -> tuple[str, str]:
    """Wait for `episub node`'s readiness line; returns (peer id, address)."""
    line = proc.read_line()
    words = line.split()
    assert words[:2] == ["episub", "node"] and words[3:5] == ["listening", "on"], line
    return words[2], words[5]


def wait_for_neighbour(socket_path: str, topic: str = TOPIC) -> None:
    """Until the agent's node has a link in `topic` (node readiness only means joined)."""

    def linked() -> bool:
        with AgentClient(socket_path) as client:
            return bool(client.inspect().topics.get(topic))

    wait_until(linked, what=f"a neighbour of {socket_path}")
