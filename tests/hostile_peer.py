"""A hostile peer: it holds the deployment key and misbehaves on purpose.

    EPISUB_KEY=<hex> .venv/bin/python -m tests.hostile_peer --target 127.0.0.1:7000 \\
        --topic t --behaviour ihave-flood

Behaviours (each an async function over a RawPeer, used by tests/test_net_hostile_peer.py):
  ihave-flood      joins, then announces thousands of ids nobody published
  graft-all        joins, then GRAFTs every id it has seen and thousands it has not
  huge-ttl         sends a JOIN whose TTL is far past the wire's bound
  replay-gossip    joins, takes one GOSSIP pushed to it and sends it back many times
  stall-mid-frame  sends half a sealed frame and then nothing
  connect-loop     opens authenticated connections in a loop, each with a new id
  far-jump         joins, then sends GOSSIPs of one publisher with seq 0..5, then 10,
                   then 5,000,000 (issue 13's item 1: it killed every node it reached)
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import struct

import trio

from episub.proto import episub_pb2 as pb
from episub.proto.envelope import message_id
from episub.proto.messages import (
    Envelope,
    Gossip,
    Graft,
    IHave,
    Join,
    Neighbor,
    NeighborOp,
)
from tests.net_helpers import RawPeer

__all__ = ["BEHAVIOURS", "FAR_JUMP_SEQS", "forged_gossip", "join_as_neighbour"]

# Issue 13, item 1: seq 0..5, then 10, then 5,000,000.
FAR_JUMP_SEQS = (0, 1, 2, 3, 4, 5, 10, 5_000_000)

JOIN_WAIT = 10.0  # s for the target's link request
RANGES = 62  # ranges of 16 places per IHAVE: 992 messages named, within MAX_IDS_PER_MESSAGE


async def join_as_neighbour(raw: RawPeer, topic: str) -> None:
    """JOIN with TTL 0, and accept the link the target then asks us for: we are in its
    active view, where IHAVE, GRAFT and GOSSIP are taken from."""
    await raw.send_items([(topic, Join(peer=raw.id, ttl=0))])
    with trio.fail_after(JOIN_WAIT):
        while True:
            frame = await raw.reader.receive_frame()
            assert frame is not None, "the target closed the connection"
            for _, message in frame:
                if isinstance(message, Neighbor) and message.op is NeighborOp.REQUEST:
                    accept = Neighbor(op=NeighborOp.ACCEPT, kind=message.kind, active_count=1)
                    await raw.send_items([(topic, accept)])
                    return


async def ihave_flood(raw: RawPeer, topic: str, rounds: int = 20) -> None:
    await join_as_neighbour(raw, topic)
    for _ in range(rounds):
        # Places no one published, the most one IHAVE may name: each is tracked as missing
        # and grafted, within the bounds of max_missing and the GRAFT size.
        base = random.randrange(1 << 40)
        ranges = tuple((raw.id, base + i * 16, base + i * 16 + 15, 1) for i in range(RANGES))
        await raw.send_items([(topic, IHave(ranges=ranges))])


async def graft_all(
    raw: RawPeer, topic: str, rounds: int = 20, known: list[bytes] | None = None
) -> None:
    await join_as_neighbour(raw, topic)
    for _ in range(rounds):
        # The first 1,024 places of the publishers it knows the target holds (`known`), and
        # wide ranges of nothing.
        ranges = [(publisher, 0, 1023, 0) for publisher in (known or [])[:2]]
        base = random.randrange(1 << 40)
        ranges += [(raw.id, base + i * 1024, base + i * 1024 + 1023, 0) for i in range(2)]
        await raw.send_items([(topic, Graft(ranges=tuple(ranges)))])


async def huge_ttl(raw: RawPeer, topic: str) -> None:
    frame = pb.Frame()
    item = frame.items.add(topic=topic)
    item.join.peer = raw.id
    item.join.ttl = 1 << 31  # the Join dataclass refuses it: build the bytes by hand
    body = frame.SerializeToString()
    await raw.send(struct.pack(">I", len(body)) + body)


async def replay_gossip(raw: RawPeer, topic: str, copies: int = 200) -> Gossip:
    """Waits for one GOSSIP pushed to us (someone must publish), then replays it."""
    await join_as_neighbour(raw, topic)
    while True:
        frame = await raw.reader.receive_frame()
        assert frame is not None, "the target closed the connection"
        for _, message in frame:
            if isinstance(message, Gossip):
                for _ in range(copies):
                    await raw.send_items([(topic, message)])
                return message


def forged_gossip(
    topic: str, publisher: bytes, seq: int, hops: int = 1, payload: bytes | None = None
) -> Gossip:
    """A well-formed GOSSIP (its id matches) that `publisher` never sent: without signing,
    any key holder can make one."""
    if payload is None:
        payload = b"forged %d" % seq
    envelope = Envelope(publisher=publisher, seq=seq, timestamp_ms=0, payload=payload)
    return Gossip(id=message_id(topic, envelope), envelope=envelope, hops=hops)


async def far_jump(
    raw: RawPeer, topic: str, publisher: bytes = b"127.0.0.1:1/nobody", joined: bool = False
) -> None:
    if not joined:
        await join_as_neighbour(raw, topic)
    for seq in FAR_JUMP_SEQS:
        await raw.send_items([(topic, forged_gossip(topic, publisher, seq))])


async def stall_mid_frame(raw: RawPeer, topic: str) -> None:
    body = b"\x0a" * 1000
    await raw.send(struct.pack(">I", 4 + len(body)) + body[:500])  # and nothing more


async def connect_loop(target: str, key: bytes, count: int) -> list[RawPeer]:
    """`count` authenticated connections, kept open; the caller closes them."""
    peers = []
    for _ in range(count):
        with contextlib.suppress(OSError, trio.BrokenResourceError):  # refused: the limit
            peers.append(await RawPeer.connect(target, key=key))
    return peers


BEHAVIOURS = {
    "ihave-flood": ihave_flood,
    "graft-all": graft_all,
    "huge-ttl": huge_ttl,
    "replay-gossip": replay_gossip,
    "stall-mid-frame": stall_mid_frame,
    "far-jump": far_jump,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True, help="host:port of the node to attack")
    parser.add_argument("--topic", default="t")
    parser.add_argument("--behaviour", choices=[*BEHAVIOURS, "connect-loop"], required=True)
    parser.add_argument("--count", type=int, default=1000, help="connect-loop: connections")
    args = parser.parse_args()
    key = bytes.fromhex(os.environ["EPISUB_KEY"])

    async def run() -> None:
        if args.behaviour == "connect-loop":
            peers = await connect_loop(args.target, key, args.count)
            print(f"{len(peers)} of {args.count} connections held open")
            await trio.sleep_forever()
        raw = await RawPeer.connect(args.target, key=key)
        await BEHAVIOURS[args.behaviour](raw, args.topic)
        print(f"{args.behaviour}: done; holding the connection")
        await trio.sleep_forever()

    trio.run(run)


if __name__ == "__main__":
    main()
