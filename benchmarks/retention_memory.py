"""What retention costs in memory: RSS of two `episub node` processes holding their default
64 MiB of 1 KiB messages, against what they retain.

    .venv/bin/python benchmarks/retention_memory.py --out benchmarks/results/retention_memory.json

Two `episub node` processes on 127.0.0.1 join one topic, each serving the agent protocol
on a Unix socket (`--socket`). Once both are idle in the overlay, their RSS is read
(/proc/PID/status VmRSS). Then --messages messages of --size bytes are published through
the first node's socket with the agent client's `publish_batch` (--batch records a
request), and the script waits until the second node has delivered every one and both
have settled (their `retained_messages` no longer change), then RELEASE_WAIT more for
the nodes to give back free memory as they do when quiet. RSS is read again.

Printed per node: idle RSS, RSS after, the growth, the application bytes it retains
(`retained_bytes`: value + key + headers) and growth / retained. With the default
retention (64 MiB, 100,000 messages, 10 minutes) 1 KiB messages fill it at ~65,000.
Every process is killed by pid in a `finally`.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import free_ports, rss_kib

ROOT = Path(__file__).resolve().parent.parent
TOPIC = "retention-memory"
READY_TIMEOUT = 60.0  # s for both nodes to serve and link up
SETTLE_POLL = 0.5  # s between two reads of the counters while waiting to settle
# A node gives its free memory back once quiet after a large release: at its second
# watch after the release ends (episub/allocator.py ReleaseWatch; a watch each second
# while released bytes move, every RELEASE_IDLE_INTERVAL (5 s) before that).
RELEASE_WAIT = 8.0  # s


def _client(path: str) -> Any:
    from episub.agent.client import AgentClient

    return AgentClient(path, timeout=60.0)


def _wait(what: str, check: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = check()
        except Exception:  # the node is still starting: its socket is not there yet
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.1)  # another process's state: there is nothing to await


def measure(messages: int, size: int, batch: int) -> dict[str, Any]:
    env = {**os.environ, "EPISUB_KEY": "00" * 32, "PYTHONPATH": str(ROOT)}
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="retention-memory.") as tmp:
        sockets = [os.path.join(tmp, "a.sock"), os.path.join(tmp, "b.sock")]
        ports = free_ports(2)
        try:
            for i, (port, sock) in enumerate(zip(ports, sockets, strict=True)):
                argv = [sys.executable, "-m", "episub.cli", "node", "--listen",
                        f"127.0.0.1:{port}", "--topic", TOPIC, "--socket", sock]  # fmt: skip
                if i:
                    argv += ["--bootstrap", f"127.0.0.1:{ports[0]}"]
                procs.append(subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                                              stderr=subprocess.DEVNULL))  # fmt: skip
                _wait(f"node {i}'s socket", lambda s=sock: _client(s).inspect(), READY_TIMEOUT)
            clients = [_client(s) for s in sockets]
            _wait("the link", lambda: all(c.inspect().topics.get(TOPIC) for c in clients),
                  READY_TIMEOUT)  # fmt: skip
            time.sleep(2.0)  # idle a moment: the first optimisation rounds, then read RSS
            idle = [rss_kib(p.pid) for p in procs]
            filler = os.urandom(size - 8)
            started = time.monotonic()
            for first in range(0, messages, batch):
                records = [i.to_bytes(8, "big") + filler
                           for i in range(first, min(first + batch, messages))]  # fmt: skip
                clients[0].publish_batch(TOPIC, records)
            published_s = time.monotonic() - started

            def settled() -> list[dict[str, int]] | None:
                before = [c.inspect().stats for c in clients]
                time.sleep(SETTLE_POLL)
                after = [c.inspect().stats for c in clients]
                done = after[1].get("delivered", 0) >= messages and all(
                    a["retained_messages"] == b["retained_messages"]
                    for a, b in zip(before, after, strict=True)
                )
                return after if done else None

            stats = _wait("the second node to deliver everything", settled, 300.0)
            time.sleep(RELEASE_WAIT)  # each node gives free memory back when quiet
            after = [rss_kib(p.pid) for p in procs]
            for client in clients:
                client.close()
        finally:
            for p in procs:
                p.kill()
                p.wait()
    nodes = []
    for i in range(2):
        grown_kib = (after[i] or 0) - (idle[i] or 0)
        retained = stats[i]["retained_bytes"]
        nodes.append({
            "role": "publisher" if i == 0 else "receiver",
            "rss_idle_mb": round((idle[i] or 0) / 1024, 1),
            "rss_after_mb": round((after[i] or 0) / 1024, 1),
            "rss_growth_mb": round(grown_kib / 1024, 1),
            "retained_messages": stats[i]["retained_messages"],
            "retained_mb": round(retained / 2**20, 1),
            "growth_per_retained": round(grown_kib * 1024 / retained, 3) if retained else None,
        })  # fmt: skip
    return {"messages": messages, "size": size, "batch": batch,
            "publish_s": round(published_s, 2), "nodes": nodes}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--messages", type=int, default=100_000)
    p.add_argument("--size", type=int, default=1024, help="bytes of each message's value")
    p.add_argument("--batch", type=int, default=1000, help="records per publish_batch")
    p.add_argument("--out", help="also write the result JSON here")
    args = p.parse_args(argv)
    if args.messages < 1 or args.size < 8 or args.batch < 1:
        p.error("--messages and --batch must be positive, --size at least 8")
    result = measure(args.messages, args.size, args.batch)
    result["command"] = shlex.join([Path(sys.executable).as_posix(),
                                    "benchmarks/retention_memory.py",
                                    *(sys.argv[1:] if argv is None else argv)])  # fmt: skip
    result["loadavg"] = os.getloadavg()
    for node in result["nodes"]:
        print(f"{node['role']}: RSS {node['rss_idle_mb']} -> {node['rss_after_mb']} MB "
              f"(+{node['rss_growth_mb']}) retaining {node['retained_messages']} messages, "
              f"{node['retained_mb']} MB: growth {node['growth_per_retained']}x what it "
              "retains")  # fmt: skip
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
