"""Where a live-configuration reader's CPU goes, stage by stage: no I/O, no profiler.

    .venv/bin/python benchmarks/reader_path.py --out benchmarks/results/reader_path.json

Two sans-IO cores (episub.proto.node.NodeState) on a configuration topic, the reader
joined through the writer, their messages passed by hand (encoded and decoded by the wire
codec, as between processes). The writer then makes `--updates` writes as
ConfigReplica.write makes them (a stream of its own each, the codec's update of two keys),
and what it sends the reader is framed and sealed as the runtime writes it. Each stage of
the reader's path then runs over all of them in turn, timed in process CPU time:

  open     the sealed record (ChaCha20-Poly1305, sealing.RecordOpener)
  frame    the frame's items (wire.FrameDecoder.whole_frame: the GOSSIP read by hand)
  core     NodeState.handle_received: the envelope and its id checked, seen, cached,
           ordered, queued for IHAVE, delivered
  apply    the configuration codec's decode and ConfigState.apply_update

What a reader pays on top (the wakeup, its runtime, the hand-off to the application) is
what config_broadcast.py and wakeup_floor.py measure; this is the work itself.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import deque
from pathlib import Path
from random import Random

from episub.config.codec import Update, decode
from episub.config.replica import config_topic, write_message
from episub.config.state import ConfigState
from episub.net.framing import max_frame_size
from episub.net.peer_id import make_peer_id
from episub.net.runtime import with_runtime_upkeep
from episub.net.sealing import RecordOpener, RecordSealer
from episub.proto.config import NodeConfig
from episub.proto.events import Deliver, JoinTopic, OutEvent, Publish, Send
from episub.proto.framing import LENGTH_PREFIX
from episub.proto.node import NodeState
from episub.proto.wire import FrameDecoder, encode_item

TOPIC = config_topic("default")
KEY = bytes(32)


def passed(outputs: list[OutEvent], sender: bytes, queue: deque) -> None:
    """Queue every Send of `outputs`, encoded as it would go on the wire."""
    for out in outputs:
        if type(out) is Send:
            queue.append((sender, out.peer, encode_item(out.topic, out.message)))


def settle(nodes: dict[bytes, NodeState], queue: deque, now: float, limit: int = 10_000) -> None:
    """Hand every queued item to its receiver until nothing more is sent."""
    decoder = FrameDecoder(max_frame_size=1 << 20)
    for _ in range(limit):
        if not queue:
            return
        sender, receiver, item = queue.popleft()
        items = decoder.whole_frame(LENGTH_PREFIX.pack(len(item)) + item)
        assert items is not None
        out: list[OutEvent] = []
        nodes[receiver].handle_received(sender, items, now, out)
        passed(out, receiver, queue)
    raise SystemExit(f"the two cores still talk after {limit} messages")


def prepare(updates: int) -> tuple[NodeState, bytes, list[bytes], int, float]:
    """A reader joined through a writer, and the writer's `updates` updates to it as sealed
    records: (reader, writer id, records, max frame size, now)."""
    config = with_runtime_upkeep(NodeConfig(), kernel_rtt=False)
    writer_id, reader_id = make_peer_id("127.0.0.1", 7001), make_peer_id("127.0.0.1", 7002)
    writer = NodeState(writer_id, config, Random(1))
    reader = NodeState(reader_id, config, Random(2))
    nodes = {writer_id: writer, reader_id: reader}
    queue: deque = deque()
    now = time.time()
    passed(writer.handle(JoinTopic(TOPIC), now), writer_id, queue)
    # Joined as ConfigReplica joins: not retained (a replica catches up by snapshot).
    passed(reader.handle(JoinTopic(TOPIC, (writer_id,), retain=False), now), reader_id, queue)
    settle(nodes, queue, now)
    sealer = RecordSealer(KEY)
    sealed: list[bytes] = []
    for version in range(1, updates + 1):
        values = {"threshold": version / 1000, "n": version}
        _, payload, stream = write_message(values, version, writer_id)
        out = writer.handle(Publish(TOPIC, payload, stream=stream), now + version * 0.02)
        items = [encode_item(o.topic, o.message) for o in out
                 if type(o) is Send and o.peer == reader_id]  # fmt: skip
        if len(items) != 1:
            raise SystemExit(f"update {version}: the writer sent the reader {len(items)} items")
        sealed.append(sealer.seal(LENGTH_PREFIX.pack(len(items[0])) + items[0]))
    return reader, writer_id, sealed, max_frame_size(config.broadcast.max_message_size), now


def warm(updates: int) -> dict[str, float]:
    """Each stage over every update in turn: the work with hot caches."""
    reader, writer_id, sealed, frame_limit, now = prepare(updates)
    opener, decoder = RecordOpener(KEY), FrameDecoder(max_frame_size=frame_limit)
    state = ConfigState()
    t0 = time.process_time()
    plain = [opener.feed(record) for record in sealed]
    t1 = time.process_time()
    frames = [decoder.whole_frame(frame) for frame in plain]
    t2 = time.process_time()
    delivered: list[bytes] = []
    for i, items in enumerate(frames):
        out: list[OutEvent] = []
        reader.handle_received(writer_id, items, now + (i + 1) * 0.02, out)  # type: ignore[arg-type]
        delivered.extend(o.envelope.payload for o in out if type(o) is Deliver)  # type: ignore[union-attr]
    t3 = time.process_time()
    for payload in delivered:
        message = decode(payload)
        if type(message) is Update:
            state.apply_update(message.version, message.changes)
    t4 = time.process_time()
    check(updates, len(delivered), state)
    spans = (("open", t1 - t0), ("frame", t2 - t1), ("core", t3 - t2), ("apply", t4 - t3))
    stages = {name: round(seconds / updates * 1e6, 2) for name, seconds in spans}
    stages["total"] = round(sum(stages.values()), 2)
    return stages


def cold(updates: int, evict_mb: int) -> dict[str, float]:
    """Every stage of one update, after writing `evict_mb` MiB elsewhere: the work with the
    caches another 32 processes would have left (a reader wakes every 20 ms)."""
    reader, writer_id, sealed, frame_limit, now = prepare(updates)
    opener, decoder = RecordOpener(KEY), FrameDecoder(max_frame_size=frame_limit)
    state = ConfigState()
    junk = bytearray(evict_mb << 20)
    spent = delivered = 0
    for i, record in enumerate(sealed):
        junk[:] = bytes(len(junk))  # evicts this process's lines from the caches
        t0 = time.process_time_ns()
        out: list[OutEvent] = []
        reader.handle_received(writer_id, decoder.whole_frame(opener.feed(record)),  # type: ignore[arg-type]
                               now + (i + 1) * 0.02, out)  # fmt: skip
        for o in out:
            if type(o) is Deliver:
                message = decode(o.envelope.payload)
                if type(message) is Update:
                    state.apply_update(message.version, message.changes)
                delivered += 1
        spent += time.process_time_ns() - t0
    check(updates, delivered, state)
    return {"total": round(spent / updates / 1e3, 2)}


def check(updates: int, delivered: int, state: ConfigState) -> None:
    if delivered != updates or state.version != updates:
        raise SystemExit(f"the reader delivered {delivered} of {updates} updates, "
                         f"applied up to version {state.version}")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--updates", type=int, default=20_000)
    p.add_argument("--cold-updates", type=int, default=2_000)
    p.add_argument("--evict-mb", type=int, default=8, help="written between cold updates")
    p.add_argument("--repeats", type=int, default=5, help="runs; the median of each stage")
    p.add_argument("--out", default=None, help="also write the result JSON here")
    args = p.parse_args()
    runs = [warm(args.updates) for _ in range(args.repeats)]
    hot = {k: sorted(r[k] for r in runs)[len(runs) // 2] for k in runs[0]}
    colds = sorted(cold(args.cold_updates, args.evict_mb)["total"] for _ in range(args.repeats))
    result = {"warm_us_per_update": hot, "cold_us_per_update": colds[len(colds) // 2]}
    print(f"a reader's work per configuration update, us of CPU (median of {args.repeats}):")
    for name, us in hot.items():
        print(f"  {name:6} {us:7.2f}")
    print(f"  cold   {result['cold_us_per_update']:7.2f}  (all stages, after {args.evict_mb} MiB "
          "written elsewhere)")  # fmt: skip
    if args.out:
        Path(args.out).write_text(json.dumps(
            {"command": "benchmarks/reader_path.py", **vars(args), **result,
             "warm_runs": runs, "cold_runs": colds}, indent=1) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
