"""What one topic's broadcast will announce at its next IHAVE flush, and to whom not.

Plumtree's lazy push (broadcast.py) announces, every flush interval, what the node received
or published since the last flush to the neighbours that are lazy for it. This is the queue
of those announcements and what keeps one from going to a neighbour that holds its message
already; broadcast.py decides when to flush and to which neighbours.

Rules this queue keeps:
- A neighbour is announced only what was queued after its link came up (`link_up`): a late
  joiner announced what we held before it came took it for news.
- A queued message is not announced to a neighbour known to hold it: the one it came from,
  and each that sent it to us since (`note_holder`).
- A place a neighbour announced to us since the last flush is not announced back to it
  (`note_announced`, at most MAX_NOTED_RANGES ranges a neighbour).
- The flush empties it all (`clear`): every table here holds what one flush interval
  brought, and a neighbour's noted ranges at most MAX_NOTED_RANGES.
- What a neighbour is announced costs a step per run of the queue, not per message: the
  queue is cut into runs once a flush (`runs_for`), whatever the number of neighbours.

A plain data structure: no clock, no I/O.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from typing import Any

from episub.proto import messages as m
from episub.proto.messages import MessageId, PeerId

__all__ = ["MAX_NOTED_RANGES", "Announcements", "Queued"]

# Beyond this many noted ranges a neighbour may be announced some places back: a little
# traffic, nothing else.
MAX_NOTED_RANGES = 64  # guess: publishers active in one ihave_interval, with room

Queued = tuple[MessageId, PeerId, int, int]  # (id, publisher, seq, hops)


class Announcements:
    """The announcements waiting for one topic's next IHAVE flush."""

    __slots__ = ("_announced", "_blocks", "_holders", "_queued_before", "queue")

    def __init__(self) -> None:
        # What we received or published since the last flush, in that order.
        self.queue: list[Queued] = []
        # neighbour whose link came up since the last flush -> how much of `queue` was
        # queued before: it is announced only what came after.
        self._queued_before: dict[PeerId, int] = {}
        # queued id -> neighbours known to hold it: it is not announced to them.
        self._holders: dict[MessageId, list[PeerId]] = {}
        # neighbour -> ranges it announced to us (MAX_NOTED_RANGES): not announced back.
        self._announced: dict[PeerId, list[m.StreamRange]] = {}
        # `queue` in blocks (`_blocks_of`), made when first asked for since it last changed.
        self._blocks: list[_Block] | None = None

    def add(
        self, mid: MessageId, publisher: PeerId, seq: int, hops: int, sender: PeerId | None
    ) -> None:
        """Queue `mid` (from `sender`, None: our own) for the next flush."""
        self.queue.append((mid, publisher, seq, hops))
        self._holders[mid] = [] if sender is None else [sender]
        self._blocks = None

    def link_up(self, peer: PeerId) -> None:
        """`peer`'s link came up: what is queued now is not news to announce to it."""
        if self.queue:
            self._queued_before[peer] = len(self.queue)

    def link_down(self, peer: PeerId) -> None:
        self._announced.pop(peer, None)
        self._queued_before.pop(peer, None)

    def note_holder(self, mid: MessageId, peer: PeerId) -> None:
        """Neighbour `peer` holds `mid` (it sent it to us): while `mid` waits for the
        flush, it is not announced to `peer`."""
        holders = self._holders.get(mid)
        if holders is not None and peer not in holders:
            holders.append(peer)
            self._blocks = None

    def note_announced(self, peer: PeerId, announced: m.StreamRange) -> None:
        """`peer` announced `announced` to us: not announced back to it this flush."""
        noted = self._announced.setdefault(peer, [])
        if len(noted) < MAX_NOTED_RANGES:
            noted.append(announced)

    def runs_for(
        self,
        peer: PeerId,
        announced: Callable[[PeerId], bool] | None = None,
        skip: tuple[m.StreamRange, ...] = (),
        limit: int = 1 << 62,
    ) -> tuple[int, list[list[m.StreamRange]]]:
        """What `peer` is to be announced, as runs: the messages queued since its link came
        up, of the publishers `announced` says yes to (None: all), that `peer` is not known
        to hold (nor to have announced to us, nor named in `skip`). Consecutive seqs of
        one publisher at one hop count make one range, ranges in the order of their first
        place; a new batch of ranges starts every `limit` places (one IHAVE's worth of
        ids). Returns (places, batches).

        The IHAVE flush asks this of every lazy neighbour: the queue is cut into blocks
        once (`_blocks_of`), and each neighbour costs a step per block, not per message."""
        blocks = self._blocks
        if blocks is None:
            blocks = self._blocks = _blocks_of(self.queue, self._holders)
        before = self._queued_before.get(peer, 0)
        noted: list[m.StreamRange] = self._announced.get(peer, [])
        if skip:
            noted = [*noted, *skip]
        spans = _merged_spans(noted) if noted else None
        verdicts: dict[PeerId, bool] = {}
        batches: list[list[list[Any]]] = []
        runs: list[list[Any]] = []  # [publisher, first, last, hops]
        open_runs: dict[PeerId, list[Any]] = {}
        places = room = 0
        for publisher, first, last, hops, holders, end in blocks:
            if end <= before:
                continue
            if announced is not None:
                verdict = verdicts.get(publisher)
                if verdict is None:
                    verdict = verdicts[publisher] = announced(publisher)
                if not verdict:
                    continue
            if holders and peer in holders:
                continue
            if end - (last - first + 1) < before:  # the link came up within this block
                first = last - (end - before) + 1
            pieces = [(first, last)]
            if spans is not None:
                starts_ends = spans.get(publisher)
                if starts_ends is not None:
                    starts, ends = starts_ends
                    i = bisect_right(starts, first) - 1
                    if i >= 0 and last <= ends[i]:
                        continue  # inside one range it announced (a block of one, often)
                    pieces = _outside(first, last, starts, ends)
            for low, high in pieces:
                while low <= high:
                    if not room:
                        runs = []
                        batches.append(runs)
                        open_runs = {}
                        room = limit
                    upto = min(high, low + room - 1)
                    room -= upto - low + 1
                    places += upto - low + 1
                    run = open_runs.get(publisher)
                    if run is not None and low == run[2] + 1 and hops == run[3]:
                        run[2] = upto
                    else:
                        run = open_runs[publisher] = [publisher, low, upto, hops]
                        runs.append(run)
                    low = upto + 1
        return places, [[(p, first, last, h) for p, first, last, h in b] for b in batches]

    def clear(self) -> None:
        """The flush announced what was queued: start the next interval empty."""
        self.queue = []
        self._queued_before = {}
        self._holders = {}
        self._announced = {}
        self._blocks = None


