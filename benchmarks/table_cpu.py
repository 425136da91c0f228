"""CPU per message of a node's message store (seen ids, held envelope bytes and places,
episub/proto/store.py), as a node's broadcast feeds it a first copy, with its default
bounds and full (steady state: each message in evicts the oldest).

    .venv/bin/python benchmarks/table_cpu.py [--messages 200000] [--size 1024] [--out F]

Envelopes and ids are made first (not timed); then the messages go through
`MessageStore.add` as in the node, each id looked up
in `seen` --copies times as broadcast does for every copy that arrives (the first before
it is remembered, the duplicates after), --rounds times
over fresh tables, and the best round's process time per message is printed (the
others are noise from a shared machine). No I/O: what the store costs, nothing else.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from episub.proto.envelope import Envelope  # noqa: E402
from episub.proto.store import MessageStore, RetentionConfig  # noqa: E402

TOPIC = "t"


def _messages(count: int, size: int) -> list[tuple[bytes, Envelope]]:
    publisher = bytes(range(32))
    filler = os.urandom(size - 8)
    out = []
    for seq in range(count):
        envelope = Envelope(
            publisher=publisher, seq=seq, timestamp_ms=1_700_000_000_000 + seq,
            payload=seq.to_bytes(8, "big") + filler,
        )  # fmt: skip
        out.append((os.urandom(32), envelope))
    return out


def one_round(messages: list[tuple[bytes, Envelope]], copies: int) -> float:
    store = MessageStore(RetentionConfig())
    add, seen, places = store.add, store.seen, store.places(TOPIC)
    sender = b"s" * 32
    duplicates = range(copies - 1)
    started = time.process_time()
    for i, (mid, envelope) in enumerate(messages):
        now = i * 1e-4  # 10,000 messages a second: no bound by age is reached
        if copies and mid in seen:
            raise AssertionError("a new id was seen")
        add(places, mid, envelope, 1, now, sender)
        for _ in duplicates:
            if mid not in seen:
                raise AssertionError("a remembered id was not seen")
    return time.process_time() - started


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--messages", type=int, default=200_000)
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--copies", type=int, default=2, help="seen lookups a message (0: none)")
    p.add_argument("--out", help="also write the result JSON here")
    args = p.parse_args(argv)
    messages = _messages(args.messages, args.size)
    rounds = [one_round(messages, args.copies) for _ in range(args.rounds)]
    per_message_us = [r / args.messages * 1e6 for r in rounds]
    result: dict[str, Any] = {
        "messages": args.messages,
        "size": args.size,
        "copies": args.copies,
        "us_per_message": [round(u, 3) for u in per_message_us],
        "best_us_per_message": round(min(per_message_us), 3),
        "loadavg": os.getloadavg(),
    }
    best, load = result["best_us_per_message"], result["loadavg"][0]
    print(f"message store: {best} us CPU a message (best of {args.rounds}: "
          f"{result['us_per_message']}), load {load:.1f}")  # fmt: skip
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
