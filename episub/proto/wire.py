"""The wire codec: message dataclasses to length-prefixed protobuf frames and back.

Sans-IO in h11's manner: `encode_frame` returns bytes to send, and a `FrameDecoder` is fed
whatever bytes arrived and hands back whole frames. Nothing here touches a socket or a clock,
so the runtime, the tests and a fuzzer all drive the very same code.

A frame is a 4-byte big-endian length, then a protobuf `Frame` (episub.proto) of items, each
a message tagged with its topic (none for the node-level GETTOPICS/TOPICS).

Rules the decoder keeps, because every byte it sees is chosen by a peer:

- A header announcing more than `max_frame_size` is refused from its 4 bytes alone, and the
  bytes of an unfinished frame held here never exceed `max_frame_size + 4`.
- Whatever is wrong with a frame (framing, protobuf, a bound, a value a message constructor
  rejects) raises `FrameError`, and nothing else. The stream cannot be resynchronised after
  that, so the decoder refuses all further use and the connection is meant to be dropped.
- Complete frames that preceded a bad one are still handed out first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from google.protobuf.message import DecodeError

from episub.proto import episub_pb2 as pb
from episub.proto import messages as _messages
from episub.proto.envelope import read_varint, varint
from episub.proto.framing import (
    LENGTH_PREFIX_SIZE,
    MAX_ENCODABLE_FRAME,
    FrameError,
    FrameSplitter,
    frame,
)
from episub.proto.messages import (
    MAX_HISTORY_MESSAGES,
    MAX_HOPS,
    MAX_RANGES_PER_MESSAGE,
    MAX_STREAMS_PER_MESSAGE,
    MESSAGE_ID_SIZE,
    Disconnect,
    ForwardJoin,
    GetHeld,
    GetNodes,
    GetTopics,
    GetView,
    Gossip,
    Graft,
    Heads,
    Held,
    HeldSpan,
    History,
    IHave,
    Join,
    Leave,
    LinkKind,
    Neighbor,
    NeighborOp,
    Nodes,
    PeerId,
    PeerMessage,
    Ping,
    Pong,
    Prune,
    Pull,
    Shuffle,
    ShuffleReply,
    StreamRange,
    Topics,
    View,
    ViewEntry,
)

__all__ = [
    "LENGTH_PREFIX_SIZE",
    "MAX_ITEMS_PER_FRAME",
    "MAX_PEER_ID_SIZE",
    "MAX_TOPIC_NAME",
    "FrameDecoder",
    "FrameError",
    "encode_frame",
    "encode_item",
    "frame_from_items",
]


# libp2p's multihash peer ids of an inlined Ed25519 key are 38 bytes and a sha2-256 multihash
# 34; 64 covers both with room for a raw public key or a 512-bit digest.
MAX_PEER_ID_SIZE = 64
# Topic names: the bound lives beside the messages (Kafka caps its own at 249 characters).
MAX_TOPIC_NAME = _messages.MAX_TOPIC_NAME
# Default cap on items per frame: piggybacking batches a few control messages per tick, far
# below this; it bounds the work one frame can cause whatever the frame size allows.
MAX_ITEMS_PER_FRAME = 1024

# A bad value quoted in an error is cut to this many characters, so that a megabyte of
# garbage does not end up in a log line.
_MAX_SHOWN = 80


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 3] + "..."


# -- peer ids and topics ----------------------------------------------------------------


def _peer_to_pb(peer: PeerId) -> bytes:
    if isinstance(peer, int):
        raise TypeError(
            f"peer ids on the wire must be bytes; int ids exist only in the simulator, not {peer!r}"
        )
    if not isinstance(peer, bytes):
        raise TypeError(f"peer id must be bytes, not {_show(peer)}")
    if not 0 < len(peer) <= MAX_PEER_ID_SIZE:
        raise ValueError(f"peer id must be 1..{MAX_PEER_ID_SIZE} bytes, not {len(peer)}")
    return peer


def _peer_from_pb(raw: bytes) -> bytes:
    if not 0 < len(raw) <= MAX_PEER_ID_SIZE:
        raise FrameError(
            f"peer id must be 1..{MAX_PEER_ID_SIZE} bytes, not {len(raw)}: {_show(raw)}"
        )
    return raw


def _peers_to_pb(peers: Sequence[PeerId]) -> list[bytes]:
    return [_peer_to_pb(peer) for peer in peers]


def _peers_from_pb(raw: Sequence[bytes]) -> tuple[bytes, ...]:
    return tuple(_peer_from_pb(peer) for peer in raw)


def _topic_problem(topic: str) -> str | None:
    size = len(topic.encode())
    if not 0 < size <= MAX_TOPIC_NAME:
        return f"topic name must be 1..{MAX_TOPIC_NAME} bytes of UTF-8, not {size}: {_show(topic)}"
    return None


def _check_topic_names(topics: Sequence[str], error: type[Exception]) -> None:
    for topic in topics:
        if (problem := _topic_problem(topic)) is not None:
            raise error(problem)


# -- one message each way ---------------------------------------------------------------
# Encoders fill the (already present) protobuf submessage from the dataclass; decoders build
# the dataclass from the submessage, leaving range checks to its constructor.


def _enum_from_pb(enum_type: type[NeighborOp] | type[LinkKind], value: int) -> Any:
    try:
        return enum_type(value)
    except ValueError:
        raise FrameError(f"unknown {enum_type.__name__} value {value!r}") from None


def _topics_to_pb(m: Topics, out: pb.Topics) -> None:
    _check_topic_names(m.topics, ValueError)
    out.topics.extend(m.topics)


def _topics_from_pb(p: pb.Topics) -> Topics:
    _check_topic_names(p.topics, FrameError)
    return Topics(topics=tuple(p.topics))


def _neighbor_to_pb(m: Neighbor, out: pb.Neighbor) -> None:
    out.op = int(m.op)
    out.kind = int(m.kind)
    out.high_priority = m.high_priority
    if m.rtt is not None:
        out.rtt_seconds = m.rtt
    out.active_count = m.active_count
    out.rand_count = m.rand_count


def _neighbor_from_pb(p: pb.Neighbor) -> Neighbor:
    return Neighbor(
        op=_enum_from_pb(NeighborOp, p.op),
        kind=_enum_from_pb(LinkKind, p.kind),
        high_priority=p.high_priority,
        rtt=p.rtt_seconds if p.HasField("rtt_seconds") else None,
        active_count=p.active_count,
        rand_count=p.rand_count,
    )


def _disconnect_to_pb(m: Disconnect, out: pb.Disconnect) -> None:
    out.alive = m.alive


def _ping_to_pb(m: Ping, out: pb.Ping) -> None:
    out.nonce = m.nonce
    out.want_view = m.want_view


def _shuffle_to_pb(m: Shuffle, out: pb.Shuffle) -> None:
    out.origin = _peer_to_pb(m.origin)
    out.ttl = m.ttl
    out.peers.extend(_peers_to_pb(m.peers))
    out.nonce = m.nonce


def _shuffle_reply_to_pb(m: ShuffleReply, out: pb.ShuffleReply) -> None:
    out.peers.extend(_peers_to_pb(m.peers))
    out.nonce = m.nonce


def _pong_to_pb(m: Pong, out: pb.Pong) -> None:
    out.nonce = m.nonce
    out.subscribed = m.subscribed
    out.active_count = m.active_count
    out.rand_count = m.rand_count
    out.active.extend(_peers_to_pb(m.active))
    out.not_neighbor = m.not_neighbor


def _pong_from_pb(p: pb.Pong) -> Pong:
    return Pong(
        nonce=p.nonce,
        subscribed=p.subscribed,
        active_count=p.active_count,
        rand_count=p.rand_count,
        active=_peers_from_pb(p.active),
        not_neighbor=p.not_neighbor,
    )


def _gossip_from_pb(p: pb.Gossip) -> Gossip:
    """A GOSSIP that did not come in the canonical layout `_read_gossip` reads: its envelope
    is taken as protobuf re-serialises it, which is canonical for an envelope's fields."""
    if not p.HasField("envelope"):
        raise FrameError("GOSSIP without an envelope")
    _check_gossip(p.id, p.hops)
    return Gossip.from_wire(p.id, p.envelope.SerializeToString(), p.hops)