# A run of the queue: (publisher, first seq, last seq, hops, holders, the queue index
# after its last message). Its messages are consecutive in the queue and in seq, of one
# publisher at one hop count, and known to be held by the same neighbours.
_Block = tuple[PeerId, int, int, int, list[PeerId], int]


def _blocks_of(queue: list[Queued], holders: dict[MessageId, list[PeerId]]) -> list[_Block]:
    """`queue` as blocks (`_Block`), in order: a burst's messages from one sender make one."""
    blocks: list[_Block] = []
    publisher: PeerId | None = None
    first = last = hops = -1
    held_by: list[PeerId] = []
    for i, (mid, p, seq, h) in enumerate(queue):
        by = holders.get(mid, [])
        if p == publisher and seq == last + 1 and h == hops and by == held_by:
            last = seq
            continue
        if publisher is not None:
            blocks.append((publisher, first, last, hops, held_by, i))
        publisher, first, last, hops, held_by = p, seq, seq, h, by
    if publisher is not None:
        blocks.append((publisher, first, last, hops, held_by, len(queue)))
    return blocks


def _outside(first: int, last: int, starts: list[int], ends: list[int]) -> list[tuple[int, int]]:
    """The pieces of first..last outside the disjoint spans (starts, ends), in order."""
    pieces = []
    i = max(bisect_right(starts, first) - 1, 0)
    low = first
    while low <= last and i < len(starts):
        if ends[i] < low:
            i += 1
            continue
        if starts[i] > last:
            break
        if starts[i] > low:
            pieces.append((low, starts[i] - 1))
        low = ends[i] + 1
        i += 1
    if low <= last:
        pieces.append((low, last))
    return pieces


def _merged_spans(
    ranges: list[m.StreamRange],
) -> dict[PeerId, tuple[list[int], list[int]]]:
    """`ranges` as each publisher's disjoint seq spans, in order: (starts, ends), so that a
    seq is looked up by bisection, not against every range."""
    by_publisher: dict[PeerId, list[tuple[int, int]]] = {}
    for publisher, first, last, _ in ranges:
        by_publisher.setdefault(publisher, []).append((first, last))
    merged: dict[PeerId, tuple[list[int], list[int]]] = {}
    for publisher, spans in by_publisher.items():
        starts: list[int] = []
        ends: list[int] = []
        for first, last in sorted(spans):
            if ends and first <= ends[-1] + 1:
                ends[-1] = max(ends[-1], last)
            else:
                starts.append(first)
                ends.append(last)
        merged[publisher] = (starts, ends)
    return merged
