"""Publishing a checked batch: into the core a chunk at a time, each chunk after the
neighbours' send queues have room for it, and a receipt per record from the core's output."""

from __future__ import annotations

from dataclasses import dataclass

from episub.net.runtime import Runtime
from episub.proto.envelope import Record
from episub.proto.events import AlreadyPublished, Deliver, OutEvent, Published, PublishMany

__all__ = ["PUBLISH_CHUNK", "PUBLISH_WAIT", "Receipt", "publish_checked"]

# How long a publish waits for a neighbour's send queue to drain below half its cap
# before that neighbour is declared too slow and dropped (network.wait_for_room).
PUBLISH_WAIT = 5.0  # guess: = the ping timeout; a live peer on a LAN drains far sooner
# Records of one publish_many that go into the core as one input: with a neighbour's send
# queue at most half full (wait_for_room), a chunk fits the rest of it (SEND_QUEUE_CAP is
# 4,096 messages), so a batch never overflows the queue of a neighbour that keeps up.
PUBLISH_CHUNK = 1024


@dataclass(frozen=True, slots=True)
class Receipt:
    """Where a publish went: the message id, and its place (publisher, seq).

    duplicate: the place was taken already and nothing was published; `id` is then the
    message that holds it, when this node still caches it (else None). `id` is None too
    for a named-stream publish held behind an earlier place that has not arrived yet."""

    id: bytes | None
    publisher: bytes
    seq: int
    duplicate: bool


async def publish_checked(runtime: Runtime, topic: str, checked: list[Record]) -> list[Receipt]:
    """Publish records that passed checks.check_records, PUBLISH_CHUNK at a time."""
    receipts: list[Receipt] = []
    for start in range(0, len(checked), PUBLISH_CHUNK):
        chunk = tuple(checked[start : start + PUBLISH_CHUNK])
        # Flow control: a burst waits for its neighbours' queues instead of overflowing them.
        await runtime.network.wait_for_room(PUBLISH_WAIT)
        receipts += _receipts(chunk, runtime.input(PublishMany(topic, chunk)))
    return receipts


def _receipts(records: tuple[Record, ...], outputs: list[OutEvent]) -> list[Receipt]:
    """Each record's receipt, from what the core output for the batch: our own stream's
    records in order as `Published`; a named place as `AlreadyPublished` (taken), as the
    `Deliver` of its place (delivered), or neither (held behind an earlier place)."""
    own: list[Published] = []
    placed: dict[tuple[bytes, int], list[Receipt]] = {}
    for out in outputs:
        kind = type(out)
        if kind is Published:
            own.append(out)  # type: ignore[arg-type]
        elif kind is AlreadyPublished:
            place = (out.publisher, out.seq)  # type: ignore[union-attr]
            placed.setdefault(place, []).append(Receipt(out.id, *place, duplicate=True))  # type: ignore[union-attr,arg-type]
        elif kind is Deliver:
            envelope = out.envelope  # type: ignore[union-attr]
            place = (envelope.publisher, envelope.seq)
            placed.setdefault(place, []).append(Receipt(out.id, *place, duplicate=False))  # type: ignore[union-attr,arg-type]
    receipts = []
    mine = iter(own)
    for record in records:
        if record.stream is None:
            published = next(mine, None)
            if published is None:
                raise AssertionError("the core accepted a publish without reporting it")
            envelope = published.envelope
            receipts.append(Receipt(published.id, envelope.publisher, envelope.seq, False))  # type: ignore[arg-type]
            continue
        got = placed.get(record.stream)
        if got:
            receipts.append(got.pop(0))
        else:
            # Held in order behind an earlier place of the stream that has not come yet:
            # accepted, and delivered here once the gap before it is filled or given up.
            receipts.append(Receipt(None, *record.stream, duplicate=False))
    return receipts
