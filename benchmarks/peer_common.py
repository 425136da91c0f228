"""Shared driver for the loopback benchmark's node processes (see loopback.py's contract).

Not run by itself: ``gossipsub_peer.py`` and ``episub_peer.py`` import it (they run as
scripts, so this directory is on ``sys.path``). Each of them supplies an *adapter* with a
handful of async methods; this module does the rest of the per-process contract that the
docstring of ``loopback.py`` describes: the command line, the stdin/stdout line protocol
(``LISTENING``/``BOOTSTRAP``/``READY``/``START``/``DONE``/``STOP``/``RESULT``), the payload
header, the publish loop (paced or burst, bounded in count and time), the receive
bookkeeping and the result JSON.

Payload layout: the first 16 bytes are ``struct.pack("!IIQ", publisher_index, seq,
send_time_ns)`` with ``send_time_ns = time.time_ns()`` taken right before the publish call;
the rest is filler up to ``--size`` bytes. Latency is receive ``time.time_ns()`` minus that
stamp (all processes share one machine clock).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import platform
import resource
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import trio
from _common import wakeups

HEADER = "!IIQ"
HEADER_SIZE = 16  # struct.calcsize(HEADER)
TOPIC = "episub-bench"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="one node of benchmarks/loopback.py")
    p.add_argument("--index", type=int, required=True, help="node index 0..N-1")
    p.add_argument("--nodes", type=int, required=True, help="N, number of nodes in the run")
    p.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (0 = any)")
    p.add_argument("--role", choices=("publisher", "receiver"), required=True)
    p.add_argument("--publishers", type=int, default=1, help="K publishers (indices 0..K-1)")
    p.add_argument("--messages", type=int, required=True, help="M messages per publisher")
    p.add_argument("--size", type=int, required=True, help=f"payload bytes (>= {HEADER_SIZE})")
    p.add_argument("--rate", type=float, default=0.0, help="msg/s per publisher, 0 = burst")
    p.add_argument(
        "--batch",
        type=int,
        default=1,
        help="a burst's messages per publish call, through the adapter's publish_many "
        "(1: one call per message)",
    )
    p.add_argument(
        "--phase",
        type=float,
        default=0.0,
        help="a paced publisher's first message this many seconds after START",
    )
    p.add_argument("--topic", default=TOPIC)
    p.add_argument("--deadline", type=float, default=300.0, help="hard lifetime cap, seconds")
    p.add_argument("--out", default=None, help="also write the result JSON to this file")
    args = p.parse_args(argv)
    if args.size < HEADER_SIZE:
        p.error(f"--size must be at least {HEADER_SIZE}")
    if not 0 <= args.index < args.nodes:
        p.error("--index must be in 0..N-1")
    if args.batch < 1:
        p.error("--batch must be at least 1")
    return args


def expected_count(args: argparse.Namespace) -> int:
    """Distinct messages this node must receive: every other publisher's M messages."""
    others = args.publishers - (1 if args.role == "publisher" else 0)
    return max(others, 0) * args.messages


class Adapter(Protocol):
    """What a peer script supplies. All methods run inside the driver's trio run."""

    system: str
    payload_copies: int | None  # data-message arrivals incl. duplicates; None if unknown
    wire_read: int | None  # bytes read from this node's TCP sockets; None if unknown
    wire_written: int | None

    async def listen(self, nursery: trio.Nursery) -> str:
        """Start the node listening on 127.0.0.1:args.port; return its dialable address."""
        ...

    async def connect(self, addrs: list[str]) -> None:
        """Join the overlay using the addresses of nodes started before this one."""
        ...

    async def wait_ready(self) -> None:
        """Return once the overlay around this node can carry the workload."""
        ...

    async def publish(self, data: bytes) -> None: ...

    # Optional: async def publish_many(self, batch: list[bytes]) -> None, for --batch > 1.

    async def receive_batch(self) -> list[bytes]:
        """The payloads delivered to the application since the last call, at least one
        (own publications included or not), as the system's API hands them over."""
        ...

    def config(self) -> dict[str, Any]:
        """Knobs and notes recorded in the result (library settings, what is estimated)."""
        ...

    def versions(self) -> dict[str, str]: ...


def emit(line: str) -> None:
    """One protocol line on stdout; a vanished harness is not an error."""
    try:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
    except (BrokenPipeError, OSError):
        pass


