"""Rows between Arrow and episub's record batches (episub/recordbatch.py), in bulk.

The source builds `pyarrow` arrays over a batch message's own buffers (no copy, no Python
object per row) and slices the rows a task reads; the sink cuts a partition's Arrow rows
into record batches and lays each one's columns out from the Arrow buffers. Executors
only: it imports pyarrow and numpy, which Spark's Python workers have.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from episub.recordbatch import RecordBatch, encode_columns

__all__ = [
    "BATCH_BYTES",
    "BATCH_ROWS",
    "Chunker",
    "batch_record_batch",
    "page_record_batch",
    "source_schema",
    "to_payload",
]

# A record batch's bounds: rows, and bytes of its payload (under the 1 MiB a message may
# have by default, NodeConfig's max_message_size). Fixed, not options: a retried task must
# cut the same rows into the same batches, whatever the node it runs on.
BATCH_ROWS = 4096
BATCH_BYTES = 960 * 1024
# Payload bytes a row costs beyond its key, value and headers (a stamp and three offsets),
# and each header beyond its name and value (two offsets).
_ROW_OVERHEAD = 8 + 3 * 4 + 1
_HEADER_OVERHEAD = 8
_SCHEMAS: dict[bool, pa.Schema] = {}


def source_schema(include_headers: bool) -> pa.Schema:
    """The Arrow schema Spark expects of the source's batches (datasource.SCHEMA)."""
    if include_headers not in _SCHEMAS:
        from pyspark.sql.pandas.types import to_arrow_schema
        from pyspark.sql.types import (
            ArrayType,
            BinaryType,
            LongType,
            StringType,
            StructField,
            StructType,
            TimestampType,
        )

        fields = [
            StructField("topic", StringType()),
            StructField("publisher", StringType()),
            StructField("seq", LongType()),
            StructField("timestamp", TimestampType()),
            StructField("key", BinaryType()),
            StructField("value", BinaryType()),
        ]
        if include_headers:
            entry = StructType(
                [StructField("key", StringType()), StructField("value", BinaryType())]
            )
            fields.append(StructField("headers", ArrayType(entry)))
        _SCHEMAS[include_headers] = to_arrow_schema(StructType(fields), timezone="UTC")
    return _SCHEMAS[include_headers]


def _repeated(text: str, n: int) -> pa.Array:
    data = text.encode("utf-8")
    offsets = np.arange(n + 1, dtype=np.int32) * len(data)
    return pa.Array.from_buffers(
        pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data * n)]
    )


def _buffer(view: memoryview) -> pa.Buffer:
    return pa.py_buffer(view)


def batch_record_batch(
    topic: str,
    publisher: str,
    batch: RecordBatch,
    first_row: int,
    last_row: int,
    schema: pa.Schema,
) -> pa.RecordBatch | None:
    """The rows first_row..last_row that `batch` holds, as Arrow (None: it holds none)."""
    low = max(first_row, batch.first_row) - batch.first_row
    high = min(last_row + 1, batch.end_row) - batch.first_row
    if high <= low:
        return None
    offsets = np.arange(batch.first_row + low, batch.first_row + high, dtype=np.int64)
    return _rows(topic, publisher, batch, low, high, offsets, schema)


def page_record_batch(
    topic: str, publisher: str, rows: RecordBatch, seqs: memoryview, schema: pa.Schema
) -> pa.RecordBatch:
    """A page of plain messages read as columns (the agent's ReadRange `as_rows`: one
    record batch, each row's seq beside it) as Arrow, over the page's own bytes."""
    offsets = np.frombuffer(seqs, dtype="<i8").astype(np.int64, copy=False)
    return _rows(topic, publisher, rows, 0, rows.rows, offsets, schema)


