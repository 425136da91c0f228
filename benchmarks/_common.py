"""What every benchmark script reads the same way: percentiles, free ports, CPU and memory
of processes, how busy the machine is, and a loopback-only network for peers that would
otherwise reach out to the Internet.

Not run by itself. The scripts of this directory run as scripts, so the directory is on
`sys.path` and they `import _common`; tests that load a script by path put it there too.
"""

from __future__ import annotations

import ctypes
import fcntl
import math
import os
import resource
import socket
import struct
import sys
import time
from collections.abc import Sequence

__all__ = [
    "busy_cpu_s",
    "enter_loopback_namespace",
    "free_port",
    "free_ports",
    "only_loopback",
    "percentile",
    "process_cpu_ns",
    "process_cpu_s",
    "process_switches",
    "rss_kib",
    "self_cpu_s",
    "wait_quiet",
    "wakeups",
]


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sample: a value it holds."""
    if not values:
        raise ValueError("percentile of an empty sample")
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """`count` distinct free TCP ports on 127.0.0.1 (held open together while picking)."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def self_cpu_s() -> float:
    """User + system CPU seconds of this process so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (/proc/PID/stat); OSError once it
    is gone."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_cpu_ns(pid: int | str = "self") -> int | None:
    """CPU time of process `pid` so far in nanoseconds, every live thread counted: the sum of
    the first field (time on a CPU, `se.sum_exec_runtime`) of /proc/PID/task/*/schedstat.
    None once the process is gone. Not quantised to clock ticks as /proc/PID/stat is (10 ms
    here: an idle node's 30 s were 3 or 4 ticks); a thread that has exited is no longer
    counted, so read it around a window in which threads live on (the window's threads are
    listed by `process_switches`)."""
    total = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", encoding="ascii") as fh:
                total += int(fh.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile
    return total


def process_switches(pid: int | str = "self") -> tuple[int, int, int] | None:
    """(voluntary, involuntary, threads) of process `pid` so far, summed over its live
    threads (/proc/PID/task/*/status): voluntary switches are the times a thread blocked
    and was woken, involuntary ones the times it was preempted. None once it is gone."""
    voluntary = involuntary = threads = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for tid in tids:
        v = _status_field(f"{pid}/task/{tid}", "voluntary_ctxt_switches:")
        n = _status_field(f"{pid}/task/{tid}", "nonvoluntary_ctxt_switches:")
        if v is None or n is None:
            continue  # a thread that ended meanwhile
        voluntary += v
        involuntary += n
        threads += 1
    return voluntary, involuntary, threads


def _status_field(pid: int | str, name: str) -> int | None:
    """The first number of line `name` of /proc/PID/status, None once the process is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith(name):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def rss_kib(pid: int) -> int | None:
    """Resident set size of process `pid` in KiB (/proc/PID/status), None once it is gone."""
    return _status_field(pid, "VmRSS:")


def wakeups(pid: int | str = "self") -> int | None:
    """How many times process `pid` has blocked and been woken so far: its voluntary
    context switches (/proc/PID/status; None where that is missing). A wakeup costs a
    process tens of microseconds of CPU on a busy VM whatever it then does, so these
    counts, per message or per second, say where much of the CPU goes."""
    return _status_field(pid, "voluntary_ctxt_switches:")


def busy_cpu_s() -> float | None:
    """Busy CPU seconds of the whole machine so far (Linux /proc/stat), else None."""
    try:
        with open("/proc/stat") as fh:
            fields = [int(x) for x in fh.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def wait_quiet(limit_s: float, max_busy_cores: float = 0.3) -> float | None:
    """Wait (at most `limit_s`) until other processes leave the CPUs nearly idle.

    Returns the busy cores seen in the last 2 s window (None where /proc/stat is missing).
    """
    deadline = time.monotonic() + limit_s
    while True:
        before = busy_cpu_s()
        time.sleep(2.0)  # a rate over a window: there is nothing to await
        after = busy_cpu_s()
        if before is None or after is None:
            return None
        busy = (after - before) / 2.0
        if busy <= max_busy_cores or time.monotonic() >= deadline:
            return busy
        print(f"waiting for a quiet machine: {busy:.2f} cores busy", file=sys.stderr)


# -- a network of loopback only ---------------------------------------------------------------
# iroh dials its relay servers and discovery services on the Internet by default, and its
# Python bindings offer no switch for that. Its benchmark runs in a network namespace of its
# own, which has nothing but a loopback interface: there is no route out at all.

_CLONE_NEWNET = 0x40000000
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1


def only_loopback() -> bool:
    """Is `lo` the only network interface this process sees?"""
    return [name for _, name in socket.if_nameindex()] == ["lo"]


def enter_loopback_namespace() -> None:
    """Move this process into a new network namespace with `lo` up and nothing else (Linux,
    root); its children inherit it. OSError when the kernel refuses."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(_CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"unshare(CLONE_NEWNET): {os.strerror(errno)}")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sH", b"lo", 0)
        flags = struct.unpack("16sH", fcntl.ioctl(s, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack("16sH", b"lo", flags | _IFF_UP))
