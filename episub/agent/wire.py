"""The agent protocol's framing and value conversions, with no I/O (h11's manner).

The trio server (server.py) and the blocking client (client.py) both frame with
`encode_frame` and a `FrameSplitter`, and convert with the functions here, so the two ends
cannot disagree. A frame is a 4-byte big-endian length, then one protobuf `Request` or
`Response` (agent.proto): the node wire's framing (episub/proto/framing.py), its one
decoder and its one bound (a header announcing more than the splitter's `max_size` raises
`FrameError` from its 4 bytes alone).
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from google.protobuf.message import DecodeError

from episub.agent import agent_pb2 as pb
from episub.proto.envelope import Envelope, Record
from episub.proto.framing import FrameError, FrameSplitter, frame
from episub.proto.messages import HeldSpan
from episub.recordbatch import BatchFormatError, RecordBatch, encode_columns, is_batch
from episub.records import Delivery, Item, Lagged, Lost, NeighborLink

__all__ = [
    "MAX_BATCH_RECORDS",
    "MAX_REQUEST_SIZE",
    "MAX_RESPONSE_SIZE",
    "FrameError",
    "FrameSplitter",
    "Record",
    "RowsPage",
    "checked_record_to_pb",
    "decode_request",
    "decode_response",
    "delivery_from_pb",
    "delivery_to_pb",
    "encode_frame",
    "envelope_rows_to_pb",
    "item_from_pb",
    "item_to_pb",
    "neighbor_from_pb",
    "neighbor_to_pb",
    "record_from_pb",
    "record_to_pb",
    "rows_from_pb",
    "rows_to_pb",
    "span_from_pb",
    "span_to_pb",
]

# A request is at most one PublishBatch: 32 MiB holds 32 records at the node's default 1 MiB
# message limit, or tens of thousands of the small rows a Spark sink writes; the client
# splits bigger batches (client.py). Guess: a bound on what one client can make us hold.
MAX_REQUEST_SIZE = 32 * 1024 * 1024
# A response is at most one ReadRange page (server.py's READ_PAGE_BYTES, 16 MiB) plus one
# message that alone may exceed the page; the node wire's own frame bound is of that order.
MAX_RESPONSE_SIZE = 64 * 1024 * 1024
# Records in one PublishBatch. Guess: a Spark partition's rows go in a few requests.
MAX_BATCH_RECORDS = 10_000
# A ReadRange whose fetch is still progressing is answered after this many seconds with
# what it has (the client asks again from there): a reply's wait stays fetch_timeout plus
# this, however long the range. Guess: a few pages' worth at LAN rates.
READ_FETCH_BUDGET = 2.0


def encode_frame(message: pb.Request | pb.Response) -> bytes:
    return frame(message.SerializeToString())


def decode_request(body: bytes) -> pb.Request:
    request = pb.Request()
    try:
        request.ParseFromString(body)
    except DecodeError as exc:
        raise FrameError(f"not an agent Request ({len(body)} bytes): {exc}") from None
    return request


def decode_response(body: bytes) -> pb.Response:
    response = pb.Response()
    try:
        response.ParseFromString(body)
    except DecodeError as exc:
        raise FrameError(f"not an agent Response ({len(body)} bytes): {exc}") from None
    return response


# -- values ------------------------------------------------------------------------------


def _headers_to_pb(target: object, headers: Iterable[tuple[str, bytes]]) -> None:
    for name, value in headers:
        target.add(name=name, value=value)  # type: ignore[attr-defined]


def _headers_from_pb(headers: Iterable[pb.Header]) -> tuple[tuple[str, bytes], ...]:
    return tuple((h.name, h.value) for h in headers)


def record_to_pb(
    value: bytes,
    key: bytes | None = None,
    headers: Mapping[str, bytes] | Iterable[tuple[str, bytes]] | None = None,
    stream: tuple[bytes, int] | None = None,
    timestamp_ms: int | None = None,
) -> pb.Record:
    """Checks here (a Record), so a caller's mistake is reported before anything is sent."""
    return checked_record_to_pb(Record(value, key, headers, stream, timestamp_ms))


