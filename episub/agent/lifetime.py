"""When an agent should go: its owner process has ended, or nobody has used it for a while.

Spark gives no hook when an executor goes away, and nothing may rely on `stop()` being
called (docs/how-it-works.md, "Why an agent"), so the agent watches for itself. An owner
is gone when its pid no longer exists, is a zombie (dead, not yet reaped by its parent), or
belongs to a newer process than the one we were given (the pid was reused): the start time
in /proc/PID/stat tells the last two apart on Linux; elsewhere only existence is checked.

The socket's lock file (`socket_path + ".lock"`) is shared with the launcher: an agent
that retires because it is idle removes its socket while holding the lock, so a launcher
either sees the agent answer or sees no socket, never a socket that is about to vanish.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator

__all__ = ["OwnerProcess", "lock_path_for", "try_lock"]

# The agent checks its owner and its idleness this often. Guess: an executor's exit is
# noticed within a second, and one stat of /proc per second costs nothing.
WATCH_INTERVAL = 1.0


def lock_path_for(socket_path: str) -> str:
    return socket_path + ".lock"


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks) from /proc/PID/stat, None without /proc."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return ("X", 0)  # the process is gone (with /proc mounted, its entry would exist)
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may itself contain ") ".
    fields = data[data.rindex(b")") + 2 :].split()
    return fields[0].decode(), int(fields[19])


class OwnerProcess:
    """The process whose life bounds the agent's (a Spark executor, a test)."""

    def __init__(self, pid: int) -> None:
        if not isinstance(pid, int) or isinstance(pid, bool) or pid < 1:
            raise ValueError(f"owner pid must be an int >= 1, not {pid!r}")
        self.pid = pid
        stat = _proc_stat(pid) if os.path.isdir("/proc/self") else None
        self._start_time = stat[1] if stat is not None else None
        if not self.alive():
            raise ValueError(f"owner process {pid} does not exist")

    def alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass  # it exists, owned by another user
        if self._start_time is None:
            return True
        stat = _proc_stat(self.pid)
        if stat is None:
            return True
        state, start_time = stat
        return state not in ("Z", "X") and start_time == self._start_time


@contextlib.contextmanager
def try_lock(path: str) -> Iterator[bool]:
    """Hold an exclusive flock on `path` if it is free right now; yields whether we do."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True  # closing the descriptor below releases the lock
    finally:
        os.close(fd)
