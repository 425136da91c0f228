"""What a delivery tree per publisher stream costs one node: memory, CPU per message and
the price of a link coming or going, at 1, 100 and 1,000 publisher streams.

    .venv/bin/python benchmarks/stream_trees.py

One topic's broadcast core (episub/proto/broadcast.py, no I/O) with 7 neighbours, the
default active view, is fed GOSSIPs as a node in a many-publisher topic receives them:
each message from one neighbour first, then a duplicate from another (which prunes that
link for the message's stream until every tree is pruned down). Publishers are 32-byte
ids, as on the wire. For each stream count, and with `max_stream_trees=0` (one tree for
every stream, Plumtree's) beside it:

- tree bytes: what the trees table holds (tracemalloc, after the streams are seen);
- RSS: this process's resident set at the end (ru_maxrss; one process per row, so rows
  do not share a high-water mark);
- CPU per message: process time of handling `--messages` more first copies and their
  duplicates (made, ids included, before the clock starts), after every stream's tree
  has formed, divided by the first copies;
- link churn: process time of one neighbour going down and another coming up, which
  visits every tree (O(trees)), averaged over `CHURN_ROUNDS` rounds.

Each row runs in a fresh interpreter (`--row`), so one row's garbage is not another's.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
import tracemalloc
from typing import Any

from episub.proto import messages as m
from episub.proto.broadcast import Broadcast
from episub.proto.config import BroadcastConfig
from episub.proto.envelope import message_id

TOPIC = "trees"
NEIGHBOURS = 7  # the default active view (C_rand 4 + C_near 3)
CHURN_ROUNDS = 200
ROWS = ((1, 1024), (100, 1024), (1000, 1024), (1000, 0))  # (streams, max_stream_trees)


def publisher(i: int) -> bytes:
    return i.to_bytes(4, "big") * 8


def gossip(pub: bytes, seq: int) -> m.Gossip:
    envelope = m.Envelope(publisher=pub, seq=seq, timestamp_ms=0, payload=b"x" * 64)
    return m.Gossip(id=message_id(TOPIC, envelope), envelope=envelope, hops=2)


def messages_of(pubs: list[bytes], seq: int) -> list[m.Gossip]:
    return [gossip(pub, seq) for pub in pubs]


def feed(core: Broadcast, msgs: list[m.Gossip], seq: int, now: float) -> int:
    """One message of each publisher: a first copy, then a duplicate. Returns the count."""
    out: list[Any] = []
    for i, msg in enumerate(msgs):
        first, second = 1 + i % NEIGHBOURS, 1 + (i + 1 + seq) % NEIGHBOURS
        core.on_message(first, msg, now, out)
        core.on_message(second, msg, now, out)
        out.clear()
    return len(msgs)


def row(streams: int, cap: int, messages: int) -> dict[str, Any]:
    config = BroadcastConfig(max_stream_trees=cap)
    core = Broadcast(me=0, topic=TOPIC, config=config, timer_prefix=(TOPIC, 0))
    out: list[Any] = []
    for peer in range(1, NEIGHBOURS + 1):
        core.neighbor_up(peer, 0.0, out)
    pubs = [publisher(i) for i in range(streams)]
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    rounds = max(3, messages // streams)
    seq = 0
    for seq in range(3):  # the trees form: a duplicate prunes a link per stream per round
        feed(core, messages_of(pubs, seq), seq, 1.0 + seq)
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    trees_bytes = sum(
        stat.size_diff
        for stat in after.compare_to(before, "filename")
        if stat.traceback[0].filename.endswith("trees.py")
    )
    batches = [messages_of(pubs, seq) for seq in range(3, 3 + rounds)]  # ids made untimed
    started = time.process_time()
    fed = 0
    for seq, msgs in enumerate(batches, start=3):
        fed += feed(core, msgs, seq, 1.0 + seq)
    cpu_us = (time.process_time() - started) / fed * 1e6
    started = time.process_time()
    now = 10.0 + rounds
    for k in range(CHURN_ROUNDS):
        gone = 1 + k % NEIGHBOURS
        core.neighbor_down(gone, now, out)
        core.neighbor_up(gone, now, out)
        out.clear()
    churn_us = (time.process_time() - started) / CHURN_ROUNDS * 1e6
    return {
        "streams": streams,
        "max_stream_trees": cap,
        "trees": len(core.trees),
        "trees_bytes": trees_bytes,
        "rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        "cpu_us_per_message": round(cpu_us, 2),
        "link_down_and_up_us": round(churn_us, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000, help="timed first copies")
    parser.add_argument("--row", nargs=2, type=int, metavar=("STREAMS", "CAP"), help="one row")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args()
    if args.row:
        print(json.dumps(row(args.row[0], args.row[1], args.messages)))
        return 0
    rows = []
    for streams, cap in ROWS:
        cmd = [sys.executable, __file__, "--row", str(streams), str(cap)]
        cmd += ["--messages", str(args.messages)]
        rows.append(json.loads(subprocess.run(cmd, check=True, capture_output=True).stdout))
    if args.json:
        print(json.dumps(rows))
        return 0
    print("streams  cap   trees  tree KiB  RSS MiB  CPU us/msg  link down+up us")
    for r in rows:
        print(
            f"{r['streams']:>7}  {r['max_stream_trees']:>4}  {r['trees']:>5}  "
            f"{r['trees_bytes'] / 1024:>8.1f}  {r['rss_kib'] / 1024:>7.1f}  "
            f"{r['cpu_us_per_message']:>10}  {r['link_down_and_up_us']:>15}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
