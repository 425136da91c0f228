from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Header(_message.Message):
    __slots__ = ("name", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: bytes
    def __init__(self, name: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...

class Record(_message.Message):
    __slots__ = ("value", "key", "headers", "stream", "timestamp_ms")
    VALUE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    value: bytes
    key: bytes
    headers: _containers.RepeatedCompositeFieldContainer[Header]
    stream: StreamPlace
    timestamp_ms: int
    def __init__(self, value: _Optional[bytes] = ..., key: _Optional[bytes] = ..., headers: _Optional[_Iterable[_Union[Header, _Mapping]]] = ..., stream: _Optional[_Union[StreamPlace, _Mapping]] = ..., timestamp_ms: _Optional[int] = ...) -> None: ...

class StreamPlace(_message.Message):
    __slots__ = ("publisher", "seq")
    PUBLISHER_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    publisher: bytes
    seq: int
    def __init__(self, publisher: _Optional[bytes] = ..., seq: _Optional[int] = ...) -> None: ...

class Request(_message.Message):
    __slots__ = ("id", "join", "leave", "publish", "publish_batch", "subscribe", "unsubscribe", "read_range", "offsets", "inspect", "config_read", "config_write", "overlay", "holdings", "known_topics")
    ID_FIELD_NUMBER: _ClassVar[int]
    JOIN_FIELD_NUMBER: _ClassVar[int]
    LEAVE_FIELD_NUMBER: _ClassVar[int]
    PUBLISH_FIELD_NUMBER: _ClassVar[int]
    PUBLISH_BATCH_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBE_FIELD_NUMBER: _ClassVar[int]
    UNSUBSCRIBE_FIELD_NUMBER: _ClassVar[int]
    READ_RANGE_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    INSPECT_FIELD_NUMBER: _ClassVar[int]
    CONFIG_READ_FIELD_NUMBER: _ClassVar[int]
    CONFIG_WRITE_FIELD_NUMBER: _ClassVar[int]
    OVERLAY_FIELD_NUMBER: _ClassVar[int]
    HOLDINGS_FIELD_NUMBER: _ClassVar[int]
    KNOWN_TOPICS_FIELD_NUMBER: _ClassVar[int]
    id: int
    join: Join
    leave: Leave
    publish: Publish
    publish_batch: PublishBatch
    subscribe: Subscribe
    unsubscribe: Unsubscribe
    read_range: ReadRange
    offsets: GetOffsets
    inspect: Inspect
    config_read: ConfigRead
    config_write: ConfigWrite
    overlay: Overlay
    holdings: Holdings
    known_topics: KnownTopics
    def __init__(self, id: _Optional[int] = ..., join: _Optional[_Union[Join, _Mapping]] = ..., leave: _Optional[_Union[Leave, _Mapping]] = ..., publish: _Optional[_Union[Publish, _Mapping]] = ..., publish_batch: _Optional[_Union[PublishBatch, _Mapping]] = ..., subscribe: _Optional[_Union[Subscribe, _Mapping]] = ..., unsubscribe: _Optional[_Union[Unsubscribe, _Mapping]] = ..., read_range: _Optional[_Union[ReadRange, _Mapping]] = ..., offsets: _Optional[_Union[GetOffsets, _Mapping]] = ..., inspect: _Optional[_Union[Inspect, _Mapping]] = ..., config_read: _Optional[_Union[ConfigRead, _Mapping]] = ..., config_write: _Optional[_Union[ConfigWrite, _Mapping]] = ..., overlay: _Optional[_Union[Overlay, _Mapping]] = ..., holdings: _Optional[_Union[Holdings, _Mapping]] = ..., known_topics: _Optional[_Union[KnownTopics, _Mapping]] = ...) -> None: ...

class Join(_message.Message):
    __slots__ = ("topic", "bootstrap", "timeout", "no_history")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    BOOTSTRAP_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    NO_HISTORY_FIELD_NUMBER: _ClassVar[int]
    topic: str
    bootstrap: _containers.RepeatedScalarFieldContainer[str]
    timeout: float
    no_history: bool
    def __init__(self, topic: _Optional[str] = ..., bootstrap: _Optional[_Iterable[str]] = ..., timeout: _Optional[float] = ..., no_history: _Optional[bool] = ...) -> None: ...

class Leave(_message.Message):
    __slots__ = ("topic",)
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    topic: str
    def __init__(self, topic: _Optional[str] = ...) -> None: ...

class Publish(_message.Message):
    __slots__ = ("topic", "record")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    RECORD_FIELD_NUMBER: _ClassVar[int]
    topic: str
    record: Record
    def __init__(self, topic: _Optional[str] = ..., record: _Optional[_Union[Record, _Mapping]] = ...) -> None: ...

class PublishBatch(_message.Message):
    __slots__ = ("topic", "records")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    records: _containers.RepeatedCompositeFieldContainer[Record]
    def __init__(self, topic: _Optional[str] = ..., records: _Optional[_Iterable[_Union[Record, _Mapping]]] = ...) -> None: ...

class Subscribe(_message.Message):
    __slots__ = ("topic", "buffer")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    BUFFER_FIELD_NUMBER: _ClassVar[int]
    topic: str
    buffer: int
    def __init__(self, topic: _Optional[str] = ..., buffer: _Optional[int] = ...) -> None: ...

class Unsubscribe(_message.Message):
    __slots__ = ("subscribe_id",)
    SUBSCRIBE_ID_FIELD_NUMBER: _ClassVar[int]
    subscribe_id: int
    def __init__(self, subscribe_id: _Optional[int] = ...) -> None: ...

class ReadRange(_message.Message):
    __slots__ = ("topic", "publisher", "first_seq", "last_seq", "fetch_timeout", "holders", "value_prefix", "as_rows")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PUBLISHER_FIELD_NUMBER: _ClassVar[int]
    FIRST_SEQ_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    FETCH_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    HOLDERS_FIELD_NUMBER: _ClassVar[int]
    VALUE_PREFIX_FIELD_NUMBER: _ClassVar[int]
    AS_ROWS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    publisher: bytes
    first_seq: int
    last_seq: int
    fetch_timeout: float
    holders: _containers.RepeatedScalarFieldContainer[bytes]
    value_prefix: int
    as_rows: bool
    def __init__(self, topic: _Optional[str] = ..., publisher: _Optional[bytes] = ..., first_seq: _Optional[int] = ..., last_seq: _Optional[int] = ..., fetch_timeout: _Optional[float] = ..., holders: _Optional[_Iterable[bytes]] = ..., value_prefix: _Optional[int] = ..., as_rows: _Optional[bool] = ...) -> None: ...

class Holdings(_message.Message):
    __slots__ = ("topic", "spans", "neighbors", "peers", "addresses", "since_ms", "timeout")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    SPANS_FIELD_NUMBER: _ClassVar[int]
    NEIGHBORS_FIELD_NUMBER: _ClassVar[int]
    PEERS_FIELD_NUMBER: _ClassVar[int]
    ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    SINCE_MS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    topic: str
    spans: _containers.RepeatedCompositeFieldContainer[Span]
    neighbors: bool
    peers: _containers.RepeatedScalarFieldContainer[bytes]
    addresses: _containers.RepeatedScalarFieldContainer[str]
    since_ms: int
    timeout: float
    def __init__(self, topic: _Optional[str] = ..., spans: _Optional[_Iterable[_Union[Span, _Mapping]]] = ..., neighbors: _Optional[bool] = ..., peers: _Optional[_Iterable[bytes]] = ..., addresses: _Optional[_Iterable[str]] = ..., since_ms: _Optional[int] = ..., timeout: _Optional[float] = ...) -> None: ...

class Span(_message.Message):
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

class KnownTopics(_message.Message):
    __slots__ = ("neighbors", "addresses", "timeout")
    NEIGHBORS_FIELD_NUMBER: _ClassVar[int]
    ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    neighbors: bool
    addresses: _containers.RepeatedScalarFieldContainer[str]
    timeout: float
    def __init__(self, neighbors: _Optional[bool] = ..., addresses: _Optional[_Iterable[str]] = ..., timeout: _Optional[float] = ...) -> None: ...

class GetOffsets(_message.Message):
    __slots__ = ("topic",)
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    topic: str
    def __init__(self, topic: _Optional[str] = ...) -> None: ...

class Inspect(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ConfigRead(_message.Message):
    __slots__ = ("name", "min_version", "timeout")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MIN_VERSION_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    name: str
    min_version: int
    timeout: float
    def __init__(self, name: _Optional[str] = ..., min_version: _Optional[int] = ..., timeout: _Optional[float] = ...) -> None: ...

class ConfigWrite(_message.Message):
    __slots__ = ("name", "set", "delete")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SET_FIELD_NUMBER: _ClassVar[int]
    DELETE_FIELD_NUMBER: _ClassVar[int]
    name: str
    set: _containers.RepeatedCompositeFieldContainer[ConfigValue]
    delete: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., set: _Optional[_Iterable[_Union[ConfigValue, _Mapping]]] = ..., delete: _Optional[_Iterable[str]] = ...) -> None: ...

class Overlay(_message.Message):
    __slots__ = ("topic", "max_nodes", "timeout")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    MAX_NODES_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    topic: str
    max_nodes: int
    timeout: float
    def __init__(self, topic: _Optional[str] = ..., max_nodes: _Optional[int] = ..., timeout: _Optional[float] = ...) -> None: ...

class ConfigValue(_message.Message):
    __slots__ = ("key", "kind", "data")
    KEY_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    key: str
    kind: str
    data: bytes
    def __init__(self, key: _Optional[str] = ..., kind: _Optional[str] = ..., data: _Optional[bytes] = ...) -> None: ...

class Response(_message.Message):
    __slots__ = ("id", "error", "done", "published", "item", "end", "messages", "offsets", "node_info", "config", "overlay_map", "holdings_map", "topic_list")
    ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    PUBLISHED_FIELD_NUMBER: _ClassVar[int]
    ITEM_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    NODE_INFO_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    OVERLAY_MAP_FIELD_NUMBER: _ClassVar[int]
    HOLDINGS_MAP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_LIST_FIELD_NUMBER: _ClassVar[int]
    id: int
    error: Error
    done: Done
    published: Receipts
    item: Item
    end: End
    messages: Messages
    offsets: Offsets
    node_info: NodeInfo
    config: ConfigSnapshot
    overlay_map: OverlayMap
    holdings_map: HoldingsMap
    topic_list: TopicList
    def __init__(self, id: _Optional[int] = ..., error: _Optional[_Union[Error, _Mapping]] = ..., done: _Optional[_Union[Done, _Mapping]] = ..., published: _Optional[_Union[Receipts, _Mapping]] = ..., item: _Optional[_Union[Item, _Mapping]] = ..., end: _Optional[_Union[End, _Mapping]] = ..., messages: _Optional[_Union[Messages, _Mapping]] = ..., offsets: _Optional[_Union[Offsets, _Mapping]] = ..., node_info: _Optional[_Union[NodeInfo, _Mapping]] = ..., config: _Optional[_Union[ConfigSnapshot, _Mapping]] = ..., overlay_map: _Optional[_Union[OverlayMap, _Mapping]] = ..., holdings_map: _Optional[_Union[HoldingsMap, _Mapping]] = ..., topic_list: _Optional[_Union[TopicList, _Mapping]] = ...) -> None: ...

class Error(_message.Message):
    __slots__ = ("kind", "message")
    KIND_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    kind: str
    message: str
    def __init__(self, kind: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class Done(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Receipts(_message.Message):
    __slots__ = ("publisher", "published")
    PUBLISHER_FIELD_NUMBER: _ClassVar[int]
    PUBLISHED_FIELD_NUMBER: _ClassVar[int]
    publisher: bytes
    published: _containers.RepeatedCompositeFieldContainer[Receipt]
    def __init__(self, publisher: _Optional[bytes] = ..., published: _Optional[_Iterable[_Union[Receipt, _Mapping]]] = ...) -> None: ...

class Receipt(_message.Message):
    __slots__ = ("id", "seq", "publisher", "duplicate")
    ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    PUBLISHER_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    id: bytes
    seq: int
    publisher: bytes
    duplicate: bool
    def __init__(self, id: _Optional[bytes] = ..., seq: _Optional[int] = ..., publisher: _Optional[bytes] = ..., duplicate: _Optional[bool] = ...) -> None: ...

class Delivery(_message.Message):
    __slots__ = ("topic", "publisher", "seq", "timestamp_ms", "key", "value", "headers", "id")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PUBLISHER_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    topic: str
    publisher: bytes
    seq: int
    timestamp_ms: int
    key: bytes
    value: bytes
    headers: _containers.RepeatedCompositeFieldContainer[Header]
    id: bytes
    def __init__(self, topic: _Optional[str] = ..., publisher: _Optional[bytes] = ..., seq: _Optional[int] = ..., timestamp_ms: _Optional[int] = ..., key: _Optional[bytes] = ..., value: _Optional[bytes] = ..., headers: _Optional[_Iterable[_Union[Header, _Mapping]]] = ..., id: _Optional[bytes] = ...) -> None: ...

class Item(_message.Message):
    __slots__ = ("message", "lagged", "lost")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LAGGED_FIELD_NUMBER: _ClassVar[int]
    LOST_FIELD_NUMBER: _ClassVar[int]
    message: Delivery
    lagged: Lagged
    lost: Lost
    def __init__(self, message: _Optional[_Union[Delivery, _Mapping]] = ..., lagged: _Optional[_Union[Lagged, _Mapping]] = ..., lost: _Optional[_Union[Lost, _Mapping]] = ...) -> None: ...

class Lagged(_message.Message):
    __slots__ = ("count",)
    COUNT_FIELD_NUMBER: _ClassVar[int]
    count: int
    def __init__(self, count: _Optional[int] = ...) -> None: ...

class Lost(_message.Message):
    __slots__ = ("publisher", "first_seq", "last_seq")
    PUBLISHER_FIELD_NUMBER: _ClassVar[int]
    FIRST_SEQ_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    publisher: bytes
    first_seq: int
    last_seq: int
    def __init__(self, publisher: _Optional[bytes] = ..., first_seq: _Optional[int] = ..., last_seq: _Optional[int] = ...) -> None: ...

class End(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class Messages(_message.Message):
    __slots__ = ("messages", "next_seq", "rows", "row_seqs")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    NEXT_SEQ_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    ROW_SEQS_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[Delivery]
    next_seq: int
    rows: bytes
    row_seqs: bytes
    def __init__(self, messages: _Optional[_Iterable[_Union[Delivery, _Mapping]]] = ..., next_seq: _Optional[int] = ..., rows: _Optional[bytes] = ..., row_seqs: _Optional[bytes] = ...) -> None: ...

class Offsets(_message.Message):
    __slots__ = ("publishers",)
    PUBLISHERS_FIELD_NUMBER: _ClassVar[int]
    publishers: _containers.RepeatedCompositeFieldContainer[PublisherOffsets]
    def __init__(self, publishers: _Optional[_Iterable[_Union[PublisherOffsets, _Mapping]]] = ...) -> None: ...

class PublisherOffsets(_message.Message):
    __slots__ = ("publisher", "first_retained_seq", "last_seq", "count")
    PUBLISHER_FIELD_NUMBER: _ClassVar[int]
    FIRST_RETAINED_SEQ_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    publisher: bytes
    first_retained_seq: int
    last_seq: int
    count: int
    def __init__(self, publisher: _Optional[bytes] = ..., first_retained_seq: _Optional[int] = ..., last_seq: _Optional[int] = ..., count: _Optional[int] = ...) -> None: ...

class HoldingsMap(_message.Message):
    __slots__ = ("nodes",)
    NODES_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[NodeHoldings]
    def __init__(self, nodes: _Optional[_Iterable[_Union[NodeHoldings, _Mapping]]] = ...) -> None: ...

class NodeHoldings(_message.Message):
    __slots__ = ("node_id", "address", "answered", "spans")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ANSWERED_FIELD_NUMBER: _ClassVar[int]
    SPANS_FIELD_NUMBER: _ClassVar[int]
    node_id: bytes
    address: str
    answered: bool
    spans: _containers.RepeatedCompositeFieldContainer[Span]
    def __init__(self, node_id: _Optional[bytes] = ..., address: _Optional[str] = ..., answered: _Optional[bool] = ..., spans: _Optional[_Iterable[_Union[Span, _Mapping]]] = ...) -> None: ...

class TopicList(_message.Message):
    __slots__ = ("topics",)
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, topics: _Optional[_Iterable[str]] = ...) -> None: ...

class NodeInfo(_message.Message):
    __slots__ = ("node_id", "address", "pid", "topics", "stats", "metrics_url")
    class StatsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    METRICS_URL_FIELD_NUMBER: _ClassVar[int]
    node_id: bytes
    address: str
    pid: int
    topics: _containers.RepeatedCompositeFieldContainer[TopicView]
    stats: _containers.ScalarMap[str, int]
    metrics_url: str
    def __init__(self, node_id: _Optional[bytes] = ..., address: _Optional[str] = ..., pid: _Optional[int] = ..., topics: _Optional[_Iterable[_Union[TopicView, _Mapping]]] = ..., stats: _Optional[_Mapping[str, int]] = ..., metrics_url: _Optional[str] = ...) -> None: ...

class ConfigSnapshot(_message.Message):
    __slots__ = ("name", "version", "entries", "known_version")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    KNOWN_VERSION_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: int
    entries: _containers.RepeatedCompositeFieldContainer[ConfigEntry]
    known_version: int
    def __init__(self, name: _Optional[str] = ..., version: _Optional[int] = ..., entries: _Optional[_Iterable[_Union[ConfigEntry, _Mapping]]] = ..., known_version: _Optional[int] = ...) -> None: ...

class ConfigEntry(_message.Message):
    __slots__ = ("key", "version", "writer", "kind", "data")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    WRITER_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    key: str
    version: int
    writer: bytes
    kind: str
    data: bytes
    def __init__(self, key: _Optional[str] = ..., version: _Optional[int] = ..., writer: _Optional[bytes] = ..., kind: _Optional[str] = ..., data: _Optional[bytes] = ...) -> None: ...

class OverlayMap(_message.Message):
    __slots__ = ("nodes",)
    NODES_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[OverlayNode]
    def __init__(self, nodes: _Optional[_Iterable[_Union[OverlayNode, _Mapping]]] = ...) -> None: ...

class OverlayNode(_message.Message):
    __slots__ = ("node_id", "address", "answered", "passive_count", "neighbors")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ANSWERED_FIELD_NUMBER: _ClassVar[int]
    PASSIVE_COUNT_FIELD_NUMBER: _ClassVar[int]
    NEIGHBORS_FIELD_NUMBER: _ClassVar[int]
    node_id: bytes
    address: str
    answered: bool
    passive_count: int
    neighbors: _containers.RepeatedCompositeFieldContainer[Neighbor]
    def __init__(self, node_id: _Optional[bytes] = ..., address: _Optional[str] = ..., answered: _Optional[bool] = ..., passive_count: _Optional[int] = ..., neighbors: _Optional[_Iterable[_Union[Neighbor, _Mapping]]] = ...) -> None: ...

class TopicView(_message.Message):
    __slots__ = ("topic", "neighbors")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    NEIGHBORS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    neighbors: _containers.RepeatedCompositeFieldContainer[Neighbor]
    def __init__(self, topic: _Optional[str] = ..., neighbors: _Optional[_Iterable[_Union[Neighbor, _Mapping]]] = ...) -> None: ...

class Neighbor(_message.Message):
    __slots__ = ("peer_id", "address", "kind", "role", "rtt_ms")
    PEER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    RTT_MS_FIELD_NUMBER: _ClassVar[int]
    peer_id: bytes
    address: str
    kind: str
    role: str
    rtt_ms: float
    def __init__(self, peer_id: _Optional[bytes] = ..., address: _Optional[str] = ..., kind: _Optional[str] = ..., role: _Optional[str] = ..., rtt_ms: _Optional[float] = ...) -> None: ...
