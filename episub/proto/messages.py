"""The messages two episub nodes exchange, as validated immutable values.

One class per message of libp2p's Episub draft (plus PING/PONG for RTT and PULL for
per-publisher gap repair). Every message but GETTOPICS/TOPICS belongs to one topic; the
topic travels beside the message (see `events.Received` and `events.Send`), never inside.

Constructors validate, the h11 way: a message that exists is well formed. Peer-controlled
counts are bounded here by `MAX_*` so that the codec and the state machines can rely on it;
the wire decoder turns a `ValueError` from these constructors into a dropped frame.

A peer is named by a `PeerId`: an opaque hashable value (`int` in the simulator, `bytes`
on the network). Addresses are not the core's business: the runtime keeps them beside ids.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable
from dataclasses import dataclass
from typing import TypeAlias, get_args

from episub.proto.envelope import MAX_HEADERS as MAX_HEADERS
from episub.proto.envelope import MAX_SEQ as MAX_SEQ
from episub.proto.envelope import MAX_TIMESTAMP_MS, Envelope
from episub.proto.envelope import PUBLIC_KEY_SIZE as PUBLIC_KEY_SIZE
from episub.proto.envelope import SIGNATURE_SIZE as SIGNATURE_SIZE
from episub.proto.envelope import Signature as Signature

PeerId: TypeAlias = Hashable
MessageId: TypeAlias = bytes

MESSAGE_ID_SIZE = 32  # blake3's default digest size.

# Hard ceilings on what one message may carry, whatever a node is configured to send.
# They exist so a hostile peer cannot make us allocate without bound; the configured
# (smaller) limits live in config.py.
MAX_TTL = 64  # walks longer than this only cost traffic; the draft's walks are ~6
MAX_PEERS_PER_MESSAGE = 256  # SHUFFLE/NODES/PONG lists; views are 7 + 42 by default
MAX_IDS_PER_MESSAGE = 4096  # messages one IHAVE or GRAFT names, over all its ranges
MAX_RANGES_PER_MESSAGE = 1024  # ranges of one IHAVE or GRAFT: a few per publisher heard
# Streams one PRUNE or GRAFT names (each a delivery tree, trees.py): a link-up or a lost
# parent touches every tree of a topic, up to max_stream_trees (1024), in a few messages.
MAX_STREAMS_PER_MESSAGE = 256
MAX_TOPICS_PER_MESSAGE = 1024
MAX_PULL_SPAN = 4096  # sequence numbers one PULL may ask for
# Messages one HISTORY carries: a PULL's answer in a few bulk messages, not one per seq.
MAX_HISTORY_MESSAGES = 1024  # guess: = fetching.FETCH_CHUNK, a fetch's chunk in one
MAX_HOPS = 1 << 16
MAX_TOPIC_NAME = 256  # bytes of UTF-8; Kafka caps topic names at 249 characters
# Publisher spans one GETHELD asks about or one HELD reports: a HELD of 256 spans of 64-byte
# publishers is ~20 KB, far below any frame limit; more publishers take more pages.
MAX_HELD_SPANS = 256
MAX_PUBLISHER_NAME = 64  # = wire.MAX_PEER_ID_SIZE: a publisher travels as a peer id


def check_topic_name(topic: str) -> None:
    """Topic names are 1..MAX_TOPIC_NAME bytes of UTF-8."""
    if not isinstance(topic, str) or not 0 < len(topic.encode()) <= MAX_TOPIC_NAME:
        raise ValueError(
            f"topic name must be a str of 1..{MAX_TOPIC_NAME} bytes of UTF-8, not {topic!r}"
        )


class LinkKind(enum.IntEnum):
    """GoCast's two kinds of active link (C_rand random + C_near nearest by RTT)."""

    RAND = 0
    NEAR = 1


class NeighborOp(enum.IntEnum):
    REQUEST = 0  # "be my neighbour"
    ACCEPT = 1  # the answer that makes the link; a refusal is a DISCONNECT


