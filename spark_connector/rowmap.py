"""Row offsets over message seqs: where each row of a stream is (driver side).

A stream's offsets count rows. A plain message is one row whose offset is its seq; a record
batch (episub/recordbatch.py) holds rows first_row..first_row + rows - 1, its header says
which. Nodes say what they hold in seqs (GETHELD), so the planner turns that into rows with
a map of the held messages' headers, read from the driver's node with the values cut to the
header (`read_range(value_prefix=...)`), fetching what it lacks from the holders. The map is
kept between plannings and only new seqs are read; it forgets seqs no longer held.

A stream is one kind or the other: it is taken as batched when its last held message is a
batch (a sink's streams; a bulk publisher's named stream), else as plain (a node's own).
A stream that mixes the two has no row offsets one could tell: MixedStreamError names it
(the planner's, or the task's that meets it).
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from episub.recordbatch import BatchFormatError, is_batch

__all__ = ["HEADER_BYTES", "MixedStreamError", "StreamRows", "mixed", "row_holding"]

HEADER_BYTES = 20  # magic, version, flags, buffer count, rows, first row (recordbatch._HEAD)
_HEAD = struct.Struct("<4sBBHIQ")
READ_TIMEOUT = 2.0  # seconds the driver's node may spend fetching headers it lacks


class MixedStreamError(RuntimeError):
    """A stream carries both plain messages and record batches."""


def mixed(topic: str, publisher: bytes, seq: int, batch: bool) -> MixedStreamError:
    what = (
        "a record batch in a stream of plain messages"
        if batch
        else ("a plain message in a stream of record batches")
    )
    return MixedStreamError(
        f"topic {topic!r}, publisher {publisher.decode('latin-1')!r}: seq {seq} is {what}; a "
        "stream carries one kind or the other (its rows' offsets cannot be told otherwise): "
        "publish record batches on a named stream of their own"
    )


def _header_rows(value: bytes) -> tuple[int, int]:
    if len(value) < HEADER_BYTES:
        raise BatchFormatError("a record batch's header is cut short")
    magic, _version, _flags, _count, rows, first_row = _HEAD.unpack_from(value)
    if magic != b"EPRB":
        raise BatchFormatError("not a record batch (bad magic)")
    return first_row, rows


@dataclass
class StreamRows:
    """The rows of one stream's held messages: plain (offset == seq), or batched."""

    batched: bool = False
    seqs: list[int] = field(default_factory=list)  # held batch messages, ascending
    firsts: list[int] = field(default_factory=list)  # each one's first row
    ends: list[int] = field(default_factory=list)  # each one's row after its last

    def update(
        self,
        client: Any,
        topic: str,
        publisher: bytes,
        first: int,
        last: int,
        holders: Iterable[bytes],
    ) -> None:
        """Learn the messages held first..last (seqs) that are not known yet."""
        holders = tuple(holders)
        if not self.batched and not self.seqs:
            probe = client.read_range(
                topic, publisher, last, last, fetch_timeout=READ_TIMEOUT, holders=holders,
                value_prefix=HEADER_BYTES,
            )  # fmt: skip
            if not probe or not is_batch(probe[0].headers):
                return  # plain: nothing to map
            self.batched = True
        cut = bisect.bisect_left(self.seqs, first)
        del self.seqs[:cut], self.firsts[:cut], self.ends[:cut]
        begin = self.seqs[-1] + 1 if self.seqs else first
        if begin > last:
            return
        found = client.read_range(
            topic, publisher, begin, last, fetch_timeout=READ_TIMEOUT, holders=holders,
            value_prefix=HEADER_BYTES,
        )  # fmt: skip
        for message in found:
            if not is_batch(message.headers):
                raise mixed(topic, publisher, message.seq, batch=False)
            try:
                first_row, rows = _header_rows(message.value)
            except BatchFormatError:
                continue  # its rows are not readable: they count as not held
            if self.ends and first_row < self.ends[-1]:
                continue  # overlaps what goes before it: not a row of this stream's order
            self.seqs.append(message.seq)
            self.firsts.append(first_row)
            self.ends.append(first_row + rows)

    def rows_of(self, first_seq: int, last_seq: int) -> tuple[int, int] | None:
        """The first and last row of the messages first_seq..last_seq (None: none held)."""
        if not self.batched:
            return first_seq, last_seq
        low = bisect.bisect_left(self.seqs, first_seq)
        high = bisect.bisect_right(self.seqs, last_seq) - 1
        if low > high:
            return None
        return self.firsts[low], self.ends[high] - 1

    def row_since(self, since_seq: int, last_row: int) -> int:
        """The first row of the first message at or after `since_seq` (last_row + 1: none)."""
        if not self.batched:
            return since_seq
        i = bisect.bisect_left(self.seqs, since_seq)
        return self.firsts[i] if i < len(self.seqs) else last_row + 1

    def seq_of(self, row: int) -> int:
        """The seq of the message holding `row` (or the first one after it)."""
        if not self.batched:
            return row
        i = bisect.bisect_right(self.ends, row)
        return self.seqs[min(i, len(self.seqs) - 1)] if self.seqs else row


def row_holding(holding: Any, rows: StreamRows) -> Any:
    """A planner Holding in seqs made one in rows (None: no row of it is readable)."""
    found = rows.rows_of(holding.first, holding.last)
    if found is None:
        return None
    first, last = found
    since = holding.since
    since_row = rows.row_since(since, last) if since <= holding.last else last + 1
    return type(holding)(first=first, last=last, holders=holding.holders, since=since_row)
