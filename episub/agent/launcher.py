"""Start-or-attach: make sure one agent serves a socket path, and say which.

Every Spark Python worker of an executor calls `ensure_agent` with the same socket path;
the first starts the agent, the others find it (docs/how-it-works.md, "Why an agent"). The steps run
under an exclusive `flock` on `socket_path + ".lock"`, so two callers never both start one:

1. An agent answering `inspect` on the socket: attach to it.
2. Otherwise the socket file is stale (its agent died without removing it): remove it, and
   start `python -m episub.cli agent ... --detach` in a session of its own, stdin and
   stdout on /dev/null, stderr appended to `socket_path + ".log"`. The key travels in the
   environment (EPISUB_KEY), never on the command line where `ps` would show it.
3. Wait for its readiness line on a pipe (the agent writes it once the socket accepts),
   bounded by `start_timeout`, then ask it `inspect` for its pid and address.

`--detach` makes the agent fork once more and its first process exit, which we reap: the
agent is then nobody's child, so it leaves no zombie behind in a long-lived worker, and
lives on when the worker that started it is killed.

An agent retiring for idleness removes its socket under the same lock (lifetime.py), so a
caller never attaches to an agent that is about to vanish; one that retires between
`ensure_agent` and the caller's first request surfaces as AgentUnavailable, and calling
`ensure_agent` again starts a new one.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import select
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from episub.agent.client import AgentClient
from episub.agent.errors import AgentTimeout, AgentUnavailable
from episub.agent.lifetime import lock_path_for
from episub.agent.options import KEY_ENV, KEY_SIZE
from episub.proto.store import RetentionConfig

__all__ = ["DEFAULT_IDLE_TIMEOUT", "START_TIMEOUT", "AgentInfo", "ensure_agent"]

# Starting: Python, trio and the node's listener take about a second; a join at start is
# none (the agent joins when asked). Guess: 30 s leaves room for a loaded CI machine.
START_TIMEOUT = 30.0
# How long to wait for another caller's start under the lock: its whole start, and more.
LOCK_TIMEOUT = START_TIMEOUT + 10.0
LOCK_POLL = 0.02  # flock has no timeout; 20 ms between tries is cheap and prompt
# An agent idle this long has nothing anyone asked for: it equals retention's max_age, the
# window in which a replay could still want what the agent holds.
DEFAULT_IDLE_TIMEOUT = RetentionConfig().max_age
PROBE_TIMEOUT = 5.0  # guess: a live agent answers inspect in milliseconds
_LOG_TAIL = 2000  # bytes of the agent's log quoted when it fails to start


@dataclass(frozen=True, slots=True)
class AgentInfo:
    pid: int
    socket_path: str
    address: str  # "host:port" the agent's node listens on


def ensure_agent(
    socket_path: str,
    *,
    key: bytes,
    listen: str = "127.0.0.1:0",
    advertise: str | None = None,
    bootstrap: Sequence[str] = (),
    owner_pid: int | None = None,
    owner_files: Sequence[str] = (),
    idle_timeout: float | None = DEFAULT_IDLE_TIMEOUT,
    config_file: str | None = None,
    python: str = sys.executable,
    start_timeout: float = START_TIMEOUT,
    encrypt: bool = True,
    sign: bool = False,
    metrics_port: int | None = None,
) -> AgentInfo:
    """The agent serving `socket_path`, started if none is there; see the module doc.

    key: the deployment's 32-byte key. listen/advertise/bootstrap/config_file: the agent's
    node, as for `episub agent`. owner_pid: the agent exits when that process is gone, and
    removes `owner_files` then.
    idle_timeout: seconds without client or request before it exits (None: never).
    encrypt, sign: `--no-encryption` unless encrypt, `--signed` if sign (an agent already
    running keeps the settings it was started with).
    metrics_port: `--metrics-port` (0: any free port; the agent's inspect() says which).
    """
    if not isinstance(key, bytes) or len(key) != KEY_SIZE:
        raise ValueError(f"key must be {KEY_SIZE} bytes, not {key!r:.20}")
    if isinstance(bootstrap, str):
        raise TypeError(f"bootstrap must be a list of 'host:port' strings, not {bootstrap!r}")
    socket_path = os.path.abspath(socket_path)
    os.makedirs(os.path.dirname(socket_path), exist_ok=True)
    fd = os.open(lock_path_for(socket_path), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        _lock(fd, socket_path)
        info = _attach(socket_path, sign)
        if info is not None:
            return info
        with contextlib.suppress(FileNotFoundError):
            os.unlink(socket_path)  # stale; we hold the lock, so no agent is starting on it
        command = [python, "-m", "episub.cli", "agent", "--socket", socket_path]
        command += ["--listen", listen, "--detach"]
        if advertise is not None:
            command += ["--advertise", advertise]
        for address in bootstrap:
            command += ["--bootstrap", address]
        if owner_pid is not None:
            command += ["--owner-pid", str(owner_pid)]
        for path in owner_files:
            command += ["--owner-file", path]
        if idle_timeout is not None:
            command += ["--idle-timeout", repr(float(idle_timeout))]
        if config_file is not None:
            command += ["--config", config_file]
        if not encrypt:
            command.append("--no-encryption")
        if sign:
            command.append("--signed")
        if metrics_port is not None:
            command += ["--metrics-port", str(metrics_port)]
        _start(command, socket_path, key, start_timeout)
        info = _attach(socket_path, sign)
        if info is None:
            raise AgentUnavailable(f"the agent started for {socket_path!r} does not answer")
        return info
    finally:
        os.close(fd)  # releases the lock


def _lock(fd: int, socket_path: str) -> None:
    deadline = time.monotonic() + LOCK_TIMEOUT
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise AgentUnavailable(
                    f"{lock_path_for(socket_path)!r} stayed locked for {LOCK_TIMEOUT} s: "
                    "another process is stuck starting an agent"
                ) from None
            time.sleep(LOCK_POLL)


def _attach(socket_path: str, sign: bool) -> AgentInfo | None:
    """The agent answering on `socket_path`; None when nothing listens there."""
    try:
        with AgentClient(socket_path, timeout=PROBE_TIMEOUT) as client:
            status = client.inspect()
    except AgentTimeout:
        raise  # an agent is there but does not answer: not ours to replace
    except AgentUnavailable:
        return None
    if bool(status.stats.get("signed", 0)) != sign:
        # Its node could not talk to the deployment's others (their handshakes fail).
        raise AgentUnavailable(
            f"the agent at {socket_path!r} (pid {status.pid}) runs with signed publishing "
            f"{'on' if not sign else 'off'}, and this deployment has it {'on' if sign else 'off'}"
        )
    return AgentInfo(pid=status.pid, socket_path=socket_path, address=status.address)


def _start(command: list[str], socket_path: str, key: bytes, timeout: float) -> None:
    log_path = socket_path + ".log"
    read_end, write_end = os.pipe()
    try:
        with open(log_path, "ab") as log_file:
            process = subprocess.Popen(
                [*command, "--ready-fd", str(write_end)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log_file,
                pass_fds=(write_end,),
                start_new_session=True,
                env={**os.environ, KEY_ENV: key.hex()},
            )
        os.close(write_end)
        write_end = -1
        # --detach: the first process exits once it has forked the agent (at once).
        status = process.wait(timeout=timeout)
        if status != 0:
            raise AgentUnavailable(
                f"the agent for {socket_path!r} exited with status {status} before it was "
                f"ready{_log_tail(log_path)}"
            )
        ready, _, _ = select.select([read_end], [], [], timeout)
        line = os.read(read_end, 64) if ready else b""
        if not line.startswith(b"ready"):
            why = "did not get ready in time" if not ready else "exited before it was ready"
            raise AgentUnavailable(f"the agent for {socket_path!r} {why}{_log_tail(log_path)}")
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise AgentUnavailable(
            f"starting the agent for {socket_path!r} took over {timeout} s"
        ) from None
    finally:
        os.close(read_end)
        if write_end != -1:
            os.close(write_end)


def _log_tail(log_path: str) -> str:
    try:
        with open(log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - _LOG_TAIL))
            lines = f.read().decode("utf-8", "replace").strip().splitlines()
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            return f" (and its log {log_path!r} is unreadable: {exc.strerror})"
        return ""
    return f"; its log {log_path!r} ends: {lines[-1]}" if lines else ""