def _check_gossip(message_id: bytes, hops: int) -> None:
    if len(message_id) != MESSAGE_ID_SIZE:
        raise FrameError(f"GOSSIP id must be {MESSAGE_ID_SIZE} bytes, not {len(message_id)}")
    if hops > MAX_HOPS:
        raise FrameError(f"GOSSIP hops must be in 0..{MAX_HOPS}, not {hops}")


def _ranges_to_pb(m: IHave | Graft | Heads, out: pb.IHave | pb.Graft | pb.Heads) -> None:
    add = out.ranges.add
    for publisher, first, last, hops in m.ranges:
        if type(publisher) is not bytes or not 0 < len(publisher) <= MAX_PEER_ID_SIZE:
            _peer_to_pb(publisher)  # raises for a bad id: only then a call per range
        add(publisher=publisher, first_seq=first, last_seq=last, hops=hops)


def _ranges_from_pb(p: pb.IHave | pb.Graft | pb.Heads) -> tuple[StreamRange, ...]:
    if len(p.ranges) > MAX_RANGES_PER_MESSAGE:  # before any is looked at
        raise FrameError(f"at most {MAX_RANGES_PER_MESSAGE} ranges, not {len(p.ranges)}")
    return tuple((_peer_from_pb(r.publisher), r.first_seq, r.last_seq, r.hops) for r in p.ranges)


