"""Per-publisher ordered delivery for one topic: streams, held messages and gap repair.

Broadcast (broadcast.py) decides which copy of a message is the first; it hands each first
copy here, and this machine decides when the application gets it. It holds no message:
what waits for a gap is a row of the node's store (store.py), pinned there while it waits.

The ordering rule (docs/protocol.md, "Delivery is in order per publisher"): a stream
moves on only by delivering in order, or by giving up a gap once in-order delivery has
stalled. A message far ahead does not move it: a far jump alone, forged or honest, never
discards an in-order stream that keeps arriving.

Rules this machine keeps:
- The application gets each publisher's messages in sequence order, each once: a message
  that arrives early is held until the gap before it is filled or given up (DataLost).
  `next_seq` never passes a held message, so the gap `next_seq..first held - 1` is never
  empty, and a PULL built from it is always a valid range.
- The first message we see of a publisher opens its stream. Where the stream starts is
  fixed only after `stream_settle` (nothing comes before seq 0), at the lowest seq held
  then, so an earlier message that the first one overtook is still delivered, in order.
  While it settles, only answers to our own fetch below the lowest seq seen are history.
- A stream whose lowest seq held when it settles is above 0 and stamped after the topic's
  join (`joined`: the join input's `now`, in stamps' milliseconds) reaches back instead:
  its first messages were published after we joined, so the ones before them may have
  been too (published while this node had no link to the overlay). It PULLs the seq
  below what it holds, then, each time the lowest seq asked for comes, as many again as
  the reach has covered (1, 1, 2, 4, ...), never more than `max_gap` below its first
  message nor more than `held` has room for; an answer stamped after the join is
  held, one stamped at or before it is history (Recovered) and the stream starts after
  it; seq 0 ends the reach too. A step unanswered (as a gap's PULL, below) is
  asked of the next neighbour, each at most once and `gap_max_attempts` in all; then,
  or out of reach, the stream starts at the lowest seq held (`reach_backs_cut`), with no
  DataLost: nobody holding the seqs below is what messages from long before the join look
  like too. An answer within the reach is not forwarded (news to nobody downstream).
- A message from before its stream's position is history: kept by broadcast, not
  delivered again (`behind_stream`).
- A gap is pulled (PULL first..last) from the neighbours in turn once it has stood
  `gap_timeout` with nothing delivered in order; every message delivered in order starts
  that clock again. A PULL (and a reach's step) counts as unanswered after
  `gap_retry_interval`, or after the age the stream's messages arrive at if that is
  longer, up to `MAX_ANSWER_WAIT` (`_answer_wait`): on a node whose queues hold seconds
  of traffic (an executor busy with its tasks, a slow link) the answer takes as long as
  they do, and a gap given up before it comes is a DataLost for messages its neighbours
  hold. After `gap_max_attempts` unanswered PULLs, or with no neighbour to ask, in-order
  delivery has stalled: a gap before a message within pulling reach (`max_gap`) is given
  up and what it held back is delivered. A gap before a message beyond reach is given up
  only if the stream beyond goes on (two or more messages held there); a far message
  alone is dropped instead, and the stream stays where it is.
- A held message is a row of the node's store (store.py), pinned there until it is
  delivered or let go: the store owns what sits at a place, and a second message for a
  held place waits there instead only once it has taken the place in the store (by the
  store's rule, which broadcast applies before handing it here).
- Held messages are bounded (`max_held_per_publisher`). When they are full, the farthest
  message goes, or the newcomer if it is the farthest; a full `held` gives up no gap
  (only a stall does).
- A message dropped unheld stays at its place in the store (unpinned, within its bounds):
  the stream remembers the farthest seq it dropped (`dropped_high`) and, when it gets
  there, delivers what the store holds at each place up to it. A place the store has let
  go is a gap like any other, pulled and then given up, up to the farthest dropped seq
  if that is within `max_gap`; beyond it, forgotten (a dropped far seq may be a
  forger's). The store says a dropped message is held, so a catch-up or an IHAVE never
  fetches it again: only this delivers it.
- Every table a peer can grow is bounded: held messages per publisher, publishers (the
  least recently active idle stream is forgotten to make room), fetched spans
  (`max_fetches` publishers, MAX_FETCHED_SPANS each).
- An answer to our own fetch of a publisher we have no stream of is history: kept, not
  delivered, not forwarded (a reader filling a range opens no stream).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass, field

from episub.proto import messages as m
from episub.proto.config import BroadcastConfig
from episub.proto.events import (
    DataLost,
    Deliver,
    OutEvent,
    PeerMisbehaved,
    Recovered,
    ScheduleTimer,
    Send,
)
from episub.proto.messages import Envelope, MessageId, PeerId
from episub.proto.store import MessageStore, Places
from episub.proto.tables import BroadcastCounters
from episub.proto.timers import BroadcastTimer

# Spans of one publisher remembered as fetched: a reader's range and a catch-up's may be
# fetched at once. Guess: a few fetches of one publisher at a time.
MAX_FETCHED_SPANS = 4
# The longest a PULL stands before it counts as unanswered (`_answer_wait`): messages
# that arrive older than this tell of a clock (ours ahead of the publisher's, or a forged
# stamp), not of queues, and count for nothing. Bounds how much a stamp can delay a
# gap's DataLost: gap_max_attempts times this. Guess: queues a minute deep are a node
# that has fallen behind for good.
MAX_ANSWER_WAIT = 30.0


@dataclass(slots=True)
class PublisherStream:
    """Ordered delivery state for one publisher."""

    next_seq: int  # the next sequence number the application gets
    held: dict[int, int] = field(default_factory=dict)  # seq -> its pinned store row
    # No seq in `held` is above this: a newcomer beyond it is the farthest at no cost, where
    # max(held) would cost each message of a burst that overflows `held` a full scan.
    held_above: int = -1
    settling_until: float | None = None  # while set, where the stream starts is not fixed
    # While a gap is open: when a message was last delivered in order (or the gap opened).
    stalled_since: float | None = None
    pull_attempts: int = 0  # PULLs of the open gap, or of the reach's step while it settles
    # While it reaches back (settling): the lowest seq asked for, and the lowest seq held
    # when the reach began (it asks for nothing more than max_gap below that).
    reach_low: int | None = None
    reach_from: int = 0
    last_stamp_ms: int = 0  # the stamp of the last message delivered
    # The farthest seq dropped unheld (`held` was full) that the stream has not passed: a
    # dropped message stays at its place in the store, where delivery takes it up when
    # the stream gets there, and a place the store no longer holds is pulled.
    dropped_high: int = -1
    # While a gap is open or the stream settles: how old (s, by its stamp) the last message
    # that arrived was, and when the PULL asked last may be taken as unanswered.
    lag: float = 0.0
    pull_due: float = 0.0


class OrderedDelivery:
    """The streams of one topic's publishers. Broadcast owns one and shares its counters
    with it, so `delivered`, `pulls_sent`, `data_lost` and `streams_evicted` stay
    Broadcast's counters."""

    def __init__(
        self,
        *,
        topic: str,
        config: BroadcastConfig,
        timer_prefix: tuple[Hashable, ...],
        counters: BroadcastCounters,
        store: MessageStore,
        places: Places,
    ) -> None:
        self.topic = topic
        self.store = store
        self._places = places
        self.config = config
        self._timer_prefix = timer_prefix
        self.counters = counters
        self.streams: dict[PeerId, PublisherStream] = {}
        # publisher -> the last spans we fetched of it (MAX_FETCHED_SPANS), publishers oldest
        # first; bounded by max_fetches.
        self.fetches: OrderedDict[PeerId, list[tuple[int, int]]] = OrderedDict()
        self._gap_armed = False
        # Messages stamped at or before this (ms) are history to a reach back: the topic's
        # join, raised to the last message delivered of each stream forgotten since (a
        # reach must not deliver those again). None: no join told here, no reach back.
        self.reach_floor_ms: int | None = None
        self._reaching = 0  # streams reaching back: none, and a first copy costs no look-up

    def close(self) -> None:
        """The topic is left: what its streams hold goes back to the store."""
        for stream in self.streams.values():
            for row in stream.held.values():
                self.store.unpin(row)
            stream.held.clear()

    def joined(self, now: float) -> None:
        """The topic was joined at `now`: what is stamped later, the subscription must get."""
        self.reach_floor_ms = int(now * 1000)

    # -- queries ------------------------------------------------------------------------

    def place_taken(self, publisher: PeerId, seq: int) -> bool:
        """Is (publisher, seq) delivered here already, or held waiting for a gap?"""
        stream = self.streams.get(publisher)
        if stream is None:
            return False
        return seq < stream.next_seq or seq in stream.held

    def behind_stream(self, envelope: Envelope) -> bool:
        """Is this message history for us: from before where its stream starts? While the
        stream settles, only an answer to our own fetch below the lowest seq seen is (a
        fetch made right after joining): any other message may be where the stream starts,
        and holding it is what keeps a forged far seq that opened the stream from hiding
        the real one."""
        stream = self.streams.get(envelope.publisher)
        if stream is None:
            # No stream of it here yet: an answer to our own fetch is history (a reader
            # filling a range), not the first live message of a stream to forward.
            return self.fetched(envelope.publisher, envelope.seq)
        seq = envelope.seq
        if seq >= stream.next_seq:
            return False  # ahead of the stream: held or not, never history
        if seq in stream.held or _within_reach(stream, seq):
            return False
        if stream.settling_until is not None:
            return self.fetched(envelope.publisher, envelope.seq)
        return True

    def within_reach(self, envelope: Envelope) -> bool:
        """Is this message one its stream's reach back asked for and does not hold yet?
        Then `reach_answer` takes it."""
        if not self._reaching:
            return False
        stream = self.streams.get(envelope.publisher)
        return stream is not None and _within_reach(stream, envelope.seq)

    def fetched(self, publisher: PeerId, seq: int) -> bool:
        """Does (publisher, seq) fall in one of the last spans we fetched of `publisher`?"""
        spans = self.fetches.get(publisher)
        if spans:
            for low, high in spans:  # a loop, not any(genexpr): asked of every HISTORY message
                if low <= seq <= high:
                    return True
        return False

    # -- commands -----------------------------------------------------------------------

    def fetch(
        self, peer: PeerId, publisher: PeerId, first: int, last: int, out: list[OutEvent]
    ) -> None:
        """PULL first..last of `publisher` from `peer`, in spans the wire allows."""
        # Spans fetched one after another (a reader's chunks in flight at once) are one.
        # Spans fetched one after another (a reader's chunks in flight at once) are one;
        # apart (a reader's and a catch-up's fetch of one publisher), the latest few.
        spans = self.fetches.pop(publisher, [])
        for low, high in spans:
            if first <= high + 1 and last >= low - 1:
                spans.remove((low, high))
                spans.append((min(first, low), max(last, high)))
                break
        else:
            spans.append((first, last))
        self.fetches[publisher] = spans[-MAX_FETCHED_SPANS:]
        if len(self.fetches) > self.config.max_fetches:
            self.fetches.popitem(last=False)
        while first <= last:
            upto = min(last, first + m.MAX_PULL_SPAN - 1)
            self.counters.pulls_sent += 1
            out.append(
                Send(peer, self.topic, m.Pull(publisher=publisher, first_seq=first, last_seq=upto))
            )
            first = upto + 1

    def deliver(
        self, mid: MessageId, envelope: Envelope, hops: int, now: float, out: list[OutEvent]
    ) -> None:
        """Hand over a first copy (or our own publish at a named stream's place): the
        application gets it now if it is next, later if a gap comes before it, or never
        if its place is taken already."""
        streams = self.streams
        publisher = envelope.publisher
        seq = envelope.seq
        stream = streams.pop(publisher, None)
        if stream is None:
            stream = self._open_stream(envelope, now, out)
            if stream is None:
                return
        if seq == stream.next_seq and not stream.held and stream.settling_until is None:
            # The next in sequence, nothing held: what nearly every message is (a new
            # stream's first one too: a configuration write is a stream of its own).
            streams[publisher] = stream
            stream.next_seq = seq + 1
            stream.last_stamp_ms = envelope.timestamp_ms
            self.counters.delivered += 1
            out.append(Deliver(self.topic, mid, envelope, hops))
            if stream.dropped_high > seq:
                self._release_held(publisher, stream, out)
                self._stall_clock(stream, seq + 1, now, out)
            return
        c = self.config
        # Re-inserted on every message: `streams` runs from least to most recently active.
        streams[publisher] = stream
        stream.lag = now - envelope.timestamp_ms / 1000
        if stream.settling_until is not None:
            self._hold_while_settling(stream, envelope, mid)
            return
        if seq < stream.next_seq:
            return  # delivered already, or from before we joined
        if seq in stream.held:
            self._take_held_place(stream, envelope, mid)
            return
        if (
            seq > stream.next_seq
            and len(stream.held) >= c.max_held_per_publisher
            and not self._make_room(stream, seq)
        ):
            self._drop(stream, seq)
            return
        # The next in sequence is delivered, with what it unblocks; any other waits in
        # `held` for the gap before it.
        before = stream.next_seq
        if seq == before:
            stream.next_seq = seq + 1
            stream.last_stamp_ms = envelope.timestamp_ms
            self._emit(mid, envelope, hops, out)
        else:
            row = self._pin(mid)
            if row < 0:
                self._drop(stream, seq)
                return
            stream.held[seq] = row
            stream.held_above = max(stream.held_above, seq)
        self._release_held(publisher, stream, out)
        self._stall_clock(stream, before, now, out)

    def _stall_clock(
        self, stream: PublisherStream, before: int, now: float, out: list[OutEvent]
    ) -> None:
        """A gap stands (held or dropped messages beyond the stream): at a new gap, or
        after delivery in order past the last one (from `before`), the stall clock
        (re)starts. A stream that keeps arriving never stalls, whatever is held far ahead
        of it."""
        if (stream.held or stream.dropped_high >= stream.next_seq) and (
            stream.stalled_since is None or stream.next_seq != before
        ):
            stream.stalled_since = now
            stream.pull_attempts = 0
            self._arm_gap_timer(out)

    def _open_stream(
        self, envelope: Envelope, now: float, out: list[OutEvent]
    ) -> PublisherStream | None:
        """The stream the first message we see of a publisher opens; None when the topic
        holds max_publishers streams and none is idle enough to forget. Where it starts is
        fixed only after `stream_settle`, so an earlier message that the first one
        overtook is still delivered, in order. Nothing comes before seq 0."""
        c = self.config
        if len(self.streams) >= c.max_publishers and not self._evict_idle_stream():
            out.append(PeerMisbehaved(envelope.publisher, "too many publishers on this topic"))
            return None
        settles = c.stream_settle > 0 and envelope.seq > 0
        if settles:
            token = (*self._timer_prefix, BroadcastTimer.SETTLE)
            out.append(ScheduleTimer(c.stream_settle, token))
        return PublisherStream(
            next_seq=envelope.seq, settling_until=now + c.stream_settle if settles else None
        )

    def _pin(self, mid: MessageId) -> int:
        """`mid`'s store row, pinned while it is held; -1 when the store no longer holds
        its bytes (a bound smaller than one message let them go at once)."""
        store = self.store
        row = store.find(mid)
        return row if row >= 0 and store.pin(row) else -1

    def _take_held_place(self, stream: PublisherStream, envelope: Envelope, mid: MessageId) -> None:
        """A second message for a held place: it waits there instead if it took the place
        in the store (a sink row written again, with a stamp that wins)."""
        seq = envelope.seq
        row = self.store.find(mid)
        if row < 0 or self._places.row(envelope.publisher, seq) != row or not self.store.pin(row):
            return
        self.store.unpin(stream.held[seq])
        stream.held[seq] = row

    def _hold_while_settling(
        self, stream: PublisherStream, envelope: Envelope, mid: MessageId
    ) -> None:
        """Hold a message until the stream settles at the lowest seq held; when held is
        full, the lowest ones stay."""
        held = stream.held
        seq = envelope.seq
        if seq in held:
            self._take_held_place(stream, envelope, mid)
            return
        if len(held) >= self.config.max_held_per_publisher:
            highest = self._farthest_held(stream, seq)
            if seq > highest:
                self._drop(stream, seq)
                return
            self.store.unpin(held.pop(highest))
            self._drop(stream, highest)
        row = self._pin(mid)
        if row < 0:
            self._drop(stream, seq)
            return
        held[seq] = row
        stream.held_above = max(stream.held_above, seq)
        stream.next_seq = min(stream.next_seq, seq)

    def _make_room(self, stream: PublisherStream, seq: int) -> bool:
        """Held is full and `seq` is not next: make room for it, or say there is none.

        The farthest message goes, or the newcomer if it is the farthest; no gap is given
        up here. A full `held` says nothing about whether in-order delivery has stalled:
        giving up the gap at once let three forged places within reach and two far ones
        skip a live stream (the adversarial model: seqs 3..7, not yet published, were
        given up while the honest stream was still arriving in order). The nearest
        messages stay, so the stream's own continuation is never crowded out; what is
        dropped lies beyond them, inside a later gap that is pulled, or given up and
        reported once delivery has stalled (on_gap_timer)."""
        farthest = self._farthest_held(stream, seq)
        if seq > farthest:
            return False
        self.store.unpin(stream.held.pop(farthest))
        self._drop(stream, farthest)
        return True

    @staticmethod
    def _farthest_held(stream: PublisherStream, seq: int) -> int:
        """The farthest seq held, or one below `seq` when nothing held is beyond it."""
        if seq > stream.held_above:
            return seq - 1
        stream.held_above = max(stream.held)
        return stream.held_above

    def _drop(self, stream: PublisherStream, seq: int) -> None:
        """A message goes unheld (`held` is full): counted; its place stays wanted, and
        the stream takes it from the store when it gets there (`_release_held`)."""
        self.counters.held_dropped += 1
        if seq > stream.dropped_high:
            stream.dropped_high = seq

    def wants(self, publisher: PeerId, seq: int) -> bool:
        """Does the stream still need (publisher, seq): not delivered, given up or held?
        A message dropped unheld (a full `held`) is seen by broadcast, so its later copies
        (a PULL's or GRAFT's answer when the stream gets there) come as duplicates: one
        whose place is wanted is handed over again. By place, not by remembered ids: a
        burst that overflows `held` by more than it can remember would otherwise leave
        its dropped messages unrecoverable, every copy of them a duplicate. Not by leaving
        broadcast's seen set either: a first copy is forwarded, and a message every node
        drops would circulate among them without end."""
        stream = self.streams.get(publisher)
        return stream is not None and seq >= stream.next_seq and seq not in stream.held

    def _evict_idle_stream(self) -> bool:
        """Forget the least recently active stream that holds nothing, to make room for a
        new publisher. A publisher's streams come and go (a node restarts under a new id, a
        Spark sink writes each partition of each batch as a stream of its own), so a full
        table evicts instead of refusing; a forgotten publisher that sends again starts a
        new stream where it stands. False when every stream is waiting for a gap."""
        for publisher, stream in self.streams.items():
            if not stream.held and stream.settling_until is None and stream.dropped_high < 0:
                del self.streams[publisher]
                self.counters.streams_evicted += 1
                if self.reach_floor_ms is not None:
                    self.reach_floor_ms = max(self.reach_floor_ms, stream.last_stamp_ms)
                return True
        return False

    def on_settle_timer(self, neighbors: list[PeerId], now: float, out: list[OutEvent]) -> None:
        """Fix where each settled stream starts, and deliver what it holds from there; a
        stream first seen after our join reaches back first, and a reach's step that has
        stood unanswered is asked of the next of `neighbors`, or given up."""
        for publisher, stream in self.streams.items():
            if stream.settling_until is None or stream.settling_until > now:
                continue
            if stream.reach_low is not None:
                self._reach_unanswered(neighbors, publisher, stream, now, out)
                continue
            low = stream.next_seq  # the lowest seq held, while it settles
            if low and low in stream.held and self._after_join(self.store.stamp(stream.held[low])):
                self.counters.reach_backs += 1
                stream.reach_from = low
                if neighbors:
                    self._reach_further(neighbors[0], publisher, stream, now, out)
                    continue
                self.counters.reach_backs_cut += 1  # nobody to ask
            self._settle(publisher, stream, low, now, out)

    def reach_answer(
        self,
        peer: PeerId,
        mid: MessageId,
        envelope: Envelope,
        hops: int,
        now: float,
        out: list[OutEvent],
    ) -> None:
        """A first copy `within_reach` of its stream, from `peer`: stamped after our join,
        it is held, and the reach goes on below it, from `peer`, once the step's lowest seq
        has come; at or before the join, it is history, and the stream starts after it."""
        publisher = envelope.publisher
        stream = self.streams[publisher]
        seq = envelope.seq
        if not self._after_join(envelope.timestamp_ms):
            self.counters.recovered += 1
            out.append(Recovered(self.topic, mid, envelope))
            self._settle(publisher, stream, seq + 1, now, out)
            return
        if len(stream.held) >= self.config.max_held_per_publisher:
            # Live messages took the room the step was asked with: the reach ends here.
            self.counters.reach_backs_cut += 1
            self._settle(publisher, stream, stream.next_seq, now, out)
            if seq >= stream.next_seq:
                self.deliver(mid, envelope, hops, now, out)  # a gap inside what it holds
            else:
                self.counters.recovered += 1
                out.append(Recovered(self.topic, mid, envelope))
            return
        self.counters.reached_back += 1
        self._hold_while_settling(stream, envelope, mid)
        if stream.next_seq == 0:
            self._settle(publisher, stream, 0, now, out)  # nothing comes before seq 0
        elif stream.reach_low is not None and stream.next_seq <= stream.reach_low:
            self._reach_further(peer, publisher, stream, now, out)

    def _after_join(self, timestamp_ms: int) -> bool:
        """Stamped after the reach floor: the topic's join (the same millisecond counts as
        before it), or a forgotten stream's last delivery?"""
        return self.reach_floor_ms is not None and timestamp_ms > self.reach_floor_ms

    def _reach_further(
        self,
        peer: PeerId,
        publisher: PeerId,
        stream: PublisherStream,
        now: float,
        out: list[OutEvent],
    ) -> None:
        """PULL from `peer` the next step below the lowest seq held: as many seqs as the
        reach has covered so far (one at first), within max_gap of where it began."""
        low = stream.next_seq
        bottom = max(0, stream.reach_from - self.config.max_gap)
        room = self.config.max_held_per_publisher - len(stream.held)
        if low <= bottom or room <= 0:
            # Out of reach, or `held` is full: what comes next would push out what it holds.
            self.counters.reach_backs_cut += 1
            self._settle(publisher, stream, low, now, out)
            return
        first = max(bottom, low - min(room, max(1, stream.reach_from - low)))
        if stream.reach_low is None:
            self._reaching += 1
        stream.reach_low = first
        stream.pull_attempts = 0
        self._reach_step(peer, publisher, stream, now, out)

    def _reach_step(
        self,
        peer: PeerId,
        publisher: PeerId,
        stream: PublisherStream,
        now: float,
        out: list[OutEvent],
    ) -> None:
        assert stream.reach_low is not None  # a bug of ours otherwise
        delay = self._answer_wait(stream)
        stream.settling_until = now + delay
        self.counters.pulls_sent += 1
        pull = m.Pull(publisher=publisher, first_seq=stream.reach_low, last_seq=stream.next_seq - 1)
        out.append(Send(peer, self.topic, pull))
        out.append(ScheduleTimer(delay, (*self._timer_prefix, BroadcastTimer.SETTLE)))

    def _reach_unanswered(
        self,
        neighbors: list[PeerId],
        publisher: PeerId,
        stream: PublisherStream,
        now: float,
        out: list[OutEvent],
    ) -> None:
        """The reach's step stood `gap_retry_interval` without its lowest seq: asked of the
        next neighbour, each once and gap_max_attempts in all; then given up."""
        assert stream.reach_low is not None  # a bug of ours otherwise
        if stream.next_seq <= stream.reach_low and neighbors:
            # Its lowest seq came another way (a copy taken again): the next step.
            self._reach_further(neighbors[0], publisher, stream, now, out)
            return
        stream.pull_attempts += 1
        if stream.pull_attempts < min(self.config.gap_max_attempts, len(neighbors)):
            peer = neighbors[stream.pull_attempts % len(neighbors)]
            self._reach_step(peer, publisher, stream, now, out)
            return
        self.counters.reach_backs_cut += 1
        self._settle(publisher, stream, stream.next_seq, now, out)

    def _settle(
        self,
        publisher: PeerId,
        stream: PublisherStream,
        start: int,
        now: float,
        out: list[OutEvent],
    ) -> None:
        """The stream starts at `start` (at most the lowest seq held, or just above a
        message from before our join): what it holds below is history; what it holds from
        there is delivered, a gap inside it repaired as usual."""
        stream.settling_until = None
        if stream.reach_low is not None:
            self._reaching -= 1
            stream.reach_low = None
        for seq in [s for s in stream.held if s < start]:
            row = stream.held.pop(seq)
            mid, envelope, _ = self.store.message(row)
            self.store.unpin(row)
            self.counters.recovered += 1
            out.append(Recovered(self.topic, mid, envelope))
        stream.next_seq = start
        self._release_held(publisher, stream, out)
        if stream.held:  # a gap inside what arrived while settling: repair as usual
            stream.stalled_since = now
            stream.pull_attempts = 0
            self._arm_gap_timer(out)

    def _emit(self, mid: MessageId, envelope: Envelope, hops: int, out: list[OutEvent]) -> None:
        self.counters.delivered += 1
        out.append(Deliver(self.topic, mid, envelope, hops))

    def _release_held(
        self, publisher: PeerId, stream: PublisherStream, out: list[OutEvent]
    ) -> None:
        """Deliver what the stream holds from its position on, in order: its held rows,
        and up to `dropped_high` what the store holds at the places it dropped."""
        store = self.store
        held = stream.held
        while True:
            seq = stream.next_seq
            row = held.pop(seq, None)
            if row is not None:
                mid, envelope, hops = store.message(row)
                store.unpin(row)  # after reading: a row past the windows goes as it is
            elif seq <= stream.dropped_high:
                row = self._places.row(publisher, seq)
                if row is None:
                    break  # let go by the store's bounds: pulled (on_gap_timer)
                mid, envelope, hops = store.message(row)
            else:
                break
            stream.last_stamp_ms = envelope.timestamp_ms
            self._emit(mid, envelope, hops, out)
            stream.next_seq = seq + 1
        if not held and stream.dropped_high < stream.next_seq:
            stream.dropped_high = -1
            stream.stalled_since = None
            stream.pull_attempts = 0

    def _give_up(
        self, publisher: PeerId, stream: PublisherStream, upto: int, out: list[OutEvent]
    ) -> None:
        """Declare publisher's messages next_seq..upto-1 lost and move past them; `upto` is
        the first held message, so next_seq never passes one."""
        if upto <= stream.next_seq:
            return
        self.counters.data_lost += upto - stream.next_seq
        out.append(DataLost(self.topic, publisher, stream.next_seq, upto - 1))
        stream.next_seq = upto
        stream.stalled_since = None
        stream.pull_attempts = 0

    def _answer_wait(self, stream: PublisherStream) -> float:
        """How long a PULL of the stream stands before it counts as unanswered: the retry
        interval, or the age its messages arrive at if that is longer, up to
        MAX_ANSWER_WAIT. A gap is given up after gap_max_attempts of these: several times
        a round trip through queues as deep as the ones its messages came through. An
        age past MAX_ANSWER_WAIT is a clock's or a forger's, not a queue's: not counted."""
        retry = self.config.gap_retry_interval
        lag = stream.lag
        return lag if retry < lag <= MAX_ANSWER_WAIT else retry

    def _arm_gap_timer(self, out: list[OutEvent]) -> None:
        if not self._gap_armed:
            self._gap_armed = True
            token = (*self._timer_prefix, BroadcastTimer.GAP)
            out.append(ScheduleTimer(self.config.gap_retry_interval, token))

    def on_gap_timer(self, neighbors: list[PeerId], now: float, out: list[OutEvent]) -> None:
        """PULL each gap that has stood long enough from the next of `neighbors`; once its
        PULLs are spent, in-order delivery has stalled and the gap is given up."""
        self._gap_armed = False
        c = self.config
        pending = False
        for publisher, stream in self.streams.items():
            if stream.settling_until is not None or not (
                stream.held or stream.dropped_high >= stream.next_seq
            ):
                continue
            pending = True
            if stream.stalled_since is None:
                stream.stalled_since = now
            if now - stream.stalled_since < c.gap_timeout or now < stream.pull_due:
                continue  # the tree's repair, or the last PULL's answer, may still come
            end = self._gap_end(publisher, stream)
            if stream.pull_attempts < c.gap_max_attempts and neighbors:
                peer = neighbors[stream.pull_attempts % len(neighbors)]
                stream.pull_attempts += 1
                stream.pull_due = now + self._answer_wait(stream)
                last = min(end - 1, stream.next_seq + m.MAX_PULL_SPAN - 1)
                self.counters.pulls_sent += 1
                pull = m.Pull(publisher=publisher, first_seq=stream.next_seq, last_seq=last)
                out.append(Send(peer, self.topic, pull))
                continue
            if end - stream.next_seq <= c.max_gap or len(stream.held) > 1:
                # Within reach, or the stream goes on beyond the gap: resynchronise there.
                self._give_up(publisher, stream, end, out)
                self._release_held(publisher, stream, out)
                continue
            # Far beyond reach, and nothing held beyond the gap but one message (a forged
            # far seq looks like this) or a place dropped unheld: dropped and forgotten;
            # the stream stays where it is.
            for row in stream.held.values():
                self.store.unpin(row)
                self.counters.held_dropped += 1
            stream.held.clear()
            stream.dropped_high = -1
            stream.stalled_since = None
            stream.pull_attempts = 0
        if pending:
            self._arm_gap_timer(out)

    def _gap_end(self, publisher: PeerId, stream: PublisherStream) -> int:
        """The first seq past the stream's open gap: its lowest held message, or a place
        it dropped that the store still holds, whichever comes first; past the farthest
        dropped place when neither is."""
        end = min(stream.held) if stream.held else stream.dropped_high + 1
        if stream.dropped_high >= stream.next_seq:
            places = self._places.streams.get(publisher)
            found = None if places is None else places.next_held(stream.next_seq)
            if found is not None and found[0] < end:
                end = found[0]
        return end


def _within_reach(stream: PublisherStream, seq: int) -> bool:
    """Asked for by the stream's reach back, and not held yet?"""
    return (
        stream.reach_low is not None
        and stream.reach_low <= seq < stream.reach_from
        and seq not in stream.held
    )
