"""One incarnation of one node of benchmarks/soak.py, as an OS process.

    .venv/bin/python benchmarks/soak.py --nodes 6 --minutes 1 --kill-every 15

Why not loopback's peers (episub_peer.py / peer_common.py): their line protocol is one
start barrier for all nodes and a fixed message count, with the result printed at the end;
a node of the soak is SIGKILLed at any moment and started again, so everything it has to
say must already be on disk when the kill comes. And `episub node` keeps no delivery log.
This script is a plain `episub.Node` (the deployment key from EPISUB_KEY, as every
`episub` command reads it; the protocol's defaults unless --config) and writes, each line
with one os.write so that a SIGKILL loses nothing already delivered:

- DIR/n<I>.<K>.recv: a line per item its subscription got:
  ``<publisher index> <seq> <publish ns> <receive ns>`` for a message (the publisher index
  and publish time from the payload header, the seq from the envelope), ``lost <publisher
  id hex> <first> <last>`` for a gap the node gave up on, ``lagged <count>``.
- DIR/n<I>.<K>.stats: a JSON line of `node.stats()` every --stats-interval seconds, and a
  last one, ``"final": true``, when it stops on SIGTERM/SIGINT or stdin's end.
- DIR/n<I>.pub (publishers): ``<seq> <publish ns>`` per message, written after
  `publish_record` returned, so a line means the node accepted the message.

All times are CLOCK_MONOTONIC (`time.monotonic_ns()`): one clock for every process of
the host. On stdout: ``READY <peer id> <address> <ns>`` once the node listens and has
joined the topic with a first neighbour, ``PUBLISHED <count>`` when a publisher is done.
On stdin (publishers): ``START <count> <rate>`` publishes count messages, rate per second
on a fixed grid. The process ends on SIGTERM/SIGINT, at stdin's end (the driver is gone)
or after --deadline seconds, whichever comes first.

Payload: ``struct.pack("!IIQ", publisher index, seq, publish ns)`` (peer_common's header
layout), then filler up to --size bytes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import signal
import struct
import sys
import time
from typing import Any

import trio
from peer_common import HEADER, HEADER_SIZE, LineReader, emit

from episub.agent.options import load_config, load_key, load_retention
from episub.node import Node
from episub.subscription import Delivery, Lagged, Lost

TOPIC = "soak"
# Items the subscription holds while this process writes its log; a node of the soak
# receives ~20 msg/s, so this is minutes of backlog (a Lagged line would show it anyway).
SUBSCRIPTION_BUFFER = 4096


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="one node incarnation of benchmarks/soak.py")
    p.add_argument("--index", type=int, required=True, help="node slot 0..N-1")
    p.add_argument("--incarnation", type=int, required=True, help="0 for the first start")
    p.add_argument("--listen", required=True, help="127.0.0.1:PORT")
    p.add_argument("--bootstrap", action="append", default=[], help="host:port (repeatable)")
    p.add_argument("--topic", default=TOPIC)
    p.add_argument("--dir", required=True, help="where the .recv/.stats/.pub files go")
    p.add_argument("--size", type=int, default=256, help=f"payload bytes (>= {HEADER_SIZE})")
    p.add_argument("--stats-interval", type=float, default=5.0, help="seconds between samples")
    p.add_argument("--config", help="node overrides (JSON), as `episub node --config`")
    p.add_argument(
        "--retention-age",
        type=float,
        help="seconds the node's replay store keeps a message (over --config's retention)",
    )
    p.add_argument("--deadline", type=float, required=True, help="hard lifetime cap, seconds")
    args = p.parse_args(argv)
    if args.size < HEADER_SIZE:
        p.error(f"--size must be at least {HEADER_SIZE}")
    return args


class Log:
    """An append-only file written a line at a time with os.write (no user-space buffer)."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def line(self, text: str) -> None:
        os.write(self.fd, (text + "\n").encode())


async def receive_loop(sub: Any, recv: Log) -> None:
    async for item in sub:
        now = time.monotonic_ns()
        if isinstance(item, Delivery):
            if len(item.value) < HEADER_SIZE:
                recv.line(f"foreign {item.publisher.hex()} {item.seq}")
                continue
            pub, _seq, sent = struct.unpack_from(HEADER, item.value)
            recv.line(f"{pub} {item.seq} {sent} {now}")
        elif isinstance(item, Lost):
            recv.line(f"lost {item.publisher.hex()} {item.first_seq} {item.last_seq}")
        elif isinstance(item, Lagged):
            recv.line(f"lagged {item.count}")


async def stats_loop(node: Node, stats: Log, interval: float) -> None:
    while True:
        await trio.sleep(interval)
        stats.line(json.dumps({"t": time.monotonic_ns(), "final": False, "stats": node.stats()}))


async def publish_loop(node: Node, args: argparse.Namespace, count: int, rate: float) -> None:
    """`count` messages on a fixed grid of 1/rate s (a late one is not followed by a burst
    beyond the grid); the count and --deadline bound it."""
    pub = Log(os.path.join(args.dir, f"n{args.index}.pub"))
    filler = os.urandom(args.size - HEADER_SIZE)
    start = trio.current_time()
    for i in range(count):
        await trio.sleep_until(start + i / rate)
        sent = time.monotonic_ns()
        payload = struct.pack(HEADER, args.index, i, sent) + filler
        receipt = await node.publish_record(args.topic, payload)
        pub.line(f"{receipt.seq} {sent}")
    emit(f"PUBLISHED {count}")


async def control_loop(node: Node, args: argparse.Namespace, nursery: trio.Nursery) -> None:
    control = LineReader()
    while True:
        line = await control.readline()
        if line is None:  # the driver is gone
            nursery.cancel_scope.cancel()
            return
        words = line.split()
        if words and words[0] == "START":
            nursery.start_soon(publish_loop, node, args, int(words[1]), float(words[2]))


async def run(args: argparse.Namespace) -> None:
    key = load_key(None)  # EPISUB_KEY, as every episub command reads it
    config = load_config(args.config)
    base = os.path.join(args.dir, f"n{args.index}.{args.incarnation}")
    recv, stats = Log(base + ".recv"), Log(base + ".stats")
    with (
        trio.move_on_after(args.deadline),
        trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals,
    ):
        retention = load_retention(args.config)  # the same file, as `episub node` reads it
        if args.retention_age is not None:
            retention = dataclasses.replace(retention, max_age=args.retention_age)
        node = Node(key=key, listen=args.listen, config=config, retention=retention)
        async with node, node.subscribe(args.topic, SUBSCRIPTION_BUFFER) as sub:
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(receive_loop, sub, recv)
                    await node.join(args.topic, args.bootstrap)
                    emit(f"READY {node.id.decode()} {node.address} {time.monotonic_ns()}")
                    nursery.start_soon(stats_loop, node, stats, args.stats_interval)
                    nursery.start_soon(control_loop, node, args, nursery)
                    async for _ in signals:
                        nursery.cancel_scope.cancel()
                        break
            finally:
                stats.line(
                    json.dumps({"t": time.monotonic_ns(), "final": True, "stats": node.stats()})
                )


def main() -> int:
    # The node's own log (dial and handshake failures, lost peers: INFO) goes to stderr,
    # which soak.py keeps as DIR/n<I>.<K>.stderr; `episub node` logs the same way.
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(created).3f %(levelname)s %(name)s: %(message)s",
    )
    trio.run(run, parse_args())
    return 0


if __name__ == "__main__":
    sys.exit(main())