def _streams_to_pb(m: Prune | Graft, out: pb.Prune | pb.Graft) -> None:
    out.streams.extend(_peer_to_pb(publisher) for publisher in m.streams)


def _streams_from_pb(p: pb.Prune | pb.Graft) -> tuple[PeerId, ...]:
    if len(p.streams) > MAX_STREAMS_PER_MESSAGE:  # before any is looked at
        raise FrameError(f"at most {MAX_STREAMS_PER_MESSAGE} streams, not {len(p.streams)}")
    return _peers_from_pb(p.streams)


def _graft_to_pb(m: Graft, out: pb.Graft) -> None:
    _ranges_to_pb(m, out)
    _streams_to_pb(m, out)


def _pull_to_pb(m: Pull, out: pb.Pull) -> None:
    out.publisher = _peer_to_pb(m.publisher)
    out.first_seq = m.first_seq
    out.last_seq = m.last_seq


def _pull_from_pb(p: pb.Pull) -> Pull:
    return Pull(publisher=_peer_from_pb(p.publisher), first_seq=p.first_seq, last_seq=p.last_seq)


def _history_to_pb(m: History, out: pb.History) -> None:
    out.publisher = _peer_to_pb(m.publisher)
    out.envelopes.extend(m.envelopes)
    out.hops.extend(m.hops)


def _history_from_pb(p: pb.History) -> History:
    """Bounds checked before anything is copied; each envelope is checked by the core."""
    if len(p.envelopes) > MAX_HISTORY_MESSAGES:
        raise FrameError(f"HISTORY carries at most {MAX_HISTORY_MESSAGES} messages")
    return History(
        publisher=_peer_from_pb(p.publisher), envelopes=tuple(p.envelopes), hops=tuple(p.hops)
    )


def _nothing_to_pb(m: Any, out: Any) -> None:
    """Messages without fields: the caller has already marked the submessage present."""


def _walk_to_pb(m: Join | ForwardJoin | Leave, out: Any) -> None:
    out.peer = _peer_to_pb(m.peer)
    out.ttl = m.ttl


