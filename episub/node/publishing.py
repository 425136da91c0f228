"""Publishing a checked batch: into the core a chunk at a time, each chunk after the
neighbours' send queues have room for it, and a receipt per record from the core's events
(collected by the node's one dispatcher as it hands them out)."""

from __future__ import annotations

from collections.abc import Callable

from episub.net.runtime import Runtime
from episub.proto.envelope import Record
from episub.proto.events import AlreadyPublished, Deliver, Published, Recovered
from episub.records import Receipt

__all__ = ["PUBLISH_CHUNK", "PUBLISH_WAIT", "Receipt", "Receipts", "publish_checked"]

# How long a publish waits for a neighbour's send queue to drain below half its cap
# before that neighbour is declared too slow and dropped (network.wait_for_room).
PUBLISH_WAIT = 5.0  # guess: = the ping timeout; a live peer on a LAN drains far sooner
# Records of one publish_many that go into the core as one input: with a neighbour's send
# queue at most half full (wait_for_room), a chunk fits the rest of it (SEND_QUEUE_CAP is
# 4,096 messages), so a batch never overflows the queue of a neighbour that keeps up.
PUBLISH_CHUNK = 1024


async def publish_checked(
    runtime: Runtime,
    checked: list[Record],
    publish_chunk: Callable[[tuple[Record, ...]], list[Receipt]],
) -> list[Receipt]:
    """Publish records that passed events.check_publish_batch, PUBLISH_CHUNK at a time, each
    chunk by `publish_chunk` (one core input; its receipts)."""
    receipts: list[Receipt] = []
    for start in range(0, len(checked), PUBLISH_CHUNK):
        # Flow control: a burst waits for its neighbours' queues instead of overflowing them.
        await runtime.network.wait_for_room(PUBLISH_WAIT)
        receipts += publish_chunk(tuple(checked[start : start + PUBLISH_CHUNK]))
    return receipts


class Receipts:
    """The receipts of one PublishMany, from the core's events for it: our own stream's
    records in order as `Published`; a named place as `AlreadyPublished` (taken), as the
    `Deliver` of its place (delivered), or neither (held behind an earlier place)."""

    __slots__ = ("_own", "_placed", "_records")

    def __init__(self, records: tuple[Record, ...]) -> None:
        self._records = records
        self._own: list[Published] = []
        self._placed: dict[tuple[bytes, int], list[Receipt]] = {}

    def note(self, event: Published | AlreadyPublished | Deliver | Recovered) -> None:
        """One of the core's events while the publish is fed (others than the publish's
        own may come too: a place not among the records is never asked for)."""
        match event:
            case Published():
                self._own.append(event)
            case AlreadyPublished(id=mid, publisher=publisher, seq=seq):
                self._placed.setdefault((publisher, seq), []).append(
                    Receipt(mid, publisher, seq, duplicate=True)
                )
            case Deliver(id=mid, envelope=envelope):
                place = (envelope.publisher, envelope.seq)
                self._placed.setdefault(place, []).append(Receipt(mid, *place, duplicate=False))
            case Recovered():
                pass  # history, behind the stream: no place a publish takes

    def of_records(self) -> list[Receipt]:
        """Each record's receipt, in the records' order."""
        receipts = []
        mine = iter(self._own)
        placed = self._placed
        for record in self._records:
            if record.stream is None:
                published = next(mine, None)
                if published is None:
                    raise AssertionError("the core accepted a publish without reporting it")
                envelope = published.envelope
                receipts.append(Receipt(published.id, envelope.publisher, envelope.seq, False))
                continue
            got = placed.get(record.stream)
            if got:
                receipts.append(got.pop(0))
            else:
                # Held in order behind an earlier place of the stream that has not come yet:
                # accepted, and delivered here once the gap before it is filled or given up.
                receipts.append(Receipt(None, *record.stream, duplicate=False))
        return receipts
