"""Per-publisher ordered delivery for one topic: streams, held messages and gap repair.

Broadcast (broadcast.py) decides which copy of a message is the first; it hands each first
copy here, and this machine decides when the application gets it. It owns no cache: PULLs
that peers send us are answered by broadcast.py from its cache.

Rules this machine keeps:
- The application gets each publisher's messages in sequence order, each once: a message
  that arrives early is held until the gap before it is filled or given up (DataLost).
- The first message we see of a publisher opens its stream. Where the stream starts is
  fixed only after `stream_settle` (nothing comes before seq 0), so an earlier message
  that the first one overtook is still delivered, in order.
- A message from before its stream's position is history: kept by broadcast, not
  delivered again (`behind_stream`).
- A gap is pulled (PULL first..last) from the neighbours in turn, every
  `gap_retry_interval` once it is `gap_timeout` old; after `gap_max_attempts`, or with no
  neighbour to ask, it is given up and what it held back is delivered. At once, too,
  for a message more than `max_gap` ahead (what lies beyond pulling reach is lost) and
  when `max_held_per_publisher` messages are held already (the gap before them is).
- Every table a peer can grow is bounded: held messages per publisher, publishers (the
  least recently active idle stream is forgotten to make room), fetched spans
  (`max_fetches`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass, field

from episub.proto import messages as m
from episub.proto.config import BroadcastConfig
from episub.proto.events import DataLost, Deliver, OutEvent, PeerMisbehaved, ScheduleTimer, Send
from episub.proto.messages import Envelope, MessageId, PeerId
from episub.proto.tables import BroadcastCounters


@dataclass(slots=True)
class PublisherStream:
    """Ordered delivery state for one publisher."""

    next_seq: int  # the next sequence number the application gets
    held: dict[int, tuple[MessageId, Envelope, int]] = field(default_factory=dict)
    settling_until: float | None = None  # while set, where the stream starts is not fixed
    gap_since: float | None = None
    pull_attempts: int = 0


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
    ) -> None:
        self.topic = topic
        self.config = config
        self._timer_prefix = timer_prefix
        self.counters = counters
        self.streams: dict[PeerId, PublisherStream] = {}
        # publisher -> the last span we fetched of it, oldest first; bounded by max_fetches.
        self.fetches: OrderedDict[PeerId, tuple[int, int]] = OrderedDict()
        self._gap_armed = False

    # -- queries ------------------------------------------------------------------------

    def place_taken(self, publisher: PeerId, seq: int) -> bool:
        """Is (publisher, seq) delivered here already, or held waiting for a gap?"""
        stream = self.streams.get(publisher)
        if stream is None:
            return False
        return seq < stream.next_seq or seq in stream.held

    def behind_stream(self, envelope: Envelope) -> bool:
        """Is this message history for us: from before where its stream starts? While the
        stream settles, so is anything more than max_gap below the lowest seq seen (it will
        not be held for delivery), such as the answers to a fetch made right after joining."""
        stream = self.streams.get(envelope.publisher)
        if stream is None or envelope.seq in stream.held:
            return False
        if stream.settling_until is not None:
            return envelope.seq < stream.next_seq - self.config.max_gap
        return envelope.seq < stream.next_seq

    def fetched(self, envelope: Envelope) -> bool:
        """Does this message fall in the last span we fetched of its publisher?"""
        span = self.fetches.get(envelope.publisher)
        return span is not None and span[0] <= envelope.seq <= span[1]

    # -- commands -----------------------------------------------------------------------

    def fetch(
        self, peer: PeerId, publisher: PeerId, first: int, last: int, out: list[OutEvent]
    ) -> None:
        """PULL first..last of `publisher` from `peer`, in spans the wire allows."""
        self.fetches.pop(publisher, None)
        self.fetches[publisher] = (first, last)
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
        if (
            stream is not None
            and seq == stream.next_seq
            and not stream.held
            and stream.settling_until is None
        ):
            # The next in sequence, nothing held: what nearly every message is.
            streams[publisher] = stream
            stream.next_seq = seq + 1
            self.counters.delivered += 1
            out.append(Deliver(self.topic, mid, envelope, hops))
            return
        c = self.config
        if stream is None:
            if len(self.streams) >= c.max_publishers and not self._evict_idle_stream():
                out.append(PeerMisbehaved(envelope.publisher, "too many publishers on this topic"))
                return
            # The first message we see of a publisher opens its stream; where the stream
            # starts is fixed only after `stream_settle`, so an earlier message that the
            # first one overtook is still delivered, in order. Nothing comes before seq 0.
            settles = c.stream_settle > 0 and envelope.seq > 0
            stream = PublisherStream(
                next_seq=envelope.seq, settling_until=now + c.stream_settle if settles else None
            )
            if settles:
                out.append(ScheduleTimer(c.stream_settle, (*self._timer_prefix, "settle")))
        # Re-inserted on every message: `streams` runs from least to most recently active.
        streams[publisher] = stream
        if stream.settling_until is not None:
            if seq not in stream.held and seq >= stream.next_seq - c.max_gap:
                stream.held[seq] = (mid, envelope, hops)
                stream.next_seq = min(stream.next_seq, seq)
            return
        if seq < stream.next_seq or seq in stream.held:
            return  # delivered already, or from before we joined
        if seq - stream.next_seq > c.max_gap:
            # Too far ahead to pull what lies between: report it lost and resynchronise.
            self._give_up(publisher, stream, seq - c.max_gap, out)
        if seq > stream.next_seq and len(stream.held) >= c.max_held_per_publisher:
            # No room to wait for the gap: give it up and deliver what is held.
            self._give_up(publisher, stream, min(stream.held), out)
            self._release_held(publisher, stream, out)
        # Every message goes through `held`: releasing delivers it, and what it unblocks,
        # when it is the next in sequence; otherwise it waits for the gap before it.
        stream.held[seq] = (mid, envelope, hops)
        self._release_held(publisher, stream, out)
        if stream.held and stream.gap_since is None:
            stream.gap_since = now
            stream.pull_attempts = 0
            self._arm_gap_timer(out)

    def _evict_idle_stream(self) -> bool:
        """Forget the least recently active stream that holds nothing, to make room for a
        new publisher. A publisher's streams come and go (a node restarts under a new id, a
        Spark sink writes each partition of each batch as a stream of its own), so a full
        table evicts instead of refusing; a forgotten publisher that sends again starts a
        new stream where it stands. False when every stream is waiting for a gap."""
        for publisher, stream in self.streams.items():
            if not stream.held and stream.settling_until is None:
                del self.streams[publisher]
                self.counters.streams_evicted += 1
                return True
        return False

    def on_settle_timer(self, now: float, out: list[OutEvent]) -> None:
        """Fix where each settled stream starts, and deliver what it holds from there."""
        for publisher, stream in self.streams.items():
            if stream.settling_until is None or stream.settling_until > now:
                continue
            stream.settling_until = None
            stream.next_seq = min(stream.held, default=stream.next_seq)
            self._release_held(publisher, stream, out)
            if stream.held:  # a gap inside what arrived while settling: repair as usual
                stream.gap_since = now
                self._arm_gap_timer(out)

    def _emit(self, mid: MessageId, envelope: Envelope, hops: int, out: list[OutEvent]) -> None:
        self.counters.delivered += 1
        out.append(Deliver(self.topic, mid, envelope, hops))

    def _release_held(
        self, publisher: PeerId, stream: PublisherStream, out: list[OutEvent]
    ) -> None:
        while stream.next_seq in stream.held:
            mid, envelope, hops = stream.held.pop(stream.next_seq)
            self._emit(mid, envelope, hops, out)
            stream.next_seq += 1
        if not stream.held:
            stream.gap_since = None
            stream.pull_attempts = 0

    def _give_up(
        self, publisher: PeerId, stream: PublisherStream, upto: int, out: list[OutEvent]
    ) -> None:
        """Declare publisher's messages next_seq..upto-1 lost and move past them."""
        if upto <= stream.next_seq:
            return
        self.counters.data_lost += upto - stream.next_seq
        out.append(DataLost(self.topic, publisher, stream.next_seq, upto - 1))
        stream.next_seq = upto
        stream.gap_since = None
        stream.pull_attempts = 0

    def _arm_gap_timer(self, out: list[OutEvent]) -> None:
        if not self._gap_armed:
            self._gap_armed = True
            out.append(ScheduleTimer(self.config.gap_retry_interval, (*self._timer_prefix, "gap")))

    def on_gap_timer(self, neighbors: list[PeerId], now: float, out: list[OutEvent]) -> None:
        """PULL each gap old enough from the next of `neighbors`, or give it up."""
        self._gap_armed = False
        c = self.config
        pending = False
        for publisher, stream in self.streams.items():
            if not stream.held or stream.settling_until is not None:
                continue
            pending = True
            if stream.gap_since is None:
                stream.gap_since = now
            if now - stream.gap_since < c.gap_timeout:
                continue
            first_held = min(stream.held)
            if stream.pull_attempts >= c.gap_max_attempts or not neighbors:
                self._give_up(publisher, stream, first_held, out)
                self._release_held(publisher, stream, out)
                continue
            peer = neighbors[stream.pull_attempts % len(neighbors)]
            stream.pull_attempts += 1
            last = min(first_held - 1, stream.next_seq + m.MAX_PULL_SPAN - 1)
            self.counters.pulls_sent += 1
            out.append(
                Send(
                    peer,
                    self.topic,
                    m.Pull(publisher=publisher, first_seq=stream.next_seq, last_seq=last),
                )
            )
        if pending:
            self._arm_gap_timer(out)