def _view_to_pb(m: View, out: pb.View) -> None:
    out.passive_count = m.passive_count
    for entry in m.entries:
        item = out.entries.add(
            peer=_peer_to_pb(entry.peer), near=entry.kind is LinkKind.NEAR, eager=entry.eager
        )
        if entry.rtt is not None:
            item.rtt_seconds = entry.rtt


def _view_from_pb(p: pb.View) -> View:
    entries = tuple(
        ViewEntry(
            peer=_peer_from_pb(e.peer),
            kind=LinkKind.NEAR if e.near else LinkKind.RAND,
            eager=e.eager,
            rtt=e.rtt_seconds if e.HasField("rtt_seconds") else None,
        )
        for e in p.entries
    )
    return View(entries=entries, passive_count=p.passive_count)


def _spans_to_pb(spans: Sequence[HeldSpan], out: Any) -> None:
    for span in spans:
        out.add(
            publisher=_peer_to_pb(span.publisher),
            first_seq=span.first_seq,
            last_seq=span.last_seq,
            count=span.count,
            since_seq=span.since_seq,
        )


def _spans_from_pb(raw: Sequence[pb.HeldSpan]) -> tuple[HeldSpan, ...]:
    if len(raw) > _messages.MAX_HELD_SPANS:  # before building any of them
        raise FrameError(f"at most {_messages.MAX_HELD_SPANS} spans, not {len(raw)}")
    return tuple(
        HeldSpan(
            publisher=_peer_from_pb(s.publisher),
            first_seq=s.first_seq,
            last_seq=s.last_seq,
            count=s.count,
            since_seq=s.since_seq,
        )
        for s in raw
    )


def _get_held_to_pb(m: GetHeld, out: pb.GetHeld) -> None:
    out.nonce = m.nonce
    _spans_to_pb(m.spans, out.spans)
    out.after = m.after
    out.since_ms = m.since_ms


def _held_to_pb(m: Held, out: pb.Held) -> None:
    out.nonce = m.nonce
    _spans_to_pb(m.spans, out.spans)
    out.more = m.more


class _Codec:
    """How one message type maps to its `Item.body` field."""

    __slots__ = ("decode", "encode", "field", "node_level")

    def __init__(
        self,
        field: str,
        encode: Callable[[Any, Any], None],
        decode: Callable[[Any], PeerMessage],
        *,
        node_level: bool = False,
    ) -> None:
        self.field = field
        self.encode = encode
        self.decode = decode
        self.node_level = node_level


