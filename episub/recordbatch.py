"""Record batches: many rows in one overlay message.

Every node of a topic handles every overlay message (tens of µs each), so a stream of
100,000 rows/s cannot be one message per row. A record batch carries many rows of one
publisher in one message, each row keeping its own offset: a batch says its first row's
offset, and a stream's rows are numbered on from batch to batch without gaps (a plain
message, without the batch marker, is one row whose offset is its seq).

A batch is a message whose headers include `BATCH_HEADER` (value `b"1"`) and whose value
is the payload below. Subscribers that are not Spark see that one message;
`RecordBatch.decode(message.value)` gives its rows (`rows()`, or columns).

The payload (little-endian) lays its columns out the way Arrow lays out a column, so a
reader with pyarrow builds arrays over the payload's own bytes (`pa.Array.from_buffers`)
and pure Python slices rows out of them with memoryviews:

    magic b"EPRB", version u8 (1), flags u8 (0), buffer count u16 (11),
    rows u32, first row offset u64, then 11 lengths u32, then the buffers in that order,
    each starting at a multiple of 8 bytes from the payload's start:

    0 timestamps        int64[rows]  ms since the epoch
    1 key validity      bit per row, least significant bit first (a null key: 0)
    2 key offsets       int32[rows + 1]      3 key bytes
    4 value offsets     int32[rows + 1]      5 value bytes
    6 header offsets    int32[rows + 1]: row i's headers are entries [h[i], h[i+1])
    7 name offsets      int32[entries + 1]   8 name bytes (UTF-8)
    9 header value offs int32[entries + 1]  10 header value bytes

Offsets start at 0, never decrease and end at their data's length; `decode` checks all of
it once, so whatever a peer sent, a decoded batch's slices are in bounds.
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

__all__ = [
    "BATCH_HEADER",
    "MAX_ROWS",
    "BatchFormatError",
    "BatchRow",
    "RecordBatch",
    "encode",
    "encode_columns",
    "is_batch",
    "unbatch",
]

BATCH_HEADER = "_episub.batch"  # a message header: its value is a record batch
MAGIC = b"EPRB"
VERSION = 1
BUFFERS = 11
MAX_ROWS = 1 << 20  # rows in one batch at most (a 1 MiB message holds far fewer)
_HEAD = struct.Struct("<4sBBHIQ")
_LENGTHS = struct.Struct(f"<{BUFFERS}I")
_DATA_START = -(-(_HEAD.size + _LENGTHS.size) // 8) * 8
_LITTLE = sys.byteorder == "little"


M = TypeVar("M")


class BatchFormatError(ValueError):
    """A payload that is not a well-formed record batch."""


def is_batch(headers: Iterable[tuple[str, bytes]]) -> bool:
    """Does a message with these headers carry a record batch?"""
    return any(name == BATCH_HEADER for name, _ in headers)


@dataclass(frozen=True, slots=True)
class BatchRow:
    """One row of a batch."""

    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes], ...]


def _le(values: array) -> bytes:
    if not _LITTLE:
        values = array(values.typecode, values)
        values.byteswap()
    return values.tobytes()


def _from_le(typecode: str, data: memoryview) -> array:
    out = array(typecode)
    out.frombytes(data)
    if not _LITTLE:
        out.byteswap()
    return out


def _binary_column(items: Iterable[bytes]) -> tuple[bytes, bytes]:
    offsets = array("i", [0])
    total = 0
    parts = []
    for item in items:
        total += len(item)
        offsets.append(total)
        parts.append(item)
    return _le(offsets), b"".join(parts)


def encode_columns(
    first_row: int,
    rows: int,
    buffers: Sequence[bytes | bytearray | memoryview],
) -> bytes:
    """A payload from its 11 buffers as laid out above (a writer with pyarrow builds them
    from Arrow arrays); they are not checked here: `decode` checks what it reads."""
    if len(buffers) != BUFFERS:
        raise ValueError(f"a record batch has {BUFFERS} buffers, not {len(buffers)}")
    if not 0 <= rows <= MAX_ROWS or first_row < 0:
        raise ValueError(f"need 0 <= rows <= {MAX_ROWS} and first_row >= 0")
    lengths = [memoryview(b).nbytes for b in buffers]
    out = bytearray(_HEAD.pack(MAGIC, VERSION, 0, BUFFERS, rows, first_row))
    out += _LENGTHS.pack(*lengths)
    for buffer in buffers:
        out += bytes(-len(out) % 8)
        out += buffer
    return bytes(out)


def encode(
    first_row: int,
    rows: Sequence[tuple[int, bytes | None, bytes, Sequence[tuple[str, bytes]]]],
) -> bytes:
    """A payload of `rows`, each (timestamp_ms, key or None, value, headers), numbered from
    `first_row`."""
    n = len(rows)
    stamps = _le(array("q", (r[0] for r in rows)))
    valid = 0
    for i, r in enumerate(rows):
        if r[1] is not None:
            valid |= 1 << i
    validity = valid.to_bytes(-(-n // 8), "little")
    key_offsets, keys = _binary_column(r[1] or b"" for r in rows)
    value_offsets, values = _binary_column(r[2] for r in rows)
    header_offsets = array("i", [0])
    for r in rows:
        header_offsets.append(header_offsets[-1] + len(r[3]))
    names = [name.encode("utf-8") for r in rows for name, _ in r[3]]
    name_offsets, name_data = _binary_column(names)
    hv_offsets, hv_data = _binary_column(value for r in rows for _, value in r[3])
    return encode_columns(
        first_row,
        n,
        [
            stamps,
            validity,
            key_offsets,
            keys,
            value_offsets,
            values,
            _le(header_offsets),
            name_offsets,
            name_data,
            hv_offsets,
            hv_data,
        ],
    )


def _check_offsets(offsets: array, count: int, data_length: int, what: str) -> None:
    if len(offsets) != count + 1:
        raise BatchFormatError(f"{what}: {len(offsets)} offsets for {count} entries")
    if offsets[0] != 0 or offsets[-1] != data_length:
        raise BatchFormatError(
            f"{what}: offsets run {offsets[0]}..{offsets[-1]}, not 0..{data_length}"
        )
    previous = 0
    for value in offsets:
        if value < previous:
            raise BatchFormatError(f"{what}: offsets decrease")
        previous = value


class RecordBatch:
    """A decoded, checked payload: its buffers are memoryviews of it (no copy)."""

    __slots__ = (
        "_header_offsets",
        "_hv_offsets",
        "_key_offsets",
        "_name_offsets",
        "_stamps",
        "_value_offsets",
        "buffers",
        "first_row",
        "payload",
        "rows",
    )

    def __init__(self, payload: bytes, first_row: int, rows: int, buffers: list[memoryview]):
        self.payload = payload
        self.first_row = first_row
        self.rows = rows
        self.buffers = buffers
        self._stamps = _from_le("q", buffers[0])
        self._key_offsets = _from_le("i", buffers[2])
        self._value_offsets = _from_le("i", buffers[4])
        self._header_offsets = _from_le("i", buffers[6])
        self._name_offsets = _from_le("i", buffers[7])
        self._hv_offsets = _from_le("i", buffers[9])

    @property
    def end_row(self) -> int:
        """The offset after its last row (the next batch's first)."""
        return self.first_row + self.rows

    @classmethod
    def decode(cls, payload: bytes | bytearray | memoryview) -> RecordBatch:
        """Check and open a payload; BatchFormatError (one line) if it is not well formed."""
        payload = bytes(payload)
        view = memoryview(payload)
        if len(payload) < _DATA_START:
            raise BatchFormatError(f"a record batch needs {_DATA_START} bytes at least")
        magic, version, _flags, count, rows, first_row = _HEAD.unpack_from(payload)
        if magic != MAGIC:
            raise BatchFormatError("not a record batch (bad magic)")
        if version != VERSION or count != BUFFERS:
            raise BatchFormatError(f"record batch version {version} is not supported")
        if rows > MAX_ROWS or first_row >= 1 << 63:
            raise BatchFormatError(f"record batch of {rows} rows from {first_row}: out of bounds")
        lengths = _LENGTHS.unpack_from(payload, _HEAD.size)
        buffers = []
        at = _DATA_START
        for i, length in enumerate(lengths):
            at += -at % 8
            if at + length > len(payload):
                raise BatchFormatError(f"buffer {i} runs past the payload's end")
            buffers.append(view[at : at + length])
            at += length
        if at != len(payload):
            raise BatchFormatError("bytes after the last buffer")
        expect = {0: 8 * rows, 1: -(-rows // 8), 2: 4 * (rows + 1), 4: 4 * (rows + 1)}
        expect[6] = 4 * (rows + 1)
        for i, size in expect.items():
            if len(buffers[i]) != size:
                raise BatchFormatError(f"buffer {i} has {len(buffers[i])} bytes, not {size}")
        if len(buffers[7]) % 4 or len(buffers[9]) != len(buffers[7]) or not buffers[7]:
            raise BatchFormatError("header offsets of different lengths")
        batch = cls(payload, first_row, rows, buffers)
        entries = len(batch._name_offsets) - 1
        _check_offsets(batch._key_offsets, rows, len(buffers[3]), "keys")
        _check_offsets(batch._value_offsets, rows, len(buffers[5]), "values")
        _check_offsets(batch._header_offsets, rows, entries, "headers")
        _check_offsets(batch._name_offsets, entries, len(buffers[8]), "header names")
        _check_offsets(batch._hv_offsets, entries, len(buffers[10]), "header values")
        try:
            str(buffers[8], "utf-8")
        except UnicodeDecodeError:
            raise BatchFormatError("header names are not UTF-8") from None
        return batch

    def key_valid(self, i: int) -> bool:
        return bool(self.buffers[1][i >> 3] >> (i & 7) & 1)

    def row(self, i: int) -> BatchRow:
        """Row i of the batch (0 <= i < rows); its offset is first_row + i."""
        if not 0 <= i < self.rows:
            raise IndexError(f"row {i} of a batch of {self.rows}")
        b = self.buffers
        ko, vo, ho = self._key_offsets, self._value_offsets, self._header_offsets
        key = bytes(b[3][ko[i] : ko[i + 1]]) if self.key_valid(i) else None
        no, hvo = self._name_offsets, self._hv_offsets
        headers = tuple(
            (str(b[8][no[j] : no[j + 1]], "utf-8"), bytes(b[10][hvo[j] : hvo[j + 1]]))
            for j in range(ho[i], ho[i + 1])
        )
        return BatchRow(
            self.first_row + i, self._stamps[i], key, bytes(b[5][vo[i] : vo[i + 1]]), headers
        )

    def rows_between(self, first: int, last: int) -> Iterator[BatchRow]:
        """The rows with offsets first..last that this batch holds."""
        low = max(first, self.first_row) - self.first_row
        high = min(last + 1, self.end_row) - self.first_row
        for i in range(low, high):
            yield self.row(i)

    def __iter__(self) -> Iterator[BatchRow]:
        return (self.row(i) for i in range(self.rows))


def unbatch(message: M) -> list[M]:
    """A message as its rows: a record batch (see `is_batch`) as one message per row, each
    with its row's offset as seq, its stamp, key, value and headers, and the batch's id;
    any other message as itself. BatchFormatError if the batch is not well formed."""
    if not is_batch(message.headers):  # type: ignore[attr-defined]
        return [message]
    batch = RecordBatch.decode(message.value)  # type: ignore[attr-defined]
    return [
        replace(
            message,  # type: ignore[type-var]
            seq=row.offset,
            timestamp_ms=row.timestamp_ms,
            key=row.key,
            value=row.value,
            headers=row.headers,
        )
        for row in batch
    ]
