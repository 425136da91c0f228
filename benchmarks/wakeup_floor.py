"""What one wakeup costs a reader process before it does any work of its own.

    PY=/work/main/.venv/bin/python
    $PY benchmarks/wakeup_floor.py --readers 32 --out benchmarks/results/wakeup_floor.json

One sender pushes a 200-byte frame to each of `--readers` reader processes every
`--interval-ms` (20 ms: config_broadcast.py's pace), over loopback TCP. Each reader only
receives the frame and throws it away, in one of these ways:

  block          a blocking `socket.recv` loop
  asyncio        `await StreamReader.read` in asyncio's loop
  trio-raw       `await trio.lowlevel.wait_readable(sock)` then a non-blocking `recv`
  trio-stream    `await trio.SocketStream.receive_some` (what most trio code does)
  trio-handoff   trio-stream in one task, which wakes a second task (an Event per frame):
                 the least a node runtime and an application waiting on it can do

Frames that arrive together are read in one go (the counts are of bytes), so a reader
wakes at most once per frame. A reader's CPU per frame is its user+system CPU over the
frames (getrusage). Every
process on this host shares the cores and wakes once per frame, as the readers of
config_broadcast.py do, so the figures are the floor a reader of that benchmark pays per
update on this machine for the way it waits, before decoding anything: the cost is mostly
cold caches after 20 ms of other processes running, so it grows with the code a wakeup runs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import socket
import subprocess
import sys
import time
from typing import Any

from _common import percentile

MODES = ("block", "asyncio", "trio-raw", "trio-stream", "trio-handoff")
FRAME = b"y" * 200


def cpu() -> tuple[float, float, int]:
    """User and system CPU seconds and voluntary context switches (wakeups) so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime, usage.ru_stime, usage.ru_nvcsw


def report(frames: int, before: tuple[float, float, int]) -> None:
    user, system, woken = cpu()
    print(json.dumps({"user_us": (user - before[0]) / frames * 1e6,
                      "sys_us": (system - before[1]) / frames * 1e6,
                      "wakeups": (woken - before[2]) / frames}), flush=True)  # fmt: skip


def read_block(sock: socket.socket, frames: int) -> None:
    sock.recv(1)  # the start signal: count from here
    before, left = cpu(), frames * len(FRAME)
    while left > 0:
        left -= len(sock.recv(65536))
    report(frames, before)


def read_asyncio(sock: socket.socket, frames: int) -> None:
    import asyncio

    async def main() -> None:
        reader, _writer = await asyncio.open_connection(sock=sock)
        await reader.readexactly(1)
        before, left = cpu(), frames * len(FRAME)
        while left > 0:
            left -= len(await reader.read(65536))
        report(frames, before)

    asyncio.run(main())


def read_trio(sock: socket.socket, frames: int, mode: str) -> None:
    import trio

    async def main() -> None:
        stream = trio.SocketStream(trio.socket.from_stdlib_socket(sock))
        await stream.receive_some(1)
        before, left = cpu(), frames * len(FRAME)
        if mode == "trio-raw":
            while left > 0:
                await trio.lowlevel.wait_readable(sock)
                left -= len(sock.recv(65536))
        elif mode == "trio-stream":
            while left > 0:
                left -= len(await stream.receive_some(65536))
        else:
            arrived = trio.Event()

            async def read() -> None:
                nonlocal arrived, left
                while left > 0:
                    left -= len(await stream.receive_some(65536))
                    arrived.set()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(read)
                while left > 0:
                    await arrived.wait()
                    arrived = trio.Event()
        report(frames, before)

    trio.run(main)


def reader(mode: str, port: int, frames: int) -> None:
    sock = socket.create_connection(("127.0.0.1", port))
    if mode == "block":
        read_block(sock, frames)
    elif mode == "asyncio":
        read_asyncio(sock, frames)
    else:
        read_trio(sock, frames, mode)


def run(mode: str, readers: int, frames: int, interval_s: float) -> dict[str, Any]:
    listener = socket.create_server(("127.0.0.1", 0), backlog=readers)
    port = listener.getsockname()[1]
    argv = [sys.executable, __file__, "--reader", mode, str(port), str(frames)]
    children = [subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) for _ in range(readers)]
    try:
        conns = [listener.accept()[0] for _ in range(readers)]
        for conn in conns:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        time.sleep(1.0)  # every reader is parked in its loop's wait (no event to await)
        for conn in conns:
            conn.send(b"s")
        due = time.monotonic()
        for _ in range(frames):
            due += interval_s
            time.sleep(max(0.0, due - time.monotonic()))
            for conn in conns:
                conn.send(FRAME)
        results = [json.loads(child.stdout.readline()) for child in children]  # type: ignore[union-attr]
    finally:
        for child in children:
            child.kill()
            child.wait()
        listener.close()
    per_frame = [r["user_us"] + r["sys_us"] for r in results]
    return {
        "mode": mode,
        "readers": readers,
        "frames": frames,
        "cpu_us_per_wakeup_median": round(percentile(per_frame, 50), 1),
        "cpu_us_per_wakeup_mean": round(sum(per_frame) / len(per_frame), 1),
        "sys_us_per_wakeup_mean": round(sum(r["sys_us"] for r in results) / len(results), 1),
        "wakeups_per_frame": round(sum(r["wakeups"] for r in results) / len(results), 3),
    }


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--reader":
        reader(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--readers", type=int, default=32)
    parser.add_argument("--frames", type=int, default=200)
    parser.add_argument("--interval-ms", type=float, default=20.0)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--out", help="write the figures here as JSON")
    args = parser.parse_args()
    load_before = list(os.getloadavg())
    figures = []
    for mode in args.modes.split(","):
        result = run(mode, args.readers, args.frames, args.interval_ms / 1000)
        print(f"{mode:13} {result['cpu_us_per_wakeup_median']:7.1f} us CPU per wakeup (median "
              f"reader; mean {result['cpu_us_per_wakeup_mean']}, of which system "
              f"{result['sys_us_per_wakeup_mean']}; "
              f"{result['wakeups_per_frame']} wakeups a frame)")  # fmt: skip
        figures.append(result)
    machine = {"loadavg_before": load_before, "python": platform.python_version()}
    out = {"command": " ".join(sys.argv), "interval_ms": args.interval_ms, "figures": figures,
           "machine": machine}  # fmt: skip
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