_CODECS: dict[type, _Codec] = {
    GetTopics: _Codec("get_topics", _nothing_to_pb, lambda p: GetTopics(), node_level=True),
    Topics: _Codec("topics", _topics_to_pb, _topics_from_pb, node_level=True),
    GetNodes: _Codec("get_nodes", _nothing_to_pb, lambda p: GetNodes()),
    Nodes: _Codec(
        "nodes",
        lambda m, out: out.peers.extend(_peers_to_pb(m.peers)),
        lambda p: Nodes(peers=_peers_from_pb(p.peers)),
    ),
    Join: _Codec("join", _walk_to_pb, lambda p: Join(peer=_peer_from_pb(p.peer), ttl=p.ttl)),
    ForwardJoin: _Codec(
        "forward_join",
        _walk_to_pb,
        lambda p: ForwardJoin(peer=_peer_from_pb(p.peer), ttl=p.ttl),
    ),
    Neighbor: _Codec("neighbor", _neighbor_to_pb, _neighbor_from_pb),
    Disconnect: _Codec("disconnect", _disconnect_to_pb, lambda p: Disconnect(alive=p.alive)),
    Leave: _Codec("leave", _walk_to_pb, lambda p: Leave(peer=_peer_from_pb(p.peer), ttl=p.ttl)),
    Shuffle: _Codec(
        "shuffle",
        _shuffle_to_pb,
        lambda p: Shuffle(
            origin=_peer_from_pb(p.origin), ttl=p.ttl, peers=_peers_from_pb(p.peers), nonce=p.nonce
        ),
    ),
    ShuffleReply: _Codec(
        "shuffle_reply",
        _shuffle_reply_to_pb,
        lambda p: ShuffleReply(peers=_peers_from_pb(p.peers), nonce=p.nonce),
    ),
    Ping: _Codec("ping", _ping_to_pb, lambda p: Ping(nonce=p.nonce, want_view=p.want_view)),
    Pong: _Codec("pong", _pong_to_pb, _pong_from_pb),
    Gossip: _Codec("gossip", _nothing_to_pb, _gossip_from_pb),  # encoded by _gossip_item
    IHave: _Codec("ihave", _ranges_to_pb, lambda p: IHave(ranges=_ranges_from_pb(p))),
    Prune: _Codec("prune", _streams_to_pb, lambda p: Prune(streams=_streams_from_pb(p))),
    Graft: _Codec(
        "graft",
        _graft_to_pb,
        lambda p: Graft(ranges=_ranges_from_pb(p), streams=_streams_from_pb(p)),
    ),
    Pull: _Codec("pull", _pull_to_pb, _pull_from_pb),
    History: _Codec("history", _history_to_pb, _history_from_pb),
    Heads: _Codec("heads", _ranges_to_pb, lambda p: Heads(ranges=_ranges_from_pb(p))),
    GetView: _Codec("get_view", _nothing_to_pb, lambda p: GetView()),
    View: _Codec("view", _view_to_pb, _view_from_pb),
    GetHeld: _Codec(
        "get_held",
        _get_held_to_pb,
        lambda p: GetHeld(
            nonce=p.nonce, spans=_spans_from_pb(p.spans), after=p.after, since_ms=p.since_ms
        ),
    ),
    Held: _Codec(
        "held",
        _held_to_pb,
        lambda p: Held(nonce=p.nonce, spans=_spans_from_pb(p.spans), more=p.more),
    ),
}
_CODECS_BY_FIELD: dict[str, _Codec] = {codec.field: codec for codec in _CODECS.values()}


# -- frames -----------------------------------------------------------------------------


def encode_frame(items: Sequence[tuple[str | None, PeerMessage]]) -> bytes:
    """One frame carrying `items`, each a (topic, message); topic is None for node-level ones.

    Raises TypeError for a value that cannot go on the wire (an int peer id from the
    simulator, something that is not a message) and ValueError for one the receiving
    decoder would refuse (a missing or misplaced topic, an oversized name or peer id).
    """
    if not items:
        raise ValueError("a frame carries at least one message")
    return frame_from_items([encode_item(topic, message) for topic, message in items])


def encode_item(topic: str | None, message: PeerMessage) -> bytes:
    """One (topic, message) encoded as it sits inside a frame, ready for `frame_from_items`.

    A frame's body is the concatenation of its items' encodings (protobuf's repeated field),
    so a sender can encode a message once, whoever it goes to, and pack queued items into
    frames by size. Raises like `encode_frame`.
    """
    if type(topic) is str and type(message) is Gossip:
        return _gossip_item(topic, message)
    if type(topic) is str and type(message) is History and type(message.publisher) is bytes:
        return _history_item(topic, message)
    codec = _CODECS.get(type(message))
    if codec is None:
        raise TypeError(f"not an episub message: {_show(message)}")
    frame = pb.Frame()
    item = frame.items.add()
    if codec.node_level:
        if topic is not None:
            raise ValueError(f"{type(message).__name__} is node-level: topic must be None")
    else:
        if not isinstance(topic, str):
            raise TypeError(f"{type(message).__name__} needs a str topic, not {_show(topic)}")
        if (problem := _topic_problem(topic)) is not None:
            raise ValueError(problem)
        item.topic = topic
    body = getattr(item, codec.field)
    body.SetInParent()
    codec.encode(message, body)
    return frame.SerializeToString()


