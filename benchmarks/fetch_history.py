"""What a fetched one-row message costs the two nodes it passes: CPU a row, both together.

    .venv/bin/python benchmarks/fetch_history.py --rows 100000 \
        --out benchmarks/results/fetch_history.json

Two nodes in one trio process, linked over real TCP on 127.0.0.1: the holder publishes
--rows messages of --size bytes, one row each, and then the reader, joined without
history, fetches them all (Node.fetch_range: PULLs answered by HISTORY packs from the
holder's message store). Timed is the fetch alone: the process's CPU time over rows (both
nodes: the holder packs and sends, the reader checks each envelope, hashes its id and
keeps it in its store) and rows over
wall time. Best of --repeat fetches, each by a fresh reader. --profile FILE writes the
last fetch's cProfile stats (a profiled run's figures are not figures).

Prints one JSON line and writes it to --out when given.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import time
from contextlib import AsyncExitStack
from pathlib import Path

import trio

from episub import Node
from episub.proto.config import NodeConfig
from episub.proto.store import RetentionConfig

KEY = bytes(range(32))
TOPIC = "t"
PUBLISH_CHUNK = 1_000  # messages per publish_many: one row each


async def linked(reader: Node) -> None:
    """Wait for the reader's link to the holder (no event tells it: poll, bounded)."""
    with trio.fail_after(30):
        while not reader.neighbors(TOPIC):
            await trio.sleep(0.01)


async def fetch_once(args: argparse.Namespace, holder: Node, profile: bool) -> dict[str, float]:
    retention = RetentionConfig(max_messages=args.rows, max_bytes=args.rows * (args.size + 200))
    async with Node(key=KEY, retention=retention) as reader:
        await reader.join(TOPIC, bootstrap=[holder.address], history=False)
        await linked(reader)
        profiler = cProfile.Profile(time.process_time) if profile else None
        cpu, wall = time.process_time(), time.monotonic()
        if profiler is not None:
            profiler.enable()
        report = await reader.fetch_range(
            TOPIC, holder.id, 0, args.rows - 1, timeout=60, holders=[holder.id]
        )
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(args.profile)
        cpu, wall = time.process_time() - cpu, time.monotonic() - wall
        if report.lacking:
            raise SystemExit(f"the fetch ended {report.ended!r}, lacking {report.lacking} rows")
    return {"cpu_us_per_row": 1e6 * cpu / args.rows, "rows_per_s": args.rows / wall}


async def run(args: argparse.Namespace) -> dict[str, object]:
    config = NodeConfig()
    retention = RetentionConfig(max_messages=args.rows, max_bytes=args.rows * (args.size + 200))
    pad = b"x" * args.size
    async with AsyncExitStack() as stack:
        holder = await stack.enter_async_context(Node(key=KEY, config=config, retention=retention))
        await holder.join(TOPIC)
        for low in range(0, args.rows, PUBLISH_CHUNK):
            rows = range(low, min(args.rows, low + PUBLISH_CHUNK))
            await holder.publish_many(TOPIC, [(b"%d " % i + pad)[: args.size] for i in rows])
        runs = [
            await fetch_once(args, holder, bool(args.profile) and i == args.repeat - 1)
            for i in range(args.repeat)
        ]
    return {
        "rows": args.rows,
        "size": args.size,
        "cpu_us_per_row": round(min(r["cpu_us_per_row"] for r in runs), 1),
        "rows_per_s": round(max(r["rows_per_s"] for r in runs)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=100, help="value bytes")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--profile", default="", help="cProfile stats of the last fetch")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    line = json.dumps(trio.run(run, args))
    print(line)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(line + "\n")


if __name__ == "__main__":
    main()