def _check_ttl(ttl: int) -> None:
    if not 0 <= ttl <= MAX_TTL:
        raise ValueError(f"ttl must be in 0..{MAX_TTL}, not {ttl!r}")


def _check_peers(peers: tuple[PeerId, ...]) -> None:
    if len(peers) > MAX_PEERS_PER_MESSAGE:
        raise ValueError(f"at most {MAX_PEERS_PER_MESSAGE} peers per message, not {len(peers)}")


def _check_nonce(nonce: int) -> None:
    if not 0 <= nonce < 1 << 64:
        raise ValueError(f"nonce must fit in 64 bits, not {nonce!r}")


def _check_id(message_id: bytes) -> None:
    if not isinstance(message_id, bytes) or len(message_id) != MESSAGE_ID_SIZE:
        raise ValueError(f"message id must be {MESSAGE_ID_SIZE} bytes, not {len(message_id)}")


# A run of one publisher's stream, as IHAVE and GRAFT name messages: (publisher, first_seq,
# last_seq, hops).
StreamRange: TypeAlias = tuple[PeerId, int, int, int]


def _check_ranges(ranges: tuple[StreamRange, ...], what: str) -> None:
    """Bounded at entry: at most MAX_RANGES_PER_MESSAGE ranges naming at most
    MAX_IDS_PER_MESSAGE messages in all, so the work one message asks for is bounded."""
    if len(ranges) > MAX_RANGES_PER_MESSAGE:
        raise ValueError(
            f"{what} carries at most {MAX_RANGES_PER_MESSAGE} ranges, not {len(ranges)}"
        )
    named = 0
    for publisher, first, last, hops in ranges:
        if isinstance(publisher, bytes):
            if not 0 < len(publisher) <= MAX_PUBLISHER_NAME:
                raise ValueError(
                    f"a range's publisher must be 1..{MAX_PUBLISHER_NAME} bytes, "
                    f"not {len(publisher)}"
                )
        elif not isinstance(publisher, int) or isinstance(publisher, bool) or publisher < 0:
            raise TypeError(f"a range's publisher must be bytes, not {publisher!r:.80}")
        if not 0 <= first <= last <= MAX_SEQ:
            raise ValueError(f"bad range {first!r}..{last!r}")
        if not 0 <= hops <= MAX_HOPS:
            raise ValueError(f"hops must be in 0..{MAX_HOPS}, not {hops!r}")
        named += last - first + 1
    if named > MAX_IDS_PER_MESSAGE:
        raise ValueError(f"{what} names at most {MAX_IDS_PER_MESSAGE} messages, not {named}")