# GOSSIP items, written and read by hand: they are most of the traffic, and protobuf's
# object layer cost ~25 us to write a GOSSIP and ~10 to read one. (IHAVE names runs of
# streams, a few per flush, and goes through protobuf.) The layout is what protobuf writes:
#   Frame.items (0x0A) len Item{ topic (0x0A) len utf8, gossip (0x12) len Gossip{
#       id (0x0A) 0x20 32 bytes, envelope (0x12) len raw, [hops (0x18) varint] } }
# Reading falls back on protobuf for any other layout of the same fields.
_GOSSIP_ID_FIELD = b"\x0a\x20"
_MAX_TOPIC_CACHE = 1024  # topic names whose item prefix is kept; topics are few


class _TopicCache(dict[str, bytes]):
    """topic -> its Item field bytes (tag, length, UTF-8), for writing."""

    def __missing__(self, topic: str) -> bytes:
        if (problem := _topic_problem(topic)) is not None:
            raise ValueError(problem)
        if len(self) >= _MAX_TOPIC_CACHE:
            self.clear()
        encoded = topic.encode()
        field = self[topic] = b"\x0a" + varint(len(encoded)) + encoded
        return field


_topic_fields = _TopicCache()
_GOSSIP_BODY = 0x12  # Item.gossip
_topic_names: dict[bytes, str] = {}  # topic bytes read -> the checked name, for reading


def _gossip_item(topic: str, message: Gossip) -> bytes:
    raw = message.raw
    hops = message.hops
    raw_len = varint(len(raw))  # each varint made once: this runs per message sent
    hops_field = b"\x18" + varint(hops) if hops else b""
    gossip_len = 34 + 1 + len(raw_len) + len(raw) + len(hops_field)
    gossip_len_field = varint(gossip_len)
    topic_field = _topic_fields[topic]
    item_len = len(topic_field) + 1 + len(gossip_len_field) + gossip_len
    return b"".join(
        (
            b"\x0a",
            varint(item_len),
            topic_field,
            b"\x12",
            gossip_len_field,
            _GOSSIP_ID_FIELD,
            message.id,
            b"\x12",
            raw_len,
            raw,
            hops_field,
        )
    )


# HISTORY items (PULL answers: up to a 1 MB message each) are written by hand too: through
# protobuf their envelopes were copied twice, in ~1-3 ms a MB, inside the step that answers.
# The layout is what protobuf writes (tests/test_wire.py compares the two):
#   Frame.items (0x0A) len Item{ topic (0x0A) len utf8, history (0xCA 0x01) len History{
#       publisher (0x0A) len bytes, envelopes (0x12) len bytes..., hops (0x1A) len varints } }
_HISTORY_BODY = b"\xca\x01"  # Item.history: field 25, length-delimited


def _history_item(topic: str, message: History) -> bytes:
    publisher = _peer_to_pb(message.publisher)
    hops = b"".join(map(varint, message.hops))
    parts = [b"\x0a", varint(len(publisher)), publisher]
    for raw in message.envelopes:
        parts += (b"\x12", varint(len(raw)), raw)
    parts += (b"\x1a", varint(len(hops)), hops)
    history_len = sum(map(len, parts))
    topic_field = _topic_fields[topic]
    head = [topic_field, _HISTORY_BODY, varint(history_len)]
    item_len = sum(map(len, head)) + history_len
    return b"".join([b"\x0a", varint(item_len), *head, *parts])


def _read_topic(body: bytes, pos: int, end: int) -> tuple[str, int]:
    size = body[pos]  # a one-byte varint in line: the usual case
    if size < 0x80:
        pos += 1
    else:
        size, pos = read_varint(body, pos)
    stop = pos + size
    if stop > end:
        raise ValueError("topic cut short")
    encoded = body[pos:stop]
    topic = _topic_names.get(encoded)
    if topic is None:
        topic = encoded.decode()
        if (problem := _topic_problem(topic)) is not None:
            raise FrameError(problem)
        if len(_topic_names) >= _MAX_TOPIC_CACHE:
            _topic_names.clear()
        _topic_names[encoded] = topic
    return topic, stop