class LineReader:
    """Lines from the harness on stdin, read without blocking the trio loop."""

    def __init__(self) -> None:
        self._stream = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
        self._buf = bytearray()

    async def readline(self) -> str | None:
        while b"\n" not in self._buf:
            chunk = await self._stream.receive_some(65536)
            if not chunk:
                return None  # harness went away: treat as STOP
            self._buf += chunk
        line, _, rest = bytes(self._buf).partition(b"\n")
        self._buf = bytearray(rest)
        return line.decode().strip()

    async def expect(self, word: str) -> list[str] | None:
        """Wait for a line starting with ``word``; None on EOF or STOP."""
        while True:
            line = await self.readline()
            if line is None:
                return None
            parts = line.split()
            if parts and parts[0] == word:
                return parts[1:]
            if parts and parts[0] == "STOP":
                return None


@dataclass
class Stats:
    index: int
    publishers: int
    messages: int
    seen: bytearray = field(init=False)
    distinct: int = 0
    duplicates: int = 0
    own_echo: int = 0
    foreign: int = 0
    first_recv_ns: int | None = None
    last_recv_ns: int | None = None
    latency_ns: list[int] = field(default_factory=list)
    published: int = 0
    publish_start_ns: int | None = None
    publish_end_ns: int | None = None

    def __post_init__(self) -> None:
        self.seen = bytearray(self.publishers * self.messages)

    def missing_ranges(self, most: int = 20) -> list[list[int]]:
        """Expected (publisher, seq) never received, as [publisher, first, last] runs."""
        runs: list[list[int]] = []
        for pub in range(self.publishers):
            if pub == self.index:
                continue
            base = pub * self.messages
            for seq in range(self.messages):
                if self.seen[base + seq]:
                    continue
                if runs and runs[-1][0] == pub and runs[-1][2] == seq - 1:
                    runs[-1][2] = seq
                elif len(runs) < most:
                    runs.append([pub, seq, seq])
        return runs

    def record(self, data: bytes, now_ns: int) -> None:
        if len(data) < HEADER_SIZE:
            self.foreign += 1
            return
        pub = int.from_bytes(data[0:4], "big")
        seq = int.from_bytes(data[4:8], "big")
        sent = int.from_bytes(data[8:16], "big")
        if pub >= self.publishers or seq >= self.messages:
            self.foreign += 1
            return
        if pub == self.index:
            self.own_echo += 1
            return
        slot = pub * self.messages + seq
        if self.seen[slot]:
            self.duplicates += 1
            return
        self.seen[slot] = 1
        self.distinct += 1
        if self.first_recv_ns is None:
            self.first_recv_ns = now_ns
        self.last_recv_ns = now_ns
        self.latency_ns.append(now_ns - sent)


def make_payload(index: int, seq: int, filler: bytes) -> bytes:
    header = index.to_bytes(4, "big") + seq.to_bytes(4, "big")
    return header + time.time_ns().to_bytes(8, "big") + filler


async def publish_loop(adapter: Adapter, args: argparse.Namespace, stats: Stats) -> None:
    """M messages, paced at --rate msg/s (no catch-up bursts) or back to back."""
    filler = os.urandom(args.size - HEADER_SIZE)
    interval = 1.0 / args.rate if args.rate > 0 else 0.0
    start = trio.current_time() + (args.phase if interval else 0.0)
    stats.publish_start_ns = time.time_ns()
    batch = args.batch if not interval else 1
    if batch > 1:
        # A burst as a user with many records at hand publishes it: a batch per call.
        publish_many = adapter.publish_many  # type: ignore[attr-defined]
        for first in range(0, args.messages, batch):
            seqs = range(first, min(first + batch, args.messages))
            await publish_many([make_payload(args.index, seq, filler) for seq in seqs])
            stats.published += len(seqs)
            await trio.lowlevel.checkpoint()  # let the node's own send/receive tasks run
        stats.publish_end_ns = time.time_ns()
        return
    for seq in range(args.messages):
        if interval:
            await trio.sleep_until(start + seq * interval)
        await adapter.publish(make_payload(args.index, seq, filler))
        stats.published += 1
        if not interval:
            await trio.lowlevel.checkpoint()  # let the node's own send/receive tasks run
    stats.publish_end_ns = time.time_ns()


async def receive_loop(adapter: Adapter, stats: Stats, goal: int, done: trio.Event) -> None:
    if goal == 0:
        done.set()
    while True:
        batch = await adapter.receive_batch()
        now = time.time_ns()
        for data in batch:
            stats.record(data, now)
        if stats.distinct >= goal and not done.is_set():
            done.set()