def checked_record_to_pb(record: Record) -> pb.Record:
    out = pb.Record(value=record.value)
    if record.key is not None:
        out.key = record.key
    _headers_to_pb(out.headers, record.headers)
    if record.stream is not None:
        out.stream.publisher, out.stream.seq = record.stream
    if record.timestamp_ms is not None:
        out.timestamp_ms = record.timestamp_ms
    return out


def record_from_pb(record: pb.Record) -> Record:
    """The record of a request, checked (envelope.Record): TypeError or ValueError names
    what is wrong."""
    stream = None
    if record.HasField("stream"):
        stream = (record.stream.publisher, record.stream.seq)
    return Record(
        record.value,
        record.key if record.HasField("key") else None,
        _headers_from_pb(record.headers),
        stream,
        record.timestamp_ms if record.HasField("timestamp_ms") else None,
    )


def delivery_to_pb(message: Delivery, out: pb.Delivery | None = None) -> pb.Delivery:
    """`message` as protobuf, written into `out` when given (a field of the reply: filled
    in place, a megabyte value is copied once, not again with every enclosing message)."""
    if out is None:
        out = pb.Delivery()
    out.topic = message.topic
    out.publisher = message.publisher
    out.seq = message.seq
    out.timestamp_ms = message.timestamp_ms
    out.value = message.value
    out.id = message.id
    if message.key is not None:
        out.key = message.key
    _headers_to_pb(out.headers, message.headers)
    return out


def delivery_from_pb(message: pb.Delivery) -> Delivery:
    return Delivery(
        topic=message.topic,
        publisher=message.publisher,
        seq=message.seq,
        timestamp_ms=message.timestamp_ms,
        key=message.key if message.HasField("key") else None,
        value=message.value,
        headers=_headers_from_pb(message.headers),
        id=message.id,
    )


@dataclass(frozen=True, slots=True)
class RowsPage:
    """A ReadRange page asked `as_rows`: its plain messages as one record batch (`rows`,
    numbered from 0) with each row's seq (`seqs`, rising), and its record-batch messages."""

    rows: RecordBatch
    seqs: memoryview  # int64 little-endian, rows.rows of them
    batches: list[Delivery]


def rows_to_pb(messages: Sequence[Delivery], out: pb.Messages) -> None:
    """A page's messages into `out` as columns (agent.proto's Messages.rows): one pass per
    column over the page, no protobuf message per row."""
    plain: Sequence[Delivery] = messages
    if any(m.headers and is_batch(m.headers) for m in messages):
        plain = []
        for m in messages:
            if m.headers and is_batch(m.headers):
                out.messages.append(delivery_to_pb(m))
            else:
                plain.append(m)
    _columns_to_pb(
        [m.seq for m in plain],
        [m.timestamp_ms for m in plain],
        [m.key for m in plain],
        [m.value for m in plain],
        [m.headers for m in plain],
        out,
    )


def envelope_rows_to_pb(envelopes: Sequence[Envelope], out: pb.Messages) -> None:
    """`rows_to_pb` for envelopes read from retention, none of them a record batch (the
    caller checks): their columns taken straight from them, no Delivery made per row."""
    _columns_to_pb(
        [e.seq for e in envelopes],
        [e.timestamp_ms for e in envelopes],
        [e.key for e in envelopes],
        [e.payload for e in envelopes],
        [e.headers for e in envelopes],
        out,
    )


