"""What a message costs outside the protocol core, in one process, without sockets: the
runtime's part of the loopback burst (benchmarks/loopback.py), measured apart from the
core and from the noise of eight processes on a few cores.

    .venv/bin/python benchmarks/message_path.py

Four steps, each timed (best of --repeat runs) and counted in Python calls (cProfile's
count: the same on every machine, so a change can be compared without a quiet one):

- send: a publisher's burst of 256 GOSSIP of --size bytes to 7 neighbours, as the core's
  Sends go through Runtime._carry_out into the peers' queues, then each queue packed
  into frames (framing.take_frames) as a flush does. Per message and neighbour.
- encode: wire.encode_item of a GOSSIP a relay forwards (its hop count changed). Per message.
- decode: one read of a frame of 64 such GOSSIP (FrameDecoder.whole_frame), then each
  envelope decoded and its id hashed, as the core does on first receipt. Per message.
- deliver: the node's handling of 256 Deliver events for a subscribed topic
  (Node._on_events), then the subscriber taking them (what receive_batch takes). Per message.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import time
import timeit
from collections.abc import Callable
from pathlib import Path
from random import Random

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import trio

from episub.net.connection import Peer
from episub.net.framing import take_frames
from episub.net.runtime import Runtime
from episub.node.fanout import Fanout
from episub.node.fetching import Fetcher
from episub.node.node import Node
from episub.proto.config import NodeConfig
from episub.proto.envelope import Envelope, IdHasher
from episub.proto.events import Deliver, OutEvent, Send
from episub.proto.framing import LENGTH_PREFIX_SIZE
from episub.proto.messages import Gossip
from episub.proto.wire import FrameDecoder, encode_item, frame_from_items
from episub.subscription import Subscription

TOPIC = "episub-bench"
ME = b"127.0.0.1:40000/0123456789abcdef"
PUBLISHER = b"127.0.0.1:40123/0123456789abcdef"
NEIGHBOURS = [b"127.0.0.1:%d/0123456789abcdef" % (40001 + i) for i in range(7)]
BURST = 256  # messages in a publisher's burst and in a delivered batch
FRAME_ITEMS = 64  # GOSSIP in a frame read


def gossips(count: int, size: int, hops: int) -> list[Gossip]:
    ids = IdHasher(TOPIC)
    stamp = int(time.time() * 1000)
    out = []
    for i in range(count):
        envelope = Envelope(
            publisher=PUBLISHER, seq=10_000 + i, timestamp_ms=stamp + i, payload=bytes(size)
        )
        out.append(Gossip(id=ids(envelope.unsigned), envelope=envelope, hops=hops))
    return out


def measure(step: Callable[[], object], per: int, repeat: int, number: int) -> dict[str, float]:
    """ns per unit (best of `repeat` runs of `number` steps) and Python calls per unit."""
    step()
    best = min(timeit.repeat(step, number=number, repeat=repeat)) / number
    profile = cProfile.Profile()
    profile.enable()
    step()
    profile.disable()
    calls = pstats.Stats(profile).total_calls  # type: ignore[attr-defined]
    return {"ns": round(best * 1e9 / per), "calls": round(calls / per, 2)}


def send_step(runtime: Runtime, size: int) -> Callable[[], None]:
    network = runtime.network
    for peer_id in NEIGHBOURS:
        peer = network.peers[peer_id] = Peer(peer_id)
        peer.dial_scope = trio.CancelScope()  # a dial in flight: queued, nothing dialled
    bursts: list[list[OutEvent]] = []
    for _ in range(4):  # new message objects each time round, as a real burst has
        bursts.append([Send(p, TOPIC, g) for g in gossips(BURST, size, hops=1) for p in NEIGHBOURS])
    turn = iter(range(1 << 62))

    def step() -> None:
        runtime._carry_out(bursts[next(turn) % len(bursts)])
        network._unflushed.clear()
        for peer_id in NEIGHBOURS:
            peer = network.peers[peer_id]
            assert len(peer.queue) == BURST  # every Send queued, none dropped
            while peer.queue:
                frame, _, frames = take_frames(peer.queue)
                peer.queued_bytes -= len(frame) - frames * LENGTH_PREFIX_SIZE

    return step


def deliver_step(size: int) -> Callable[[], None]:
    node = Node.__new__(Node)  # only what _on_events reads
    node._fanout = Fanout()
    node._fetcher = Fetcher()
    node._receipts = None
    subscription = Subscription(TOPIC, 4 * BURST, node._fanout.add, node._fanout.remove)
    node._fanout.add(subscription)
    events = [Deliver(TOPIC, g.id, g.envelope, g.hops) for g in gossips(BURST, size, hops=1)]
    buffer = subscription._buffer
    take_many = getattr(buffer, "take_many", None)  # None in a version before it

    def step() -> None:
        node._on_events(events)  # type: ignore[arg-type]
        if take_many is not None:
            taken = len(take_many())
        else:  # one at a time, as receive_batch took them then
            taken = 0
            while buffer.take() is not None:
                taken += 1
        assert taken == BURST  # every event delivered to the subscription

    return step


async def run(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    runtime = Runtime(
        key=b"k" * 32, my_id=ME, config=NodeConfig(), rng=Random(1), on_events=lambda _: None
    )
    forwarded = [g.forwarded(2) for g in gossips(FRAME_ITEMS, args.size, hops=1)]
    frame = frame_from_items([encode_item(TOPIC, g) for g in forwarded])
    ids = IdHasher(TOPIC)

    def encode() -> None:
        for gossip in forwarded:
            encode_item(TOPIC, gossip)

    def decode() -> None:
        items = FrameDecoder(max_frame_size=1 << 20).whole_frame(frame)
        assert items is not None and len(items) == FRAME_ITEMS
        for _, gossip in items:
            assert ids(Envelope.decode(gossip.raw).unsigned) == gossip.id  # type: ignore[attr-defined]

    r, n = args.repeat, args.number
    return {
        "send (per message and neighbour)": measure(
            send_step(runtime, args.size), BURST * len(NEIGHBOURS), r, max(1, n // 8)
        ),
        "encode (per message)": measure(encode, FRAME_ITEMS, r, n),
        "decode (per message)": measure(decode, FRAME_ITEMS, r, n),
        "deliver (per message)": measure(deliver_step(args.size), BURST, r, max(1, n // 4)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=256, help="payload bytes (default 256)")
    parser.add_argument("--repeat", type=int, default=7, help="timed runs, the best kept")
    parser.add_argument("--number", type=int, default=400, help="steps per timed run")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    results = trio.run(run, args)
    if args.json:
        print(json.dumps(results, indent=1))
        return
    for name, figures in results.items():
        print(f"{name:36} {figures['ns']:7.0f} ns  {figures['calls']:6.2f} calls")


if __name__ == "__main__":
    main()
