"""Answers a batch at a time: what each peer asked of one topic (PULL, GRAFT over ranges)
and has not been sent yet, as a cursor over (publisher, seq range)s.

A 17-byte PULL names 4,096 places: answered whole at once, it made 2 MB of GOSSIP and
thousands of store look-ups in one input. Here a request is answered a bounded batch
at a time, the next batch when the asker has read the last one.

Rules this machine keeps:
- A batch is at most `answer_batch_messages` messages and PULL seqs looked up together
  (a PULL's seq costs an item found or not), and at most `answer_batch_bytes` of
  envelopes (but at least one message, however large); a GRAFT's places the store does
  not hold cost a look-up, no item.
- A request from a peer with nothing waiting is answered at once up to one batch; the
  rest waits in the peer's cursor. A request from a peer with answers waiting joins them
  and waits its turn: one batch per turn, however many requests. A GRAFT's ranges (live
  repair) go before the PULLs' (history, catch-up) waiting, after the GRAFTs'.
- A range within one still being answered (same kind and publisher, within the seqs it
  asked) is merged with it: nothing is added, and what of it was sent is not sent again
  (a repeated PULL costs nothing more). A peer's cursor holds at most
  MAX_PENDING_RANGES ranges and MAX_PENDING_SEQS seqs: a range past either is refused.
- At most MAX_ASKERS peers have answers waiting: a new one past that pushes out the
  peer whose answers waited longest.
- The next batch comes when the runtime says the peer's answers drained (`drained`).
  Where nothing reports drains (the simulator: `answer_retry` set), a timer serves every
  waiting peer a batch each period.
- A cursor goes with its peer (`forget`): its connection lost, or out of the active view.
- Each message of a PULL goes with its hop count + 1 (History packs where publishers are
  bytes; one GOSSIP each for the simulator's int ids); each of a GRAFT as a GOSSIP.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TypeVar

from episub.proto import messages as m
from episub.proto.config import BroadcastConfig
from episub.proto.envelope import Envelope
from episub.proto.events import OutEvent, Send
from episub.proto.history import history_packs
from episub.proto.messages import MessageId, PeerId
from episub.proto.store import Cached
from episub.proto.tables import BroadcastCounters

__all__ = ["MAX_ASKERS", "MAX_PENDING_RANGES", "MAX_PENDING_SEQS", "AnswerCursors"]

# Ranges one peer's waiting answers hold: a GRAFT's worth of places one apart
# (BroadcastConfig.max_graft_ids' default). An honest GRAFT names a few ranges.
MAX_PENDING_RANGES = 256
# Seqs they span: two whole PULLs (messages.MAX_PULL_SPAN), as the runtime's answer lanes.
MAX_PENDING_SEQS = 2 * m.MAX_PULL_SPAN
# Peers with answers waiting in one topic. Guess: far more than a node's neighbours and
# the readers fetching from it at once; each costs at most MAX_PENDING_RANGES small rows.
MAX_ASKERS = 128
T = TypeVar("T")

# Bytes a message costs a batch beyond its envelope: its id, hops and framing (a guess
# on the high side, so that a batch's encoded size stays within answer_batch_bytes).
_MESSAGE_OVERHEAD = 64

# (publisher, seq) -> the message held there, if any: a GRAFT's places.
Lookup = Callable[[PeerId, int], "Cached | None"]
# publisher -> (seq -> (bytes, hops) of the message the store holds there), made once per
# range of a batch: a PULL's places.
HistoryReader = Callable[[PeerId], Callable[[int], "tuple[bytes, int] | None"]]


@dataclass(slots=True)
class _Range:
    pull: bool  # a PULL's (a seq not held costs an item) or a GRAFT's (skipped)
    publisher: PeerId
    first_seq: int  # as asked: a repeat of any part of it is merged
    next_seq: int
    last_seq: int


@dataclass(slots=True)
class _Cursor:
    ranges: deque[_Range] = field(default_factory=deque)
    seqs: int = 0  # seqs the ranges have left


class AnswerCursors:
    """One topic's waiting answers, per peer, oldest asker first."""

    def __init__(
        self,
        topic: str,
        config: BroadcastConfig,
        counters: BroadcastCounters,
        message_id: Callable[[bytes | memoryview], MessageId],
    ) -> None:
        self.topic = topic
        self.message_id = message_id  # of an envelope's unsigned bytes (envelope.IdHasher)
        self.config = config
        self.counters = counters
        self.cursors: OrderedDict[PeerId, _Cursor] = OrderedDict()

    def __len__(self) -> int:
        return len(self.cursors)

    def waiting(self, peer: PeerId) -> int:
        """Ranges waiting for `peer` (a query)."""
        cursor = self.cursors.get(peer)
        return 0 if cursor is None else len(cursor.ranges)

    def ask(
        self,
        peer: PeerId,
        pull: bool,
        ranges: list[tuple[PeerId, int, int]],
        lookup: Lookup,
        history: HistoryReader,
        out: list[OutEvent],
    ) -> bool:
        """`peer` asks for `ranges` (publisher, first, last). Served at once up to a batch
        when nothing of its waits; True when some of it is left waiting (the caller arms
        the retry timer where there is one)."""
        cursor = self.cursors.get(peer)
        fresh = cursor is None
        if cursor is None:
            cursor = _Cursor()
        for publisher, first, last in ranges:
            self._add(cursor, pull, publisher, first, last)
        if not cursor.ranges:
            return False
        if fresh:
            if len(self.cursors) >= MAX_ASKERS:
                self.cursors.popitem(last=False)  # the peer whose answers waited longest
                self.counters.answer_askers_evicted += 1
            self.cursors[peer] = cursor
            self._serve(peer, cursor, lookup, history, out)
        return peer in self.cursors

    def drained(
        self, peer: PeerId, lookup: Lookup, history: HistoryReader, out: list[OutEvent]
    ) -> None:
        """`peer` has read what it was sent: its next batch."""
        cursor = self.cursors.get(peer)
        if cursor is not None:
            self._serve(peer, cursor, lookup, history, out)

    def retry(self, lookup: Lookup, history: HistoryReader, out: list[OutEvent]) -> bool:
        """The retry timer (no runtime reports drains): a batch for every waiting peer.
        True when some are left waiting."""
        for peer, cursor in list(self.cursors.items()):
            self._serve(peer, cursor, lookup, history, out)
        return bool(self.cursors)

    def forget(self, peer: PeerId) -> None:
        self.cursors.pop(peer, None)

    # -- inside -----------------------------------------------------------------------------

    def _add(self, cursor: _Cursor, pull: bool, publisher: PeerId, first: int, last: int) -> None:
        for waiting in cursor.ranges:
            if (
                waiting.pull is pull
                and waiting.publisher == publisher
                and waiting.first_seq <= first
                and last <= waiting.last_seq
            ):
                self.counters.answer_ranges_merged += 1
                return
        span = last - first + 1
        if len(cursor.ranges) >= MAX_PENDING_RANGES or cursor.seqs + span > MAX_PENDING_SEQS:
            self.counters.answer_ranges_refused += 1
            return
        waiting_range = _Range(pull, publisher, first, first, last)
        if pull:
            cursor.ranges.append(waiting_range)
        else:  # live repair goes before history: after the GRAFT ranges already waiting
            ahead = next((i for i, r in enumerate(cursor.ranges) if r.pull), len(cursor.ranges))
            cursor.ranges.insert(ahead, waiting_range)
        cursor.seqs += span

    def _serve(
        self,
        peer: PeerId,
        cursor: _Cursor,
        lookup: Lookup,
        history: HistoryReader,
        out: list[OutEvent],
    ) -> None:
        """One batch from the front of `peer`'s cursor; the cursor goes once empty."""
        config = self.config
        items = size = 0
        full = False
        self.counters.answer_batches += 1
        ranges = cursor.ranges
        while ranges and not full:
            r = ranges[0]
            publisher = r.publisher
            if r.pull:  # a miss costs an item
                raws, seq, items, size, full = _take(
                    history(publisher), _raw_of_pair, r, True, items, size, config
                )
                self._send_history(peer, publisher, raws, out)
            else:  # a GRAFT's places: live repair
                found, seq, items, size, full = _take(
                    partial(lookup, publisher), _raw_of_cached, r, False, items, size, config
                )
                for cached in found:
                    gossip = cached.gossip(min(cached.hops + 1, m.MAX_HOPS))
                    out.append(Send(peer, self.topic, gossip, answer=True))
            cursor.seqs -= seq - r.next_seq
            r.next_seq = seq
            if seq > r.last_seq:
                ranges.popleft()
        if not ranges:
            del self.cursors[peer]

    def _send_history(
        self, peer: PeerId, publisher: PeerId, held: list[tuple[bytes, int]], out: list[OutEvent]
    ) -> None:
        """A PULL's `held` (bytes, hops as held) sent on at one hop more."""
        topic = self.topic
        raws = [(raw, min(hops + 1, m.MAX_HOPS)) for raw, hops in held]
        if isinstance(publisher, bytes):
            for pack in history_packs(publisher, raws, self.config.max_message_size):
                out.append(Send(peer, topic, pack, answer=True))
            return
        for raw, hops in raws:  # the simulator's int ids: one GOSSIP each, its id found again
            envelope = Envelope.decode(raw)
            envelope.publisher = publisher
            gossip = m.Gossip(id=self.message_id(envelope.unsigned), envelope=envelope, hops=hops)
            out.append(Send(peer, topic, gossip, answer=True))


def _take(
    held_at: Callable[[int], T | None],
    raw_of: Callable[[T], bytes],
    r: _Range,
    count_misses: bool,
    items: int,
    size: int,
    config: BroadcastConfig,
) -> tuple[list[T], int, int, int, bool]:
    """What `held_at` holds of `r` from its next seq, within the batch's bounds (items and
    bytes so far given; a miss costs an item where `count_misses`): (what was found, the
    next seq, items, bytes, whether the batch is full)."""
    max_items, max_bytes = config.answer_batch_messages, config.answer_batch_bytes
    found: list[T] = []
    seq, last = r.next_seq, r.last_seq
    while seq <= last:
        held = held_at(seq)
        if held is not None:
            cost = len(raw_of(held)) + _MESSAGE_OVERHEAD
            if items and size + cost > max_bytes:
                return found, seq, items, size, True
            found.append(held)
            items += 1
            size += cost
        elif count_misses:
            items += 1  # a look-up that found nothing costs an item too
        seq += 1
        if items >= max_items:
            return found, seq, items, size, True
    return found, seq, items, size, False


def _raw_of_pair(held: tuple[bytes, int]) -> bytes:
    return held[0]


def _raw_of_cached(held: Cached) -> bytes:
    return held.raw