def _columns_to_pb(
    seqs: list[int],
    stamps: list[int],
    keys: list[bytes | None],
    values: list[bytes],
    headers: list[tuple[tuple[str, bytes], ...]],
    out: pb.Messages,
) -> None:
    n = len(seqs)
    validity = bytearray(-(-n // 8))
    key_offsets, present = array("i", [0]), []
    total = 0
    for i, key in enumerate(keys):
        if key is not None:
            validity[i >> 3] |= 1 << (i & 7)
            present.append(key)
            total += len(key)
        key_offsets.append(total)
    value_offsets, total = array("i", [0]), 0
    for value in values:
        total += len(value)
        value_offsets.append(total)
    header_offsets, names, header_values = array("i", [0]), [], []
    for pairs in headers:
        for name, value in pairs:
            names.append(name.encode("utf-8"))
            header_values.append(value)
        header_offsets.append(len(names))
    out.rows = encode_columns(
        0,
        n,
        [
            _little(array("q", stamps)),
            validity,
            _little(key_offsets),
            b"".join(present),
            _little(value_offsets),
            b"".join(values),
            _little(header_offsets),
            _little(_offsets(names)),
            b"".join(names),
            _little(_offsets(header_values)),
            b"".join(header_values),
        ],
    )
    out.row_seqs = _little(array("q", seqs))


def rows_from_pb(page: pb.Messages) -> RowsPage:
    """A page asked `as_rows`, checked (BatchFormatError if its columns are not well formed;
    a page that came as one Delivery per message, from an agent that does not know
    `as_rows`, is turned into the same)."""
    batches = [delivery_from_pb(m) for m in page.messages]
    if not page.rows:
        plain = [m for m in batches if not (m.headers and is_batch(m.headers))]
        batches = [m for m in batches if m.headers and is_batch(m.headers)]
        holder = pb.Messages()
        rows_to_pb(plain, holder)
        page = holder
    rows = RecordBatch.decode(page.rows)
    seqs = memoryview(page.row_seqs)
    if len(seqs) != 8 * rows.rows:
        raise BatchFormatError(f"{len(seqs)} bytes of seqs for {rows.rows} rows")
    return RowsPage(rows, seqs, batches)


def _offsets(items: Sequence[bytes]) -> array:
    out, total = array("i", [0]), 0
    for item in items:
        total += len(item)
        out.append(total)
    return out


def _little(values: array) -> bytes:
    if sys.byteorder != "little":
        values = array(values.typecode, values)
        values.byteswap()
    return values.tobytes()


def item_to_pb(item: Item, out: pb.Item | None = None) -> pb.Item:
    """`item` as protobuf, written into `out` when given (as delivery_to_pb)."""
    if out is None:
        out = pb.Item()
    if isinstance(item, Delivery):
        out.message.SetInParent()  # the oneof's choice, whatever the values
        delivery_to_pb(item, out.message)
    elif isinstance(item, Lagged):
        out.lagged.SetInParent()
        out.lagged.count = item.count
    else:
        out.lost.SetInParent()
        out.lost.publisher = item.publisher
        out.lost.first_seq = item.first_seq
        out.lost.last_seq = item.last_seq
    return out


def item_from_pb(item: pb.Item) -> Item:
    kind = item.WhichOneof("kind")
    if kind == "message":
        return delivery_from_pb(item.message)
    if kind == "lagged":
        return Lagged(item.lagged.count)
    if kind == "lost":
        return Lost(item.lost.publisher, item.lost.first_seq, item.lost.last_seq)
    raise FrameError(f"subscription item with no kind: {item!r:.200}")


def neighbor_to_pb(neighbor: NeighborLink) -> pb.Neighbor:
    out = pb.Neighbor(
        peer_id=neighbor.peer_id, address=neighbor.address, kind=neighbor.kind, role=neighbor.role
    )
    if neighbor.rtt_ms is not None:
        out.rtt_ms = neighbor.rtt_ms
    return out


def neighbor_from_pb(neighbor: pb.Neighbor) -> NeighborLink:
    kind: Literal["rand", "near"] = "near" if neighbor.kind == "near" else "rand"
    role: Literal["eager", "lazy"] = "eager" if neighbor.role == "eager" else "lazy"
    return NeighborLink(
        peer_id=neighbor.peer_id,
        address=neighbor.address,
        kind=kind,
        role=role,
        rtt_ms=neighbor.rtt_ms if neighbor.HasField("rtt_ms") else None,
    )


def span_to_pb(span: HeldSpan, out: pb.Span) -> None:
    out.publisher = span.publisher  # type: ignore[assignment]
    out.first_seq = span.first_seq
    out.last_seq = span.last_seq
    out.count = span.count
    out.since_seq = span.since_seq


def span_from_pb(span: pb.Span) -> HeldSpan:
    """Raises ValueError for a span that is not one (first > last, count too big...)."""
    return HeldSpan(
        publisher=span.publisher,
        first_seq=span.first_seq,
        last_seq=span.last_seq,
        count=span.count,
        since_seq=span.since_seq,
    )