def _read_fast(body: bytes, pos: int, end: int) -> tuple[str, PeerMessage] | None:
    """The GOSSIP item at body[pos:end] in its canonical layout, else None."""
    if body[pos] != 0x0A:
        return None
    size = body[pos + 1]  # a short name seen before, in line: the usual case
    stop = pos + 2 + size
    topic = _topic_names.get(body[pos + 2 : stop]) if size < 0x80 and stop <= end else None
    if topic is None:  # a long name, a new one or one cut short: read and checked in full
        topic, stop = _read_topic(body, pos + 1, end)
    pos = stop
    if pos >= end:
        return None
    if body[pos] != 0x12:
        return None
    size = body[pos + 1]  # a one- or two-byte varint in line: the usual cases
    if size < 0x80:
        pos += 2
    elif 0 < (high := body[pos + 2]) < 0x80:  # (a high byte 0 is not minimal: read_varint)
        size = (size & 0x7F) | (high << 7)
        pos += 3
    else:
        size, pos = read_varint(body, pos + 1)
    if pos + size != end or body[pos : pos + 2] != _GOSSIP_ID_FIELD:
        return None
    message_id = body[pos + 2 : pos + 34]
    pos += 34
    if pos >= end or body[pos] != 0x12 or len(message_id) != MESSAGE_ID_SIZE:
        return None
    size = body[pos + 1]  # a one- or two-byte varint in line: the usual cases
    if size < 0x80:
        pos += 2
    elif 0 < (high := body[pos + 2]) < 0x80:
        size = (size & 0x7F) | (high << 7)
        pos += 3
    else:
        size, pos = read_varint(body, pos + 1)
    raw = body[pos : pos + size]
    pos += size
    hops = 0
    if pos < end:
        if body[pos] != 0x18:
            return None
        hops = body[pos + 1]  # a one-byte varint in line: the usual case
        if hops < 0x80:
            pos += 2
        else:
            hops, pos = read_varint(body, pos + 1)
        if hops > MAX_HOPS:
            raise FrameError(f"GOSSIP hops must be in 0..{MAX_HOPS}, not {hops}")
    if pos != end:
        return None
    return topic, Gossip.from_wire(message_id, raw, hops)


def frame_from_items(items: Sequence[bytes]) -> bytes:
    """A length-prefixed frame of items made by `encode_item`."""
    if not items:
        raise ValueError("a frame carries at least one message")
    return frame(b"".join(items))


def _decode_item(item: pb.Item) -> tuple[str | None, PeerMessage]:
    field = item.WhichOneof("body")
    if field is None:
        raise FrameError("item has no message body (empty or of an unknown kind)")
    codec = _CODECS_BY_FIELD[field]
    topic: str | None = None
    if item.HasField("topic"):
        if codec.node_level:
            raise FrameError(f"node-level {field} carries a topic: {_show(item.topic)}")
        topic = item.topic
        if (problem := _topic_problem(topic)) is not None:
            raise FrameError(problem)
    elif not codec.node_level:
        raise FrameError(f"{field} carries no topic")
    try:
        message = codec.decode(getattr(item, field))
    except FrameError:
        raise
    except (ValueError, TypeError) as exc:
        raise FrameError(f"invalid {field}: {exc}") from exc
    return topic, message


