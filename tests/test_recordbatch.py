"""The record-batch payload format (episub/recordbatch.py): what goes in comes out, and
whatever bytes arrive, decoding either checks them or fails with BatchFormatError."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from episub.recordbatch import (
    BATCH_HEADER,
    BatchFormatError,
    RecordBatch,
    encode,
    is_batch,
)

ROW = st.tuples(
    st.integers(min_value=-(1 << 62), max_value=1 << 62),
    st.none() | st.binary(max_size=20),
    st.binary(max_size=40),
    st.lists(st.tuples(st.text(max_size=8), st.binary(max_size=8)), max_size=3).map(tuple),
)


def test_rows_come_back_with_their_offsets_keys_values_and_headers() -> None:
    rows = [
        (1000, None, b"a", ()),
        (1001, b"k", b"", (("h", b"1"), ("\u00e9", b""))),
        (1002, b"", b"ccc", ()),
    ]
    batch = RecordBatch.decode(encode(40, rows))
    assert (batch.first_row, batch.rows, batch.end_row) == (40, 3, 43)
    got = [(r.offset, r.timestamp_ms, r.key, r.value, r.headers) for r in batch]
    assert got == [(40 + i, *row) for i, row in enumerate(rows)]
    assert [r.offset for r in batch.rows_between(41, 99)] == [41, 42]
    assert list(batch.rows_between(0, 39)) == []


def test_an_empty_batch_and_the_marker() -> None:
    batch = RecordBatch.decode(encode(7, []))
    assert (batch.first_row, batch.rows, list(batch)) == (7, 0, [])
    assert is_batch([("x", b""), (BATCH_HEADER, b"1")])
    assert not is_batch([("x", b"")])


@given(st.integers(min_value=0, max_value=1 << 40), st.lists(ROW, max_size=30))
def test_any_rows_round_trip(first: int, rows: list) -> None:
    batch = RecordBatch.decode(encode(first, rows))
    assert [(r.timestamp_ms, r.key, r.value, r.headers) for r in batch] == rows
    assert [r.offset for r in batch] == list(range(first, first + len(rows)))


@settings(max_examples=300)
@given(st.lists(ROW, min_size=1, max_size=5), st.data())
def test_a_damaged_payload_decodes_checked_or_fails_with_one_error(rows: list, data) -> None:  # type: ignore[no-untyped-def]
    payload = bytearray(encode(3, rows))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(payload) - 1))
        payload[at] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(payload)))
    try:
        batch = RecordBatch.decode(bytes(payload[:cut]))
    except BatchFormatError:
        return
    for row in batch:  # every slice a checked batch gives is in bounds
        assert isinstance(row.value, bytes)


def test_offsets_past_the_data_fail() -> None:
    payload = bytearray(encode(0, [(0, None, b"abc", ())]))
    # The value offsets are buffer 4: make the last one point past the data.
    lengths = struct.unpack_from("<11I", payload, 20)
    at = 64 if 20 + 44 <= 64 else 0
    for i in range(4):
        at += lengths[i]
        at += -at % 8
    struct.pack_into("<i", payload, at + 4, 99)
    with pytest.raises(BatchFormatError, match="values"):
        RecordBatch.decode(bytes(payload))
    with pytest.raises(BatchFormatError, match="magic"):
        RecordBatch.decode(b"X" * 80)