def _rows(
    topic: str,
    publisher: str,
    batch: RecordBatch,
    low: int,
    high: int,
    offsets: np.ndarray,
    schema: pa.Schema,
) -> pa.RecordBatch:
    """Rows low..high-1 of `batch` as Arrow, `offsets` their offset column."""
    n, b, count = batch.rows, batch.buffers, high - low
    stamps = np.frombuffer(b[0], dtype="<i8")[low:high] * 1000
    key = pa.Array.from_buffers(
        pa.binary(), n, [_buffer(b[1]) if n else None, _buffer(b[2]), _buffer(b[3])]
    ).slice(low, count)
    value = pa.Array.from_buffers(pa.binary(), n, [None, _buffer(b[4]), _buffer(b[5])])
    columns = [
        _repeated(topic, count),
        _repeated(publisher, count),
        pa.array(offsets),
        pa.array(stamps, type=schema.field("timestamp").type),
        key,
        value.slice(low, count),
    ]
    if len(schema) == 7:
        list_type = schema.field("headers").type
        entries = len(b[7]) // 4 - 1
        names = pa.Array.from_buffers(pa.string(), entries, [None, _buffer(b[7]), _buffer(b[8])])
        values = pa.Array.from_buffers(pa.binary(), entries, [None, _buffer(b[9]), _buffer(b[10])])
        struct = pa.StructArray.from_arrays([names, values], fields=list(list_type.value_type))
        headers = pa.Array.from_buffers(list_type, n, [None, _buffer(b[6])], children=[struct])
        columns.append(headers.slice(low, count))
    return pa.RecordBatch.from_arrays(columns, schema=schema)


# -- the sink: Arrow rows into record batches ---------------------------------------------------


def _binary(array: pa.Array) -> pa.Array:
    """A string or binary column as binary with int32 offsets (nulls as empty)."""
    if pa.types.is_large_string(array.type) or pa.types.is_large_binary(array.type):
        array = array.cast(pa.binary())
    elif pa.types.is_string(array.type):
        array = array.view(pa.binary())
    if array.null_count:
        array = pc.fill_null(array, b"")
    return array


def _offsets_and_data(array: pa.Array) -> tuple[np.ndarray, memoryview]:
    """A binary column's offsets (from 0) and the bytes they index."""
    n = len(array)
    buffers = array.buffers()
    if buffers[1] is None:
        return np.zeros(n + 1, dtype=np.int32), memoryview(b"")
    offsets = np.frombuffer(buffers[1], dtype="<i4", count=array.offset + n + 1)[array.offset :]
    start, end = int(offsets[0]), int(offsets[-1])
    data = memoryview(buffers[2]) if buffers[2] is not None else memoryview(b"")
    return (offsets - start).astype("<i4", copy=False), data[start:end]


def _header_entries(headers: pa.Array | None, n: int) -> tuple[np.ndarray, pa.Array, pa.Array]:
    """Row offsets into the header entries, and the entries' names and values."""
    if headers is None:
        empty = pa.array([], pa.binary())
        return np.zeros(n + 1, dtype=np.int32), empty, empty
    raw = headers.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
    if isinstance(headers.type, pa.MapType):
        names, values = headers.keys, headers.items
    else:
        names, values = headers.values.field(0), headers.values.field(1)
    lengths = np.diff(raw)
    if headers.null_count:
        null = headers.is_null().to_numpy(zero_copy_only=False)
        if lengths[null].any():  # a null row over entries (Arrow allows it): drop them
            keep = np.repeat(~null, lengths)
            names = names.slice(raw[0], raw[-1] - raw[0]).filter(pa.array(keep))
            values = values.slice(raw[0], raw[-1] - raw[0]).filter(pa.array(keep))
            lengths = np.where(null, 0, lengths)
            raw = np.concatenate([[0], np.cumsum(lengths)])
    names = names.slice(int(raw[0]), int(raw[-1] - raw[0]))
    values = values.slice(int(raw[0]), int(raw[-1] - raw[0]))
    offsets = (raw - raw[0]).astype(np.int32)
    return offsets, _binary(names), _binary(values)