class FrameDecoder:
    """Turns the bytes of one connection into frames of (topic, message) items.

    `feed()` whatever arrives, then call `next_frame()` until it returns None. The frames
    are split by framing.FrameSplitter (one bound, `max_frame_size`, checked from each
    header alone; see there what stays buffered); each body is decoded here.
    """

    def __init__(self, *, max_frame_size: int, max_items_per_frame: int = MAX_ITEMS_PER_FRAME):
        if not 0 < max_frame_size <= MAX_ENCODABLE_FRAME:
            raise ValueError(
                f"max_frame_size must be 1..{MAX_ENCODABLE_FRAME}, not {max_frame_size!r}"
            )
        if max_items_per_frame <= 0:
            raise ValueError(f"max_items_per_frame must be positive, not {max_items_per_frame!r}")
        self._frames = FrameSplitter(max_frame_size, min_size=1)
        self._max_items = max_items_per_frame

    @property
    def buffered(self) -> int:
        """Bytes received and not yet returned as frames."""
        return self._frames.buffered

    def feed(self, data: bytes | bytearray) -> None:
        """Buffer `data`; a bad frame header in it is reported by a later `next_frame()`."""
        self._frames.feed(data)

    def whole_frame(self, data: bytes) -> list[tuple[str | None, PeerMessage]] | None:
        """The items of `data` when it is exactly one frame and nothing is buffered (the
        usual read: decoded straight from it, never buffered); None when `data` is anything
        else, for `feed()`. Raises FrameError as `next_frame()` does."""
        body = self._frames.whole_body(data)
        return None if body is None else self._decode_or_fail(body)

    def next_frame(self) -> list[tuple[str | None, PeerMessage]] | None:
        """The next whole frame's items, or None when more bytes are needed.

        Raises FrameError when the frame (or the stream) is invalid; after that the decoder
        only raises.
        """
        body = self._frames.next_body()
        return None if body is None else self._decode_or_fail(body)

    def _decode_or_fail(self, body: bytes) -> list[tuple[str | None, PeerMessage]]:
        """`_decode`, and a frame that is not valid ends the stream (only raises after)."""
        try:
            return self._decode(body)
        except FrameError:
            self._frames.fail()
            raise

    def _decode(self, body: bytes) -> list[tuple[str | None, PeerMessage]]:
        """The items of a frame body: GOSSIP read by hand, anything else by protobuf."""
        out: list[tuple[str | None, PeerMessage]] = []
        end = len(body)
        pos = 0
        try:
            while pos < end:
                if body[pos] != 0x0A:
                    return self._decode_pb(body)  # not the items field: protobuf sorts it out
                size = body[pos + 1]  # a one- or two-byte varint in line: the usual cases
                if size < 0x80:
                    pos += 2
                elif 0 < (high := body[pos + 2]) < 0x80:  # (a high byte 0: read_varint's error)
                    size = (size & 0x7F) | (high << 7)
                    pos += 3
                else:
                    size, pos = read_varint(body, pos + 1)
                stop = pos + size
                if stop > end:
                    raise FrameError(f"malformed protobuf frame: an item overruns its {end} bytes")
                if len(out) >= self._max_items:
                    raise FrameError(  # counted up to the first item too many
                        f"frame carries {len(out) + 1} items, more than {self._max_items}"
                    )
                item = None
                ahead = pos + 2 + body[pos + 1] if size > 3 else stop  # after a short topic
                if ahead < stop and body[pos] == 0x0A and body[ahead] == _GOSSIP_BODY:
                    item = _read_fast(body, pos, stop)  # a topic, then a GOSSIP
                if item is None:
                    parsed = pb.Item()
                    try:
                        parsed.ParseFromString(body[pos:stop])
                    except DecodeError as exc:
                        raise FrameError(f"malformed item of {size} bytes: {exc}") from None
                    item = _decode_item(parsed)
                out.append(item)
                pos = stop
        except (ValueError, IndexError) as exc:
            if isinstance(exc, FrameError):
                raise
            raise FrameError(f"malformed protobuf frame of {end} bytes: {exc}") from None
        if not out:
            raise FrameError("frame carries no items")
        return out

    def _decode_pb(self, body: bytes) -> list[tuple[str | None, PeerMessage]]:
        frame = pb.Frame()
        try:
            frame.ParseFromString(body)
        except DecodeError as exc:
            raise FrameError(f"malformed protobuf frame of {len(body)} bytes: {exc}") from None
        if not frame.items:
            raise FrameError("frame carries no items")
        if len(frame.items) > self._max_items:
            raise FrameError(f"frame carries {len(frame.items)} items, more than {self._max_items}")
        return [_decode_item(item) for item in frame.items]