def snapshot(adapter: Adapter) -> dict[str, Any]:
    return {
        "cpu": time.process_time(),
        "wakeups": wakeups(),
        "read": adapter.wire_read,
        "written": adapter.wire_written,
        "copies": adapter.payload_copies,
    }


def _delta(end: int | None, begin: int | None) -> int | None:
    return None if end is None or begin is None else end - begin


def build_result(
    adapter: Adapter,
    args: argparse.Namespace,
    stats: Stats,
    begin: dict[str, Any] | None,
    timed_out: bool,
) -> dict[str, Any]:
    end = snapshot(adapter)
    begin = begin or end  # never started: the data phase is empty
    return {
        "system": adapter.system,
        "index": args.index,
        "role": args.role,
        "expected": expected_count(args),
        "received": stats.distinct + stats.duplicates,
        "distinct": stats.distinct,
        "duplicates": stats.duplicates,
        "own_echo": stats.own_echo,
        "foreign": stats.foreign,
        "first_recv_ns": stats.first_recv_ns,
        "last_recv_ns": stats.last_recv_ns,
        "latency_ns": stats.latency_ns,
        "published": stats.published,
        "publish_start_ns": stats.publish_start_ns,
        "publish_end_ns": stats.publish_end_ns,
        "payload_copies": _delta(end["copies"], begin["copies"]),
        "wire_bytes_read": _delta(end["read"], begin["read"]),
        "wire_bytes_written": _delta(end["written"], begin["written"]),
        "wire_bytes_written_total": end["written"],
        "cpu_s": end["cpu"] - begin["cpu"],
        "wakeups": _delta(end["wakeups"], begin["wakeups"]),
        "cpu_total_s": end["cpu"],
        "maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        "timed_out": timed_out,
        "missing": stats.missing_ranges(),
        "config": adapter.config(),
        "versions": {"python": platform.python_version(), **adapter.versions()},
    }


async def drive(adapter: Adapter, args: argparse.Namespace) -> None:
    """The whole per-process contract. Prints RESULT, then ends the process at once.

    The process exits with ``os._exit`` right after RESULT: tearing a network stack down
    gracefully measures nothing and can hang, and the harness kills stragglers anyway.
    """
    stats = Stats(args.index, args.publishers, args.messages)
    state: dict[str, Any] = {"begin": None}
    goal = expected_count(args)
    # BENCH_PROFILE_DIR=DIR: cProfile the data phase into DIR/node<index>.prof; in wall time,
    # or with BENCH_PROFILE_TIMER=cpu in CPU time (slower to take, but it leaves out the time
    # a process waits for a core, 8 processes sharing 2).
    profile_dir = os.environ.get("BENCH_PROFILE_DIR")
    cpu_timer = os.environ.get("BENCH_PROFILE_TIMER") == "cpu"
    profiler = None
    if profile_dir:
        profiler = cProfile.Profile(time.process_time) if cpu_timer else cProfile.Profile()

    def finish(timed_out: bool) -> None:
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(os.path.join(profile_dir, f"node{args.index}.prof"))
        result = build_result(adapter, args, stats, state["begin"], timed_out)
        text = json.dumps(result, separators=(",", ":"))
        if args.out:
            with open(args.out, "w", encoding="utf-8") as fh:
                fh.write(text + "\n")
        emit("RESULT " + text)
        sys.stderr.flush()
        os._exit(0)

    with trio.move_on_after(args.deadline):
        async with trio.open_nursery() as nursery:
            emit(f"LISTENING {await adapter.listen(nursery)}")
            control = LineReader()
            addrs = await control.expect("BOOTSTRAP")
            if addrs is not None:
                await adapter.connect(addrs)
                await adapter.wait_ready()
                emit("READY")
                if await control.expect("START") is not None:
                    state["begin"] = snapshot(adapter)
                    if profiler is not None:
                        profiler.enable()
                    await _data_phase(adapter, args, stats, goal, control)
            finish(timed_out=False)
    finish(timed_out=True)


async def _data_phase(
    adapter: Adapter, args: argparse.Namespace, stats: Stats, goal: int, control: LineReader
) -> None:
    received = trio.Event()
    async with trio.open_nursery() as inner:
        inner.start_soon(receive_loop, adapter, stats, goal, received)

        async def announce_done() -> None:
            if args.role == "publisher":
                await publish_loop(adapter, args, stats)
            await received.wait()
            emit("DONE")

        inner.start_soon(announce_done)
        await control.expect("STOP")  # returns on STOP or on EOF
        inner.cancel_scope.cancel()