def row_sizes(value: pa.Array, key: pa.Array | None, headers: pa.Array | None) -> np.ndarray:
    """Each row's bytes in a payload, to cut batches by size."""
    v, _ = _offsets_and_data(_binary(value))
    sizes = np.diff(v).astype(np.int64) + _ROW_OVERHEAD
    if key is not None:
        k, _ = _offsets_and_data(_binary(key))
        sizes += np.diff(k)
    if headers is not None:
        offsets, names, values = _header_entries(headers, len(value))
        no, _ = _offsets_and_data(names)
        vo, _ = _offsets_and_data(values)
        entry = np.zeros(len(names) + 1, dtype=np.int64)
        np.cumsum(np.diff(no) + np.diff(vo) + _HEADER_OVERHEAD, out=entry[1:])
        sizes += entry[offsets[1:]] - entry[offsets[:-1]]
    return sizes


def to_payload(
    first_row: int,
    stamp_ms: int,
    value: pa.Array,
    key: pa.Array | None,
    headers: pa.Array | None,
) -> bytes:
    """One record batch of the rows of these columns (value, key: binary or string; headers:
    list<struct<key, value>> or map), every row stamped `stamp_ms`."""
    n = len(value)
    if value.null_count:
        raise ValueError("a row's 'value' is null: every published row needs one")
    value_offsets, value_data = _offsets_and_data(_binary(value))
    if key is None:
        validity = bytes(-(-n // 8))
        key_offsets, key_data = np.zeros(n + 1, dtype=np.int32), memoryview(b"")
    else:
        valid = key.is_valid().to_numpy(zero_copy_only=False)
        validity = np.packbits(valid, bitorder="little").tobytes()
        key_offsets, key_data = _offsets_and_data(_binary(key))
    header_offsets, names, values = _header_entries(headers, n)
    name_offsets, name_data = _offsets_and_data(names)
    hv_offsets, hv_data = _offsets_and_data(values)
    stamps = np.full(n, stamp_ms, dtype="<i8")
    return encode_columns(
        first_row,
        n,
        [
            stamps.tobytes(),
            validity,
            key_offsets.tobytes(),
            key_data,
            value_offsets.tobytes(),
            value_data,
            header_offsets.astype("<i4").tobytes(),
            name_offsets.tobytes(),
            name_data,
            hv_offsets.tobytes(),
            hv_data,
        ],
    )


class Chunker:
    """Cuts a stream of Arrow rows (value, key, headers columns) into record batches of at
    most `max_rows` rows and `max_bytes` bytes, greedily and by the rows alone: the same rows
    give the same batches however Spark split them into Arrow batches (a retried task writes
    the very same messages)."""

    def __init__(self, max_rows: int = BATCH_ROWS, max_bytes: int = BATCH_BYTES) -> None:
        self.max_rows = max_rows
        self.max_bytes = max_bytes
        self._pending: list[pa.RecordBatch] = []
        self._rows = 0
        self._bytes = 0

    def add(self, rows: pa.RecordBatch) -> Iterator[pa.RecordBatch]:
        """Feed rows (columns value, key, headers; key and headers may be all null); yields
        each batch that is complete."""
        sizes = row_sizes(
            rows.column("value"),
            rows.column("key") if "key" in rows.schema.names else None,
            rows.column("headers") if "headers" in rows.schema.names else None,
        )
        at, n = 0, rows.num_rows
        while at < n:
            room = self.max_rows - self._rows
            sums = np.cumsum(sizes[at : at + room])
            take = int(np.searchsorted(sums, self.max_bytes - self._bytes, side="right"))
            if take == 0:
                if self._rows:
                    yield self._flush()
                    continue
                take = 1  # one row over the bound goes alone (the node says if too large)
            self._pending.append(rows.slice(at, take))
            self._rows += take
            self._bytes += int(sums[take - 1])
            at += take
            if at < n or self._rows >= self.max_rows:
                yield self._flush()

    def finish(self) -> Iterator[pa.RecordBatch]:
        if self._rows:
            yield self._flush()

    def _flush(self) -> pa.RecordBatch:
        table = pa.Table.from_batches(self._pending).combine_chunks()
        self._pending, self._rows, self._bytes = [], 0, 0
        batches = table.to_batches()
        if len(batches) == 1:
            return batches[0]
        return pa.RecordBatch.from_arrays(
            [pa.concat_arrays([b.column(i) for b in batches]) for i in range(table.num_columns)],
            schema=table.schema,
        )
