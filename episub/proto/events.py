"""What goes into the core and what comes out of it.

There is one way in, `NodeState.handle(event, now)`, and it returns a list of outputs
(iroh-gossip's InEvent/OutEvent; h11's "bytes in, events out"). The caller (the trio
runtime or the simulator) carries out the outputs: sends, timers, deliveries.

`now` is seconds on any monotonic clock the caller likes; the core only subtracts.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import TypeAlias

from episub.proto.envelope import Record, check_given_stamp, check_stream_seq
from episub.proto.errors import MessageTooLarge, OwnStreamNamed, too_large
from episub.proto.messages import (
    Envelope,
    GetHeld,
    Held,
    LinkKind,
    MessageId,
    PeerId,
    PeerMessage,
    View,
)

# -- in ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Received:
    """A decoded message from `peer`; `topic` is None for node-level messages."""

    peer: PeerId
    topic: str | None
    message: PeerMessage


@dataclass(frozen=True, slots=True)
class ReceivedMany:
    """The decoded messages of one read from `peer`, in order, as one input: each as
    `Received` would be, their outputs together (one wakeup's worth of a burst)."""

    peer: PeerId
    items: Sequence[tuple[str | None, PeerMessage]]


@dataclass(frozen=True, slots=True)
class TimerFired:
    """A timer the core asked for with `ScheduleTimer` has expired."""

    token: Hashable


@dataclass(frozen=True, slots=True)
class ConnectionLost:
    """The connection to `peer` closed, or dialling it failed: the peer is unreachable."""

    peer: PeerId


@dataclass(frozen=True, slots=True)
class RttMeasured:
    """The transport's own round-trip time to `peer` in seconds (the runtime reads the
    kernel's, TCP_INFO): an RTT sample like a PONG's, without a PING."""

    peer: PeerId
    rtt: float


@dataclass(frozen=True, slots=True)
class AnswersDrained:
    """`peer` has read the answers it asked for (the runtime's lane for it emptied): the
    core sends the next batch of what it asked, if any waits (answers.py)."""

    peer: PeerId


@dataclass(frozen=True, slots=True)
class AnswersCancelled:
    """`peer`'s connection went: what it asked for and was not sent yet is not made."""

    peer: PeerId


@dataclass(frozen=True, slots=True)
class JoinTopic:
    """Command: subscribe to `topic`, entering through any of the `bootstrap` peers.

    An empty `bootstrap` starts a new overlay that others may join through us. The
    input's `now` is the join time: what publishers stamp later is delivered, even if it
    was published before this node had a link (ordering.py's reach back). `retain=False`:
    the topic's messages are delivered and answer GRAFTs and PULLs, but the core's store
    (store.py) offers them as no history, for state that catches up otherwise
    (configuration replicas, by snapshot).
    """

    topic: str
    bootstrap: tuple[PeerId, ...] = ()
    retain: bool = True


@dataclass(frozen=True, slots=True)
class LeaveTopic:
    """Command: unsubscribe, telling the neighbours (LEAVE) so they forget us at once."""

    topic: str


@dataclass(frozen=True, slots=True)
class Publish:
    """Command: publish one message; the core stamps publisher, sequence and timestamp.

    With `stream` = (publisher, seq) the message takes that place in a stream named by the
    caller instead of the node's own (a Spark sink row, whose identity must not depend on
    which executor or attempt writes it). A place that is filled already publishes nothing:
    the core reports `AlreadyPublished` instead of `Published`.
    """

    topic: str
    payload: bytes
    key: bytes | None = None
    headers: tuple[tuple[str, bytes], ...] = ()
    stream: tuple[PeerId, int] | None = None
    # A named stream's place may carry the caller's stamp instead of the clock's, so that
    # a place written twice (a retried Spark task) is the same message, byte for byte.
    timestamp_ms: int | None = None

    def __post_init__(self) -> None:
        # Record's rules for a place and its stamp; a publisher is any peer id here.
        if self.timestamp_ms is not None:
            check_given_stamp(self.timestamp_ms, named=self.stream is not None)
        if self.stream is not None:
            publisher, seq = self.stream
            check_stream_seq(seq)
            if publisher is None:
                raise ValueError("a stream needs a publisher")


@dataclass(frozen=True, slots=True)
class PublishMany:
    """Command: publish `records` in order, as one input (one core call, all the outputs
    together); each as `Publish` would. All or none: a record too large, or naming this
    node's own stream, refuses the whole batch before anything is published. The records
    were checked when they were made (envelope.Record) and are trusted here."""

    topic: str
    records: tuple[Record, ...]


def check_publish_batch(records: Sequence[Record], me: PeerId, limit: int, topic: str) -> None:
    """PublishMany's rule, all or none, for the core and for a node's API that splits a
    batch into inputs: MessageTooLarge for a record over `limit` bytes (naming it),
    OwnStreamNamed for one whose place is in `me`'s own stream."""
    count = len(records)
    for i, record in enumerate(records):
        if record.stream is not None and record.stream[0] == me:
            raise OwnStreamNamed("this node's own stream is numbered by the node: name another")
        if record.size > limit:
            where = f"record {i} of {count}: " if count > 1 else ""
            raise MessageTooLarge(where + too_large(record.size, limit, topic))


@dataclass(frozen=True, slots=True)
class Fetch:
    """Command: ask `peer` for `publisher`'s messages first_seq..last_seq of a joined topic
    (PULL), to fill this node's history; what comes back behind the stream's position is
    reported as `Recovered`, and nothing of it is forwarded or delivered again."""

    topic: str
    peer: PeerId
    publisher: PeerId
    first_seq: int
    last_seq: int

    def __post_init__(self) -> None:
        if not 0 <= self.first_seq <= self.last_seq:
            raise ValueError(
                f"need 0 <= first_seq <= last_seq, not {self.first_seq!r}..{self.last_seq!r}"
            )


@dataclass(frozen=True, slots=True)
class AskView:
    """Command: ask `peer` (any node, neighbour or not) for its active view of `topic`
    (GETVIEW); the answer comes out as `ViewReport`. For operators' tools, not the protocol."""

    topic: str
    peer: PeerId


@dataclass(frozen=True, slots=True)
class AskHeld:
    """Command: ask `peer` (any node, neighbour or not) what it holds of `topic` (GETHELD);
    the answer comes out as `HeldReport`."""

    topic: str
    peer: PeerId
    query: GetHeld


@dataclass(frozen=True, slots=True)
class AskTopics:
    """Command: ask `peer` which topics it is in (GETTOPICS); the answer comes out as
    `TopicsReport`."""

    peer: PeerId


@dataclass(frozen=True, slots=True)
class RefreshContacts:
    """Command: the peer ids `topic`'s bootstrap addresses answer with now (a contact that
    restarted has a new id), for a node that lost every neighbour (`Isolated`): they
    replace the contacts given at join, and are asked for peers at once."""

    topic: str
    bootstrap: tuple[PeerId, ...]


InEvent: TypeAlias = (
    Received
    | ReceivedMany
    | TimerFired
    | ConnectionLost
    | AnswersDrained
    | AnswersCancelled
    | RttMeasured
    | JoinTopic
    | LeaveTopic
    | Publish
    | PublishMany
    | Fetch
    | AskView
    | AskHeld
    | AskTopics
    | RefreshContacts
)

# -- out --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Send:
    """Send `message` to `peer` (dialling it if there is no connection yet).

    `answer`: what `peer` asked for (a PULL's or a GRAFT's messages, history, HELD): the
    runtime sends it as the peer reads and within its budget, and not at all once the
    peer's connection is gone. A hint, like ScheduleTimer's: no part of equality."""

    peer: PeerId
    topic: str | None
    message: PeerMessage
    answer: bool = field(default=False, compare=False)


@dataclass(frozen=True, slots=True)
class ScheduleTimer:
    """Call `handle(TimerFired(token))` after `delay` seconds. Timers are never cancelled:
    a stale one finds nothing to do when it fires.

    Hints to the runtime on when a wakeup may be saved (a wakeup of an idle process costs
    more CPU than most of what it then does). They are not part of what the timer is: they
    take no part in equality, and the simulator fires every timer at `delay`.

    `coalesce`: the timer may fire a little late, together with other such timers of this
    node and of other nodes (the runtime rounds it up to a shared tick). For upkeep whose
    timing does not matter to the protocol (pings, probes); never for timers whose
    decisions must not line up across nodes (optimisation, stabilisation, shuffles).

    `upkeep`: the timer may fire a little late, together with this node's other upkeep
    (the runtime rounds it up to a tick of the node's own, at a phase of its own), so a
    node wakes once per tick for all of it. For periodic upkeep whose decisions must not
    line up across nodes (optimisation, stabilisation, shuffles).

    `early`: the timer may fire up to this many seconds before `delay`, when the node is
    awake for a message anyway (the IHAVE flush: a node that receives messages flushes
    while it handles one, and its neighbours, which got the same message about then, read
    the IHAVE in the same wakeup, instead of one wakeup each for the timer and the IHAVE)."""

    delay: float
    token: Hashable
    coalesce: bool = field(default=False, compare=False)
    upkeep: bool = field(default=False, compare=False)
    early: float = field(default=0.0, compare=False)


@dataclass(frozen=True, slots=True)
class AlreadyPublished:
    """A `Publish` with a stream place that was taken: nothing was sent or delivered.
    `id` is the message that holds the place, when the store still holds it (else None)."""

    topic: str
    publisher: PeerId
    seq: int
    id: MessageId | None


@dataclass(frozen=True, slots=True)
class Recovered:
    """A message that came back (by PULL) from behind its stream's position here: it was
    delivered before this node joined, or given up as lost. For history (the store,
    store.py) only: it is not delivered to the application, and not forwarded."""

    topic: str
    id: MessageId
    envelope: Envelope


@dataclass(frozen=True, slots=True)
class Deliver:
    """A message for the application: each id at most once, each publisher in order."""

    topic: str
    id: MessageId
    envelope: Envelope
    hops: int


@dataclass(frozen=True, slots=True)
class Published:
    """Our own publish was accepted: the id and sequence number it was given."""

    topic: str
    id: MessageId
    envelope: Envelope


@dataclass(frozen=True, slots=True)
class NeighborUp:
    topic: str
    peer: PeerId
    kind: LinkKind


@dataclass(frozen=True, slots=True)
class NeighborDown:
    topic: str
    peer: PeerId


@dataclass(frozen=True, slots=True)
class Isolated:
    """`topic` has no neighbour and no passive peer left: the core is asking its contacts
    and every peer it remembers for a way back in, with backoff, and says so at each
    attempt. The runtime may dial the bootstrap addresses again and hand the ids they
    answer with back as `RefreshContacts`."""

    topic: str
    attempt: int  # 1 for the first attempt since the node was last linked


@dataclass(frozen=True, slots=True)
class ClosePeer:
    """No topic needs `peer` any more: the runtime may close the connection."""

    peer: PeerId


@dataclass(frozen=True, slots=True)
class DataLost:
    """Messages first_seq..last_seq of `publisher` were given up on: nobody we asked had them."""

    topic: str
    publisher: PeerId
    first_seq: int
    last_seq: int


@dataclass(frozen=True, slots=True)
class PeerMisbehaved:
    """`peer` sent something the protocol forbids; it was ignored. For logs and counters."""

    peer: PeerId
    reason: str


@dataclass(frozen=True, slots=True)
class ViewReport:
    """`peer` answered a GETVIEW of `topic` with `view` (an `AskView` of ours, or not)."""

    topic: str
    peer: PeerId
    view: View


@dataclass(frozen=True, slots=True)
class HeldQueried:
    """`peer` asked what we hold of `topic` (GETHELD), and the core answered it from its
    store: news for the node, whose catch-up with a neighbour may start from it."""

    topic: str
    peer: PeerId


@dataclass(frozen=True, slots=True)
class HeldReport:
    """`peer` answered a GETHELD of `topic` with `held`."""

    topic: str
    peer: PeerId
    held: Held


@dataclass(frozen=True, slots=True)
class TopicsReport:
    """`peer` answered a GETTOPICS with the topics it is in."""

    peer: PeerId
    topics: tuple[str, ...]


# What the runtime hands up to the node (episub.node) after carrying out the rest: sends,
# timers, closes and misbehaviour reports are the runtime's own business.
AppEvent: TypeAlias = (
    Deliver
    | Published
    | AlreadyPublished
    | Recovered
    | NeighborUp
    | NeighborDown
    | Isolated
    | DataLost
    | ViewReport
    | HeldQueried
    | HeldReport
    | TopicsReport
)

OutEvent: TypeAlias = Send | ScheduleTimer | ClosePeer | PeerMisbehaved | AppEvent
