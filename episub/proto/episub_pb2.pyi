from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Frame(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[Item]
    def __init__(self, items: _Optional[_Iterable[_Union[Item, _Mapping]]] = ...) -> None: ...

class Item(_message.Message):
    __slots__ = ("topic", "gossip", "ihave", "graft", "prune", "pull", "ping", "pong", "neighbor", "disconnect", "join", "forward_join", "shuffle", "shuffle_reply", "leave", "get_nodes", "nodes", "get_topics", "topics", "get_view", "view", "get_held", "held", "heads", "history")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    GOSSIP_FIELD_NUMBER: _ClassVar[int]
    IHAVE_FIELD_NUMBER: _ClassVar[int]
    GRAFT_FIELD_NUMBER: _ClassVar[int]
    PRUNE_FIELD_NUMBER: _ClassVar[int]
    PULL_FIELD_NUMBER: _ClassVar[int]
    PING_FIELD_NUMBER: _ClassVar[int]
    PONG_FIELD_NUMBER: _ClassVar[int]
    NEIGHBOR_FIELD_NUMBER: _ClassVar[int]
    DISCONNECT_FIELD_NUMBER: _ClassVar[int]
    JOIN_FIELD_NUMBER: _ClassVar[int]
    FORWARD_JOIN_FIELD_NUMBER: _ClassVar[int]
    SHUFFLE_FIELD_NUMBER: _ClassVar[int]
    SHUFFLE_REPLY_FIELD_NUMBER: _ClassVar[int]
    LEAVE_FIELD_NUMBER: _ClassVar[int]
    GET_NODES_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    GET_TOPICS_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    GET_VIEW_FIELD_NUMBER: _ClassVar[int]
    VIEW_FIELD_NUMBER: _ClassVar[int]
    GET_HELD_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    HEADS_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    topic: str
    gossip: Gossip
    ihave: IHave
    graft: Graft
    prune: Prune
    pull: Pull
    ping: Ping
    pong: Pong
    neighbor: Neighbor
    disconnect: Disconnect
    join: Join
    forward_join: ForwardJoin
    shuffle: Shuffle
    shuffle_reply: ShuffleReply
    leave: Leave
    get_nodes: GetNodes
    nodes: Nodes
    get_topics: GetTopics
    topics: Topics
    get_view: GetView
    view: View
    get_held: GetHeld
    held: Held
    heads: Heads
    history: History
    def __init__(self, topic: _Optional[str] = ..., gossip: _Optional[_Union[Gossip, _Mapping]] = ..., ihave: _Optional[_Union[IHave, _Mapping]] = ..., graft: _Optional[_Union[Graft, _Mapping]] = ..., prune: _Optional[_Union[Prune, _Mapping]] = ..., pull: _Optional[_Union[Pull, _Mapping]] = ..., ping: _Optional[_Union[Ping, _Mapping]] = ..., pong: _Optional[_Union[Pong, _Mapping]] = ..., neighbor: _Optional[_Union[Neighbor, _Mapping]] = ..., disconnect: _Optional[_Union[Disconnect, _Mapping]] = ..., join: _Optional[_Union[Join, _Mapping]] = ..., forward_join: _Optional[_Union[ForwardJoin, _Mapping]] = ..., shuffle: _Optional[_Union[Shuffle, _Mapping]] = ..., shuffle_reply: _Optional[_Union[ShuffleReply, _Mapping]] = ..., leave: _Optional[_Union[Leave, _Mapping]] = ..., get_nodes: _Optional[_Union[GetNodes, _Mapping]] = ..., nodes: _Optional[_Union[Nodes, _Mapping]] = ..., get_topics: _Optional[_Union[GetTopics, _Mapping]] = ..., topics: _Optional[_Union[Topics, _Mapping]] = ..., get_view: _Optional[_Union[GetView, _Mapping]] = ..., view: _Optional[_Union[View, _Mapping]] = ..., get_held: _Optional[_Union[GetHeld, _Mapping]] = ..., held: _Optional[_Union[Held, _Mapping]] = ..., heads: _Optional[_Union[Heads, _Mapping]] = ..., history: _Optional[_Union[History, _Mapping]] = ...) -> None: ...

class GetTopics(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Topics(_message.Message):
    __slots__ = ("topics",)
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, topics: _Optional[_Iterable[str]] = ...) -> None: ...

class GetView(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class View(_message.Message):
    __slots__ = ("entries", "passive_count")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    PASSIVE_COUNT_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[ViewEntry]
    passive_count: int
    def __init__(self, entries: _Optional[_Iterable[_Union[ViewEntry, _Mapping]]] = ..., passive_count: _Optional[int] = ...) -> None: ...

class ViewEntry(_message.Message):
    __slots__ = ("peer", "near", "eager", "rtt_seconds")
    PEER_FIELD_NUMBER: _ClassVar[int]
    NEAR_FIELD_NUMBER: _ClassVar[int]
    EAGER_FIELD_NUMBER: _ClassVar[int]
    RTT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    peer: bytes
    near: bool
    eager: bool
    rtt_seconds: float
    def __init__(self, peer: _Optional[bytes] = ..., near: _Optional[bool] = ..., eager: _Optional[bool] = ..., rtt_seconds: _Optional[float] = ...) -> None: ...

class GetHeld(_message.Message):
    __slots__ = ("nonce", "spans", "after", "since_ms")
    NONCE_FIELD_NUMBER: _ClassVar[int]
    SPANS_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    SINCE_MS_FIELD_NUMBER: _ClassVar[int]
    nonce: int
    spans: _containers.RepeatedCompositeFieldContainer[HeldSpan]
    after: bytes
    since_ms: int
    def __init__(self, nonce: _Optional[int] = ..., spans: _Optional[_Iterable[_Union[HeldSpan, _Mapping]]] = ..., after: _Optional[bytes] = ..., since_ms: _Optional[int] = ...) -> None: ...

class Held(_message.Message):
    __slots__ = ("nonce", "spans", "more")
    NONCE_FIELD_NUMBER: _ClassVar[int]
    SPANS_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    nonce: int
    spans: _containers.RepeatedCompositeFieldContainer[HeldSpan]
    more: bool
    def __init__(self, nonce: _Optional[int] = ..., spans: _Optional[_Iterable[_Union[HeldSpan, _Mapping]]] = ..., more: _Optional[bool] = ...) -> None: ...

class HeldSpan(_message.Message):
    __slots__ = ("publisher", "first_seq", "last_seq", "count", "since_seq")
    PUBLISHER_FIELD_NUMBER: _ClassVar[int]
    FIRST_SEQ_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    SINCE_SEQ_FIELD_NUMBER: _ClassVar[int]
    publisher: bytes
    first_seq: int
    last_seq: int
    count: int
    since_seq: int
    def __init__(self, publisher: _Optional[bytes] = ..., first_seq: _Optional[int] = ..., last_seq: _Optional[int] = ..., count: _Optional[int] = ..., since_seq: _Optional[int] = ...) -> None: ...

class GetNodes(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Nodes(_message.Message):
    __slots__ = ("peers",)
    PEERS_FIELD_NUMBER: _ClassVar[int]
    peers: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, peers: _Optional[_Iterable[bytes]] = ...) -> None: ...

class Join(_message.Message):
    __slots__ = ("peer", "ttl")
    PEER_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    peer: bytes
    ttl: int
    def __init__(self, peer: _Optional[bytes] = ..., ttl: _Optional[int] = ...) -> None: ...

class ForwardJoin(_message.Message):
    __slots__ = ("peer", "ttl")
    PEER_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    peer: bytes
    ttl: int
    def __init__(self, peer: _Optional[bytes] = ..., ttl: _Optional[int] = ...) -> None: ...

class Neighbor(_message.Message):
    __slots__ = ("op", "kind", "high_priority", "rtt_seconds", "active_count", "rand_count")
    class NeighborOp(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        REQUEST: _ClassVar[Neighbor.NeighborOp]
        ACCEPT: _ClassVar[Neighbor.NeighborOp]
    REQUEST: Neighbor.NeighborOp
    ACCEPT: Neighbor.NeighborOp
    class LinkKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        RAND: _ClassVar[Neighbor.LinkKind]
        NEAR: _ClassVar[Neighbor.LinkKind]
    RAND: Neighbor.LinkKind
    NEAR: Neighbor.LinkKind
    OP_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    HIGH_PRIORITY_FIELD_NUMBER: _ClassVar[int]
    RTT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_COUNT_FIELD_NUMBER: _ClassVar[int]
    RAND_COUNT_FIELD_NUMBER: _ClassVar[int]
    op: Neighbor.NeighborOp
    kind: Neighbor.LinkKind
    high_priority: bool
    rtt_seconds: float
    active_count: int
    rand_count: int
    def __init__(self, op: _Optional[_Union[Neighbor.NeighborOp, str]] = ..., kind: _Optional[_Union[Neighbor.LinkKind, str]] = ..., high_priority: _Optional[bool] = ..., rtt_seconds: _Optional[float] = ..., active_count: _Optional[int] = ..., rand_count: _Optional[int] = ...) -> None: ...

class Disconnect(_message.Message):
    __slots__ = ("alive",)
    ALIVE_FIELD_NUMBER: _ClassVar[int]
    alive: bool
    def __init__(self, alive: _Optional[bool] = ...) -> None: ...

class Leave(_message.Message):
    __slots__ = ("peer", "ttl")
    PEER_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    peer: bytes
    ttl: int
    def __init__(self, peer: _Optional[bytes] = ..., ttl: _Optional[int] = ...) -> None: ...

class Shuffle(_message.Message):
    __slots__ = ("origin", "ttl", "peers", "nonce")
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    PEERS_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    origin: bytes
    ttl: int
    peers: _containers.RepeatedScalarFieldContainer[bytes]
    nonce: int
    def __init__(self, origin: _Optional[bytes] = ..., ttl: _Optional[int] = ..., peers: _Optional[_Iterable[bytes]] = ..., nonce: _Optional[int] = ...) -> None: ...

class ShuffleReply(_message.Message):
    __slots__ = ("peers", "nonce")
    PEERS_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    peers: _containers.RepeatedScalarFieldContainer[bytes]
    nonce: int
    def __init__(self, peers: _Optional[_Iterable[bytes]] = ..., nonce: _Optional[int] = ...) -> None: ...

class Ping(_message.Message):
    __slots__ = ("nonce", "want_view")
    NONCE_FIELD_NUMBER: _ClassVar[int]
    WANT_VIEW_FIELD_NUMBER: _ClassVar[int]
    nonce: int
    want_view: bool
    def __init__(self, nonce: _Optional[int] = ..., want_view: _Optional[bool] = ...) -> None: ...

class Pong(_message.Message):
    __slots__ = ("nonce", "subscribed", "active_count", "rand_count", "active", "not_neighbor")
    NONCE_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBED_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_COUNT_FIELD_NUMBER: _ClassVar[int]
    RAND_COUNT_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    NOT_NEIGHBOR_FIELD_NUMBER: _ClassVar[int]
    nonce: int
    subscribed: bool
    active_count: int
    rand_count: int
    active: _containers.RepeatedScalarFieldContainer[bytes]
    not_neighbor: bool
    def __init__(self, nonce: _Optional[int] = ..., subscribed: _Optional[bool] = ..., active_count: _Optional[int] = ..., rand_count: _Optional[int] = ..., active: _Optional[_Iterable[bytes]] = ..., not_neighbor: _Optional[bool] = ...) -> None: ...

class Envelope(_message.Message):
    __slots__ = ("publisher", "seq", "timestamp_ms", "payload", "key", "headers", "signer", "signature")
    class Header(_message.Message):
        __slots__ = ("name", "value")
        NAME_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        name: str
        value: bytes
        def __init__(self, name: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    PUBLISHER_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    SIGNER_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    publisher: bytes
    seq: int
    timestamp_ms: int
    payload: bytes
    key: bytes
    headers: _containers.RepeatedCompositeFieldContainer[Envelope.Header]
    signer: bytes
    signature: bytes
    def __init__(self, publisher: _Optional[bytes] = ..., seq: _Optional[int] = ..., timestamp_ms: _Optional[int] = ..., payload: _Optional[bytes] = ..., key: _Optional[bytes] = ..., headers: _Optional[_Iterable[_Union[Envelope.Header, _Mapping]]] = ..., signer: _Optional[bytes] = ..., signature: _Optional[bytes] = ...) -> None: ...

class Gossip(_message.Message):
    __slots__ = ("id", "envelope", "hops")
    ID_FIELD_NUMBER: _ClassVar[int]
    ENVELOPE_FIELD_NUMBER: _ClassVar[int]
    HOPS_FIELD_NUMBER: _ClassVar[int]
    id: bytes
    envelope: Envelope
    hops: int
    def __init__(self, id: _Optional[bytes] = ..., envelope: _Optional[_Union[Envelope, _Mapping]] = ..., hops: _Optional[int] = ...) -> None: ...

class StreamRange(_message.Message):
    __slots__ = ("publisher", "first_seq", "last_seq", "hops")
    PUBLISHER_FIELD_NUMBER: _ClassVar[int]
    FIRST_SEQ_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    HOPS_FIELD_NUMBER: _ClassVar[int]
    publisher: bytes
    first_seq: int
    last_seq: int
    hops: int
    def __init__(self, publisher: _Optional[bytes] = ..., first_seq: _Optional[int] = ..., last_seq: _Optional[int] = ..., hops: _Optional[int] = ...) -> None: ...

class IHave(_message.Message):
    __slots__ = ("ranges",)
    RANGES_FIELD_NUMBER: _ClassVar[int]
    ranges: _containers.RepeatedCompositeFieldContainer[StreamRange]
    def __init__(self, ranges: _Optional[_Iterable[_Union[StreamRange, _Mapping]]] = ...) -> None: ...

class Heads(_message.Message):
    __slots__ = ("ranges",)
    RANGES_FIELD_NUMBER: _ClassVar[int]
    ranges: _containers.RepeatedCompositeFieldContainer[StreamRange]
    def __init__(self, ranges: _Optional[_Iterable[_Union[StreamRange, _Mapping]]] = ...) -> None: ...

class Prune(_message.Message):
    __slots__ = ("streams",)
    STREAMS_FIELD_NUMBER: _ClassVar[int]
    streams: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, streams: _Optional[_Iterable[bytes]] = ...) -> None: ...

class Graft(_message.Message):
    __slots__ = ("ranges", "streams")
    RANGES_FIELD_NUMBER: _ClassVar[int]
    STREAMS_FIELD_NUMBER: _ClassVar[int]
    ranges: _containers.RepeatedCompositeFieldContainer[StreamRange]
    streams: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, ranges: _Optional[_Iterable[_Union[StreamRange, _Mapping]]] = ..., streams: _Optional[_Iterable[bytes]] = ...) -> None: ...

class Pull(_message.Message):
    __slots__ = ("publisher", "first_seq", "last_seq")
    PUBLISHER_FIELD_NUMBER: _ClassVar[int]
    FIRST_SEQ_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    publisher: bytes
    first_seq: int
    last_seq: int
    def __init__(self, publisher: _Optional[bytes] = ..., first_seq: _Optional[int] = ..., last_seq: _Optional[int] = ...) -> None: ...

class History(_message.Message):
    __slots__ = ("publisher", "envelopes", "hops")
    PUBLISHER_FIELD_NUMBER: _ClassVar[int]
    ENVELOPES_FIELD_NUMBER: _ClassVar[int]
    HOPS_FIELD_NUMBER: _ClassVar[int]
    publisher: bytes
    envelopes: _containers.RepeatedScalarFieldContainer[bytes]
    hops: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, publisher: _Optional[bytes] = ..., envelopes: _Optional[_Iterable[bytes]] = ..., hops: _Optional[_Iterable[int]] = ...) -> None: ...

class Handshake(_message.Message):
    __slots__ = ("hello", "proof")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    PROOF_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    proof: Proof
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., proof: _Optional[_Union[Proof, _Mapping]] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("version", "peer_id", "nonce", "plaintext", "signing_key")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PEER_ID_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    PLAINTEXT_FIELD_NUMBER: _ClassVar[int]
    SIGNING_KEY_FIELD_NUMBER: _ClassVar[int]
    version: int
    peer_id: bytes
    nonce: bytes
    plaintext: bool
    signing_key: bytes
    def __init__(self, version: _Optional[int] = ..., peer_id: _Optional[bytes] = ..., nonce: _Optional[bytes] = ..., plaintext: _Optional[bool] = ..., signing_key: _Optional[bytes] = ...) -> None: ...

class Proof(_message.Message):
    __slots__ = ("mac", "signature")
    MAC_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    mac: bytes
    signature: bytes
    def __init__(self, mac: _Optional[bytes] = ..., signature: _Optional[bytes] = ...) -> None: ...
