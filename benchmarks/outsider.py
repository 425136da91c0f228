"""What an outsider without the key can do to a node: one phase per kind of connection.

    flock /tmp/episub-heavy.lock .venv/bin/python benchmarks/outsider.py \\
        --seconds 15 --out benchmarks/results/outsider.json

One target `episub node` process on 127.0.0.1 (the defaults, its agent socket for stats).
For each mode of tests/outsider_client.py (garbage, huge, truncated, slow, idle), in
that order, a client process connects from 127.0.0.2 as fast as it can for --seconds
(bounded by --connections too); once it has opened 100 connections, an honest `Node` in
this process joins the topic through the target from 127.0.0.1, and the target publishes
one message to it. Per phase, the JSON and the table give:

  connections        what the client opened (and failed to), and per second
  honest join        seconds from Node.join() to its return, and whether the message came
  target RSS         VmRSS before the phase and its peak during it (sampled every 0.1 s)
  target CPU         user + system CPU seconds of the target during the phase
  failures           the target's handshake failures during the phase, by reason
  log                bytes the target wrote to its log during the phase

The load average at each phase's start is recorded: the machine is shared.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import trio
from config_broadcast import process_cpu_s
from soak import rss_kib

from episub import Delivery, Node
from episub.agent import AgentClient

HERE = Path(__file__).resolve().parent
CLIENT = HERE.parent / "tests" / "outsider_client.py"  # the tests run it too
KEY = bytes(range(32))
TOPIC = "t"
MODES = ("garbage", "huge", "truncated", "slow", "idle")
WAIT = 60.0  # bound on any wait for a line or a message


def read_line(proc: subprocess.Popen[str], prefix: str) -> str:
    """The next stdout line starting with `prefix` (others skipped); fails on EOF."""
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith(prefix):
            return line.strip()
    raise SystemExit(f"{proc.args!r} ended (status {proc.wait()}) before {prefix!r}")


def stats(socket_path: str) -> dict[str, int]:
    with AgentClient(socket_path) as client:
        return client.inspect().stats


async def honest_join(target: str, socket_path: str) -> dict[str, Any]:
    """Join through `target` from 127.0.0.1; the target publishes one message to us."""
    async with Node(key=KEY) as node, node.subscribe(TOPIC) as sub:
        start = time.monotonic()
        try:
            await node.join(TOPIC, bootstrap=[target])
        except (OSError, TimeoutError) as exc:
            return {"joined": False, "error": str(exc)}
        joined = time.monotonic() - start
        await trio.to_thread.run_sync(publish_one, socket_path)
        with trio.move_on_after(WAIT):
            item = await sub.receive()
            return {"joined": True, "join_s": joined, "received": isinstance(item, Delivery)}
        return {"joined": True, "join_s": joined, "received": False}


def publish_one(socket_path: str) -> None:
    with AgentClient(socket_path) as client:
        client.publish(TOPIC, b"hello")


class Sampler:
    """VmRSS of `pid` every 0.1 s on a thread, until stopped; keeps the peak."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = rss_kib(pid) or 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self.peak = max(self.peak, rss_kib(self.pid) or 0)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def phase(mode: str, args: argparse.Namespace, target: dict[str, Any]) -> dict[str, Any]:
    pid, socket_path = target["pid"], target["socket"]
    before = stats(socket_path)
    log_before = os.path.getsize(target["log"])
    rss_before = rss_kib(pid)
    cpu_before = process_cpu_s(pid)
    load = os.getloadavg()
    sampler = Sampler(pid)
    client = subprocess.Popen(
        [sys.executable, str(CLIENT), "--mode", mode, "--target", target["address"],
         "--source", "127.0.0.2", "--seconds", str(args.seconds),
         "--connections", str(args.connections)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        started = time.monotonic()
        read_line(client, "OPENED 100")
        honest = trio.run(honest_join, target["address"], socket_path)
        done = read_line(client, "DONE").split()
        elapsed = time.monotonic() - started
    finally:
        if client.poll() is None:
            client.kill()
        client.wait()
    peak = sampler.stop()
    after = stats(socket_path)
    opened, failed = int(done[1]), int(done[2])
    failures = {
        name.removeprefix("handshake_failed_"): after[name] - before[name]
        for name in after
        if name.startswith("handshake_failed_") and after[name] != before[name]
    }
    return {
        "mode": mode,
        "loadavg_at_start": load,
        "connections": opened,
        "connect_failures": failed,
        "seconds": round(elapsed, 2),
        "per_second": round(opened / elapsed, 1),
        "honest": honest,
        "rss_kib_before": rss_before,
        "rss_kib_peak": peak,
        "cpu_s": round(process_cpu_s(pid) - cpu_before, 2),
        "handshake_failures": failures,
        "log_bytes": os.path.getsize(target["log"]) - log_before,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0, help="each phase's length")
    parser.add_argument("--connections", type=int, default=100_000, help="per phase, at most")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated, in order")
    parser.add_argument("--out", type=Path, help="write the JSON report here")
    args = parser.parse_args()
    modes = args.modes.split(",")
    if not set(modes) <= set(MODES):
        parser.error(f"--modes: choose from {', '.join(MODES)}")
    workdir = Path(tempfile.mkdtemp(prefix="outsider-"))
    socket_path = str(workdir / "target.sock")
    log_path = workdir / "target.log"
    env = {**os.environ, "EPISUB_KEY": KEY.hex()}
    with open(log_path, "w") as log:
        target = subprocess.Popen(
            [sys.executable, "-m", "episub.cli", "node", "--listen", "127.0.0.1:0",
             "--socket", socket_path, "--topic", TOPIC],
            stdout=subprocess.PIPE, stderr=log, text=True, env=env,
        )  # fmt: skip
    try:
        ready = read_line(target, "episub node").split()
        info = {"pid": target.pid, "socket": socket_path, "address": ready[5], "log": log_path}
        results = [phase(mode, args, info) for mode in modes]
        alive = target.poll() is None
        final_rss = rss_kib(target.pid)
    finally:
        if target.poll() is None:
            target.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                target.wait(10)
        if target.poll() is None:
            target.kill()
            target.wait()
    print(f"{'mode':10} {'conns':>7} {'per s':>7} {'join s':>7} {'msg':>4} "
          f"{'RSS MiB':>13} {'CPU s':>6} {'log B':>6}  failures")  # fmt: skip
    for r in results:
        honest = r["honest"]
        join = f"{honest['join_s']:.3f}" if honest.get("joined") else "FAIL"
        rss = f"{r['rss_kib_before'] / 1024:.1f}->{r['rss_kib_peak'] / 1024:.1f}"
        print(f"{r['mode']:10} {r['connections']:7d} {r['per_second']:7.0f} {join:>7} "
              f"{'yes' if honest.get('received') else 'no':>4} {rss:>13} {r['cpu_s']:6.1f} "
              f"{r['log_bytes']:6d}  {r['handshake_failures']}")  # fmt: skip
    print(f"target alive at the end: {alive}, RSS {final_rss / 1024 if final_rss else 0:.1f} MiB")
    report = {
        "command": shlex.join(sys.orig_argv),
        "started_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "loadavg_at_end": os.getloadavg()},
        "params": {"seconds": args.seconds, "connections": args.connections, "modes": modes},
        "phases": results,
        "target_alive_at_end": alive,
        "target_rss_kib_at_end": final_rss,
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0 if alive and all(r["honest"].get("received") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