# -- node level ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class GetTopics:
    """Which topics are you in? (draft: topic querying)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Topics:
    topics: tuple[str, ...]

    def __post_init__(self) -> None:
        if len(self.topics) > MAX_TOPICS_PER_MESSAGE:
            raise ValueError(f"at most {MAX_TOPICS_PER_MESSAGE} topics, not {len(self.topics)}")
        for topic in self.topics:
            check_topic_name(topic)


@dataclass(frozen=True, slots=True, kw_only=True)
class GetView:
    """What is your active view of this topic? (ours: lets an operator draw the overlay)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ViewEntry:
    peer: PeerId
    kind: LinkKind
    eager: bool
    rtt: float | None = None  # the sender's smoothed RTT to `peer`, seconds

    def __post_init__(self) -> None:
        if self.rtt is not None and not (0.0 <= self.rtt < 3600.0):  # as Neighbor.rtt
            raise ValueError(f"rtt must be seconds in [0, 3600), not {self.rtt!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class View:
    """Answer to GetView: the sender's active view (empty: not in the topic)."""

    entries: tuple[ViewEntry, ...]
    passive_count: int = 0

    def __post_init__(self) -> None:
        if len(self.entries) > MAX_PEERS_PER_MESSAGE:
            raise ValueError(
                f"at most {MAX_PEERS_PER_MESSAGE} view entries, not {len(self.entries)}"
            )
        if not 0 <= self.passive_count <= MAX_PEERS_PER_MESSAGE:
            raise ValueError(
                f"passive_count must be in 0..{MAX_PEERS_PER_MESSAGE}, not {self.passive_count!r}"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class HeldSpan:
    """One publisher's seqs first_seq..last_seq. Asked (GETHELD): the range to report on.
    Answered (HELD): what the sender holds within it: `count` seqs between first and last
    (count == last - first + 1: no hole), and `since_seq`, the first of them stamped at or
    after the asked `since_ms` (last_seq + 1 when none is; first_seq when none was asked)."""

    publisher: PeerId
    first_seq: int
    last_seq: int
    count: int = 0
    since_seq: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.first_seq <= self.last_seq <= MAX_SEQ:
            raise ValueError(f"bad span {self.first_seq!r}..{self.last_seq!r}")
        if not 0 <= self.count <= self.last_seq - self.first_seq + 1:
            raise ValueError(
                f"count {self.count!r} does not fit span {self.first_seq}..{self.last_seq}"
            )
        if not 0 <= self.since_seq <= self.last_seq + 1:
            raise ValueError(f"since_seq {self.since_seq!r} is past the span's end")


def _check_spans(spans: tuple[HeldSpan, ...]) -> None:
    if len(spans) > MAX_HELD_SPANS:
        raise ValueError(f"at most {MAX_HELD_SPANS} spans per message, not {len(spans)}")


@dataclass(frozen=True, slots=True, kw_only=True)
class GetHeld:
    """What do you hold of this topic (the message store's history)? `spans`:
    report on these ranges only; none: on every publisher held, in bytewise order of
    publisher, from the first after `after` (a page; HELD says if more follow). With
    `since_ms` > 0 each span also says its first seq stamped at or after it."""

    nonce: int = 0  # echoed by the HELD that answers this one
    spans: tuple[HeldSpan, ...] = ()
    after: bytes = b""
    since_ms: int = 0

    def __post_init__(self) -> None:
        _check_nonce(self.nonce)
        _check_spans(self.spans)
        if len(self.after) > MAX_PUBLISHER_NAME:
            raise ValueError(f"after is at most {MAX_PUBLISHER_NAME} bytes, not {len(self.after)}")
        if not 0 <= self.since_ms <= MAX_TIMESTAMP_MS:
            raise ValueError(f"since_ms must be a non-negative 63-bit int, not {self.since_ms!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Held:
    """Answer to GetHeld: the spans held, and whether more publishers follow this page."""

    nonce: int = 0  # the GETHELD's
    spans: tuple[HeldSpan, ...] = ()
    more: bool = False

    def __post_init__(self) -> None:
        _check_nonce(self.nonce)
        _check_spans(self.spans)


# -- membership (HyParView + GoCast) -----------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class GetNodes:
    """Ask a contact for peers of the topic before joining (draft: initial discovery)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Nodes:
    peers: tuple[PeerId, ...]

    def __post_init__(self) -> None:
        _check_peers(self.peers)


@dataclass(frozen=True, slots=True, kw_only=True)
class Join:
    """Random walk looking for a node that will take `peer` as a random neighbour."""

    peer: PeerId
    ttl: int

    def __post_init__(self) -> None:
        _check_ttl(self.ttl)


@dataclass(frozen=True, slots=True, kw_only=True)
class ForwardJoin:
    """Random walk that adds `peer` to the passive view of every node it visits."""

    peer: PeerId
    ttl: int

    def __post_init__(self) -> None:
        _check_ttl(self.ttl)


@dataclass(frozen=True, slots=True, kw_only=True)
class Neighbor:
    """Ask for, or grant, an active link.

    `high_priority` on a REQUEST means the requester holds fewer than C_rand links (or
    is answering our JOIN) and must be accepted. `rtt` is the requester's smoothed RTT
    to us, in seconds, if it has one: the receiver uses it to judge a NEAR request.
    `active_count`/`rand_count` describe the sender's view, so each side knows whether
    dropping the link later is safe.
    """

    op: NeighborOp
    kind: LinkKind
    high_priority: bool = False
    rtt: float | None = None
    active_count: int = 0
    rand_count: int = 0

    def __post_init__(self) -> None:
        if self.rtt is not None and not (0.0 <= self.rtt < 3600.0):
            raise ValueError(f"rtt must be seconds in [0, 3600), not {self.rtt!r}")
        if not (0 <= self.rand_count <= self.active_count <= MAX_PEERS_PER_MESSAGE):
            raise ValueError(
                f"need 0 <= rand_count <= active_count <= {MAX_PEERS_PER_MESSAGE}, "
                f"not {self.rand_count!r}, {self.active_count!r}"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class Disconnect:
    """Drop the active link. `alive` says the sender stays in the overlay (keep it passive)."""

    alive: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class Leave:
    """`peer` left the topic: forget it everywhere; diffused eagerly with a TTL."""

    peer: PeerId
    ttl: int

    def __post_init__(self) -> None:
        _check_ttl(self.ttl)


@dataclass(frozen=True, slots=True, kw_only=True)
class Shuffle:
    """Passive-view exchange started by `origin`, carried by a random walk. `nonce` is the
    origin's random number: the one reply it takes echoes it."""

    origin: PeerId
    ttl: int
    peers: tuple[PeerId, ...]
    nonce: int = 0

    def __post_init__(self) -> None:
        _check_ttl(self.ttl)
        _check_peers(self.peers)
        _check_nonce(self.nonce)


@dataclass(frozen=True, slots=True, kw_only=True)
class ShuffleReply:
    """The walk's end answers the origin with its passive sample, echoing the nonce."""

    peers: tuple[PeerId, ...]
    nonce: int = 0

    def __post_init__(self) -> None:
        _check_peers(self.peers)
        _check_nonce(self.nonce)


@dataclass(frozen=True, slots=True, kw_only=True)
class Ping:
    """RTT probe and liveness check; `want_view` asks the Pong to list the active view."""

    nonce: int
    want_view: bool = False

    def __post_init__(self) -> None:
        _check_nonce(self.nonce)


@dataclass(frozen=True, slots=True, kw_only=True)
class Pong:
    """Answer to a Ping. `subscribed` is False when the sender is not in the topic;
    `not_neighbor` is True when the sender's active view does not hold the receiver (how
    a link left one-sided by a lost NEIGHBOR accept or DISCONNECT is found; False, the
    protobuf default, says nothing)."""

    nonce: int
    subscribed: bool = True
    active_count: int = 0
    rand_count: int = 0
    active: tuple[PeerId, ...] = ()
    not_neighbor: bool = False

    def __post_init__(self) -> None:
        _check_nonce(self.nonce)
        _check_peers(self.active)
        if not (0 <= self.rand_count <= self.active_count <= MAX_PEERS_PER_MESSAGE):
            raise ValueError(
                f"need 0 <= rand_count <= active_count <= {MAX_PEERS_PER_MESSAGE}, "
                f"not {self.rand_count!r}, {self.active_count!r}"
            )


# -- broadcast (Plumtree) ----------------------------------------------------------------


class Gossip:
    """Eager push of one message. `hops` counts links travelled: 1 from the publisher.

    The envelope travels as its canonical bytes (`raw`, envelope.py). A GOSSIP read off the
    wire (`from_wire`) holds only those bytes until its `envelope` is asked for, on its
    first receipt: a duplicate is never decoded. `forwarded` makes the copy a node passes
    on, sharing the bytes. Immutable by convention; equal when id, bytes and hops are."""

    __slots__ = ("_envelope", "hops", "id", "raw")

    id: MessageId
    hops: int
    raw: bytes
    _envelope: Envelope | None

    def __init__(self, *, id: MessageId, envelope: Envelope, hops: int) -> None:
        _check_id(id)
        if not isinstance(hops, int) or not 0 <= hops <= MAX_HOPS:
            raise ValueError(f"hops must be in 0..{MAX_HOPS}, not {hops!r}")
        if not isinstance(envelope, Envelope):
            raise TypeError(f"envelope must be an Envelope, not {type(envelope).__name__}")
        self.id = id
        self.hops = hops
        self.raw = envelope.raw
        self._envelope = envelope

    @classmethod
    def from_wire(cls, id: MessageId, raw: bytes, hops: int) -> Gossip:
        """A GOSSIP whose id size and hop bound the wire decoder has checked."""
        gossip = cls.__new__(cls)
        gossip.id = id
        gossip.hops = hops
        gossip.raw = raw
        gossip._envelope = None
        return gossip

    @property
    def envelope(self) -> Envelope:
        """The decoded envelope; ValueError when the bytes are not a canonical one."""
        envelope = self._envelope
        if envelope is None:
            envelope = self._envelope = Envelope.decode(self.raw)
        return envelope

    def forwarded(self, hops: int) -> Gossip:
        """This message as sent on with `hops`, sharing id, bytes and decoded envelope."""
        gossip = Gossip.__new__(Gossip)
        gossip.id = self.id
        gossip.hops = hops
        gossip.raw = self.raw
        gossip._envelope = self._envelope
        return gossip

    def __eq__(self, other: object) -> bool:
        if type(other) is not Gossip:
            return NotImplemented
        return self.id == other.id and self.hops == other.hops and self.raw == other.raw

    def __hash__(self) -> int:
        return hash((self.id, self.hops))

    def __repr__(self) -> str:
        return f"Gossip(id={self.id.hex()[:16]}..., envelope={self.envelope!r}, hops={self.hops})"


@dataclass(frozen=True, slots=True, kw_only=True)
class IHave:
    """Batched lazy-push announcements, as runs of publishers' streams: each range is
    (publisher, first_seq, last_seq, hops at which the announcer received them). A burst
    a node relays in one flush interval is one range per publisher, not an id per message.
    """

    ranges: tuple[StreamRange, ...]

    def __post_init__(self) -> None:
        if not self.ranges:
            raise ValueError("IHAVE carries at least one range")
        _check_ranges(self.ranges, "IHAVE")


def _check_streams(streams: tuple[PeerId, ...], what: str) -> None:
    """At most MAX_STREAMS_PER_MESSAGE publishers, each a valid publisher name."""
    if len(streams) > MAX_STREAMS_PER_MESSAGE:
        raise ValueError(
            f"{what} names at most {MAX_STREAMS_PER_MESSAGE} streams, not {len(streams)}"
        )
    for publisher in streams:
        if isinstance(publisher, bytes):
            if not 0 < len(publisher) <= MAX_PUBLISHER_NAME:
                raise ValueError(
                    f"a stream's publisher must be 1..{MAX_PUBLISHER_NAME} bytes, "
                    f"not {len(publisher)}"
                )
        elif not isinstance(publisher, int) or isinstance(publisher, bool) or publisher < 0:
            raise TypeError(f"a stream's publisher must be bytes, not {publisher!r:.80}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Graft:
    """Move me to your eager set for the streams of these ranges (publisher, first_seq,
    last_seq, hops unused: 0) and send me their messages, and for the `streams` named
    (ours: a delivery tree per publisher); neither: for every stream, the whole link."""

    ranges: tuple[StreamRange, ...] = ()
    streams: tuple[PeerId, ...] = ()

    def __post_init__(self) -> None:
        _check_ranges(self.ranges, "GRAFT")
        _check_streams(self.streams, "GRAFT")


@dataclass(frozen=True, slots=True, kw_only=True)
class Heads:
    """The last place the sender holds of each stream that went quiet (ours, not in the
    draft): one range (publisher, seq, seq, hops it came at) per stream. A receiver behind
    a head GRAFTs what it lacks up to it, as after an IHAVE (heads.py, broadcast.py).
    Bounded as an IHAVE is: at most MAX_RANGES_PER_MESSAGE heads."""

    ranges: tuple[StreamRange, ...]

    def __post_init__(self) -> None:
        if not self.ranges:
            raise ValueError("HEADS carries at least one head")
        _check_ranges(self.ranges, "HEADS")
        for _, first, last, _ in self.ranges:
            if first != last:
                raise ValueError(f"a head names one seq, not {first!r}..{last!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Prune:
    """Move me to your lazy set for the `streams` named (ours: a delivery tree per
    publisher); none: for every stream, the whole link."""

    streams: tuple[PeerId, ...] = ()

    def __post_init__(self) -> None:
        _check_streams(self.streams, "PRUNE")


@dataclass(frozen=True, slots=True, kw_only=True)
class Pull:
    """Per-publisher gap repair: send me `publisher`'s messages first_seq..last_seq."""

    publisher: PeerId
    first_seq: int
    last_seq: int

    def __post_init__(self) -> None:
        if not 0 <= self.first_seq <= self.last_seq <= MAX_SEQ:
            raise ValueError(f"bad range {self.first_seq!r}..{self.last_seq!r}")
        if self.last_seq - self.first_seq + 1 > MAX_PULL_SPAN:
            raise ValueError(f"a PULL spans at most {MAX_PULL_SPAN} sequence numbers")


@dataclass(frozen=True, slots=True, kw_only=True)
class History:
    """An answer to a PULL in bulk (ours): consecutive stored messages of one publisher,
    each as its envelope's canonical bytes and the hops it is passed on with, seqs rising.
    No ids travel: the receiver computes each id from the bytes (broadcast.py checks each
    envelope as it checks a GOSSIP's). At most MAX_HISTORY_MESSAGES; the sender keeps the
    bytes within one frame."""

    publisher: PeerId
    envelopes: tuple[bytes, ...]
    hops: tuple[int, ...]

    def __post_init__(self) -> None:
        _check_streams((self.publisher,), "HISTORY")
        if not 0 < len(self.envelopes) <= MAX_HISTORY_MESSAGES:
            raise ValueError(
                f"HISTORY carries 1..{MAX_HISTORY_MESSAGES} messages, not {len(self.envelopes)}"
            )
        if len(self.hops) != len(self.envelopes):
            raise ValueError(
                f"HISTORY has {len(self.envelopes)} messages and {len(self.hops)} hops"
            )
        if not all(0 < hops <= MAX_HOPS for hops in self.hops):
            raise ValueError(f"HISTORY hops must be in 1..{MAX_HOPS}")


MembershipMessage: TypeAlias = (
    GetNodes
    | Nodes
    | Join
    | ForwardJoin
    | Neighbor
    | Disconnect
    | Leave
    | Shuffle
    | ShuffleReply
    | Ping
    | Pong
)
BroadcastMessage: TypeAlias = Gossip | IHave | Prune | Graft | Pull | Heads | History
TopicMessage: TypeAlias = MembershipMessage | BroadcastMessage
NodeMessage: TypeAlias = GetTopics | Topics
ViewMessage: TypeAlias = GetView | View  # topic-level, answered by the node (node.py)
# Topic-level, answered by the node from its message store (node.py, store.py), joined or not.
HeldMessage: TypeAlias = GetHeld | Held
# Anything a peer may send us, on the wire as one item of a frame (wire.py).
PeerMessage: TypeAlias = TopicMessage | NodeMessage | ViewMessage | HeldMessage

# The unions as tuples of classes, for isinstance and `type(x) in` dispatch: derived here,
# never written out again, so a kind added to a union reaches every dispatch on it (and
# each dispatch's `assert_never` fails loudly in tests until the kind is handled there).
MEMBERSHIP_MESSAGES: tuple[type[MembershipMessage], ...] = get_args(MembershipMessage)
BROADCAST_MESSAGES: tuple[type[BroadcastMessage], ...] = get_args(BroadcastMessage)
TOPIC_MESSAGES: tuple[type[TopicMessage], ...] = get_args(TopicMessage)
NODE_MESSAGES: tuple[type[NodeMessage], ...] = get_args(NodeMessage)
PEER_MESSAGES: tuple[type[PeerMessage], ...] = get_args(PeerMessage)
