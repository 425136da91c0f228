"""seq -> row: where one publisher's messages are held, in 8 bytes a message.

The message store (store.py) finds a message by its publisher's sequence number. A dict
of int keys to int values costs ~90 bytes an entry (the entry, an int object per key and
per value); a publisher's stream is dense (seqs from 0 without gaps, arriving roughly in
order), so an `array` of rows indexed by seq - low costs 8. A peer chooses the seqs,
though: when the seqs held spread out (more than twice as many slots as held seqs, past
a floor), the index turns into a dict, until it is empty again. Memory stays O(held)
either way.

A plain data structure: no clock, no I/O. Rows are non-negative ints (-1 marks a hole).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator

__all__ = ["SeqIndex"]

_HOLE = -1
_DENSE_FLOOR = 64  # slots a dense index may always span, whatever it holds
# Seqs a sparse index steps past to find its new lowest or highest before it looks at all
# of them. Guess: the gaps a stream's held messages leave are short.
_SPARSE_WALK = 64


class SeqIndex:
    """Held seqs and their rows; `low`/`high` are the lowest and highest held (when any)."""

    __slots__ = ("_head", "_rows", "_sparse", "count", "high", "low")

    def __init__(self) -> None:
        self._rows = array("q")  # dense: the row of seq low + i - _head at i (or _HOLE)
        self._head = 0  # dense: index of `low` in _rows (the slots before it are spent)
        self._sparse: dict[int, int] | None = None
        self.count = 0
        self.low = 0
        self.high = -1

    def __len__(self) -> int:
        return self.count

    def get(self, seq: int) -> int | None:
        sparse = self._sparse
        if sparse is not None:
            return sparse.get(seq)
        if not self.low <= seq <= self.high:
            return None
        row = self._rows[self._head + seq - self.low]
        return None if row == _HOLE else row

    def __contains__(self, seq: int) -> bool:
        return self.get(seq) is not None

    def put(self, seq: int, row: int) -> int | None:
        """Hold `seq` at `row`; the row it had in its place, if any."""
        rows = self._rows
        if seq == self.high + 1 and len(rows) == self._head + seq - self.low and self.count:
            rows.append(row)  # the next seq of a dense stream: the common case, first
            self.high = seq
            self.count += 1
            return None
        sparse = self._sparse
        if sparse is not None:
            replaced = sparse.get(seq)
            if replaced is None:
                self.count += 1
                self.low, self.high = min(self.low, seq), max(self.high, seq)
            sparse[seq] = row
            return replaced
        if not self.count:
            del rows[:]
            rows.append(row)
            self._head = 0
            self.low = self.high = seq
            self.count = 1
            return None
        low, high = self.low, self.high
        if low <= seq <= high:
            i = self._head + seq - low
            replaced = rows[i]
            rows[i] = row
            if replaced == _HOLE:
                self.count += 1
                return None
            return replaced
        span = max(high, seq) - min(low, seq) + 1
        if span > 2 * (self.count + 1) + _DENSE_FLOOR:
            self._sparse = dict(self._items())
            self._sparse[seq] = row
            del rows[:]
            self._head = 0
            self.count += 1
            self.low, self.high = min(low, seq), max(high, seq)
            return None
        if seq > high:
            del rows[self._head + high - low + 1 :]  # slots past `high` (left by removals)
            rows.extend(array("q", [_HOLE]) * (seq - high - 1))
            rows.append(row)
            self.high = seq
        else:
            gap = low - seq
            if gap <= self._head:  # room in the spent slots before `low`
                self._head -= gap
                rows[self._head] = row
            else:
                del rows[: self._head]
                rows[0:0] = array("q", [row]) + array("q", [_HOLE]) * (gap - 1)
                self._head = 0
            self.low = seq
        self.count += 1
        return None

    def remove(self, seq: int) -> None:
        """Forget `seq` (held)."""
        self.count -= 1
        sparse = self._sparse
        if sparse is not None:
            del sparse[seq]
            if not sparse:
                self._sparse = None
                self.low, self.high = 0, -1
            elif seq == self.low:
                self.low = _next_held(sparse, seq, 1)
            elif seq == self.high:
                self.high = _next_held(sparse, seq, -1)
            return
        rows = self._rows
        rows[self._head + seq - self.low] = _HOLE
        if not self.count:
            del rows[:]
            self._head, self.low, self.high = 0, 0, -1
            return
        if seq == self.low:  # walk to the next held one: each slot is passed once
            i = self._head + 1
            while rows[i] == _HOLE:
                i += 1
            self.low += i - self._head
            self._head = i
            if i > 1024 and 2 * i > len(rows):  # give the spent slots back
                del rows[:i]
                self._head = 0
        elif seq == self.high:
            i = self._head + seq - self.low - 1
            while rows[i] == _HOLE:
                i -= 1
            self.high = self.low + i - self._head
            del rows[i + 1 :]

    def _items(self) -> Iterator[tuple[int, int]]:
        """(seq, row) of every held seq, in seq order when dense."""
        if self._sparse is not None:
            yield from self._sparse.items()
            return
        rows, head, low = self._rows, self._head, self.low
        for i in range(head, head + self.high - low + 1):
            row = rows[i]
            if row != _HOLE:
                yield low + i - head, row

    def rows_in(self, first: int, last: int) -> list[tuple[int, int]]:
        """(seq, row) of the held seqs first..last, in seq order."""
        low, high = max(first, self.low), min(last, self.high)
        if low > high or not self.count:
            return []
        sparse = self._sparse
        if sparse is not None:
            if high - low + 1 <= len(sparse):
                return [(s, sparse[s]) for s in range(low, high + 1) if s in sparse]
            return sorted((s, r) for s, r in sparse.items() if low <= s <= high)
        rows, offset = self._rows, self._head - self.low
        return [(s, rows[s + offset]) for s in range(low, high + 1) if rows[s + offset] != _HOLE]

    def next_held(self, seq: int) -> tuple[int, int] | None:
        """(seq, row) of the lowest held seq at or after `seq`; None when none is. Dense: a
        walk over the holes after `seq` (few: a dense stream is mostly held); sparse: O(held)."""
        if not self.count or seq > self.high:
            return None
        seq = max(seq, self.low)
        sparse = self._sparse
        if sparse is not None:
            found = min((s for s in sparse if s >= seq), default=None)
            return None if found is None else (found, sparse[found])
        rows, offset = self._rows, self._head - self.low
        while rows[seq + offset] == _HOLE:  # `high` is held: the walk ends there at the latest
            seq += 1
        return seq, rows[seq + offset]

    def seqs(self) -> Iterator[tuple[int, int]]:
        """(seq, row) of every held seq (in seq order when dense)."""
        return self._items()


def _next_held(sparse: dict[int, int], seq: int, step: int) -> int:
    """The held seq nearest `seq` in the direction of `step`: a few steps when it is near
    (a stream's oldest dropped one after another, as the store drops them), else a pass over
    every held one (min or max). Not that pass every time: dropping the lowest of many held
    seqs in turn was quadratic."""
    for _ in range(_SPARSE_WALK):
        seq += step
        if seq in sparse:
            return seq
    return min(sparse) if step > 0 else max(sparse)
