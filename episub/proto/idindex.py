"""id -> row: the message ids a node has seen, in ~50 bytes an id instead of ~165.

The message store (store.py) numbers the messages it takes in by serial, in arrival
order, and must answer "seen this id?" for every copy that arrives and "which row?" for
the ones it holds. A dict of id to serial costs ~165 bytes an id: the id as a bytes
object (32 bytes, 80 with its header), the dict's entry and index (~50 at the sizes it
keeps), and an int object per serial (32). Seen holds up to a million ids by default
(`seen_max`), so that is up to ~165 MB.

Here the ids are packed in one bytearray, 32 bytes a row (row = serial - base), with
the low 32 bits of each id's `hash()` in an array beside it, and found through an
open-addressing table of serials (an `array` of 4-byte slots, linear probing, a quarter
to a half full): 32 + 4 + 8..16 bytes an id. A lookup compares hashes first and the
full 32 bytes only when they match, so two ids never stand for one another whatever
their bytes share. `hash()` of bytes is keyed per process (SipHash), so a peer cannot
choose ids that crowd one run of slots. Removal shifts the run back (no tombstones), so
a table that ids flow through keeps its probe lengths. A lookup costs ~0.25 us against
a dict's ~0.05: the price of the memory, paid back elsewhere on the same path (see
docs/operations.md, "Memory").

The id of a row stays in the columns until `drop_before` passes it (the caller removes
rows oldest first, then gives their room back in one step, as its other columns do).
A plain data structure: no clock, no I/O.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator

from episub.proto.envelope import MessageId
from episub.proto.messages import MESSAGE_ID_SIZE

__all__ = ["IdIndex"]

_WIDTH = MESSAGE_ID_SIZE
# A slot holds a serial modulo _MOD (4 bytes; a row is (slot - base) % _MOD, as rows span
# far fewer than _MOD serials); _MOD itself marks an empty slot.
_MOD = 2**32 - 1
_EMPTY = _MOD
_LOW = 2**32 - 1  # the bits of an id's hash kept: table sizes stay far below 2**32
_MIN_SLOTS = 8


class IdIndex:
    """The serials of held ids, rows numbered from `base` to `next` - 1 (see the module)."""

    __slots__ = ("_hashes", "_ids", "_mask", "_slots", "base", "count", "next")

    def __init__(self) -> None:
        self._ids = bytearray()  # row r's id at r * _WIDTH (r = serial - base)
        self._hashes = array("I")  # row r's hash(id) & _LOW (a slot's index needs no more)
        self._slots = array("I", [_EMPTY]) * _MIN_SLOTS  # serials % _MOD, or _EMPTY
        self._mask = _MIN_SLOTS - 1
        self.base = 0  # serial of row 0
        self.next = 0  # serial the next id gets
        self.count = 0  # ids held

    def __len__(self) -> int:
        return self.count

    def __contains__(self, mid: object) -> bool:
        # find's loop, repeated: `mid in seen` runs for every copy that arrives
        h = hash(mid) & _LOW
        slots, mask = self._slots, self._mask
        i = h & mask
        s = slots[i]
        while s != _EMPTY:
            r = (s - self.base) % _MOD
            if self._hashes[r] == h and self._ids[r * _WIDTH : r * _WIDTH + _WIDTH] == mid:
                return True
            i = (i + 1) & mask
            s = slots[i]
        return False

    def __iter__(self) -> Iterator[MessageId]:
        """The ids held, oldest row first."""
        base = self.base
        for r in sorted((s - base) % _MOD for s in self._slots if s != _EMPTY):
            yield self.id_of(base + r)

    def find(self, mid: MessageId) -> int:
        """The serial `mid` is held at, or -1."""
        h = hash(mid) & _LOW
        slots, mask = self._slots, self._mask
        i = h & mask
        s = slots[i]
        while s != _EMPTY:
            r = (s - self.base) % _MOD
            if self._hashes[r] == h and self._ids[r * _WIDTH : r * _WIDTH + _WIDTH] == mid:
                return self.base + r
            i = (i + 1) & mask
            s = slots[i]
        return -1

    def add(self, mid: MessageId) -> int:
        """Hold `mid` at the next serial and return it; if `mid` is held already, nothing
        changes and the result is -1 - its serial (one probe does both)."""
        if len(mid) != _WIDTH:
            raise ValueError(f"message id must be {_WIDTH} bytes, not {len(mid)}")
        if 2 * (self.count + 1) > len(self._slots):
            self._resize(2 * len(self._slots))
        h = hash(mid) & _LOW
        slots, mask = self._slots, self._mask
        i = h & mask
        s = slots[i]
        while s != _EMPTY:
            r = (s - self.base) % _MOD
            if self._hashes[r] == h and self._ids[r * _WIDTH : r * _WIDTH + _WIDTH] == mid:
                return -1 - (self.base + r)
            i = (i + 1) & mask
            s = slots[i]
        self._ids += mid
        serial = self.next
        slots[i] = serial % _MOD
        self.next = serial + 1
        self._hashes.append(h)
        self.count += 1
        return serial

    def append(self, mid: MessageId) -> int:
        """Number a row for `mid` without holding it: the row's id is kept (`id_of`) but not
        found (`find`, `in`), and `remove` of it says it was not held."""
        if len(mid) != _WIDTH:
            raise ValueError(f"message id must be {_WIDTH} bytes, not {len(mid)}")
        self._ids += mid
        self._hashes.append(0)
        serial = self.next
        self.next = serial + 1
        return serial

    def id_of(self, serial: int) -> MessageId:
        """The id of row `serial` (held, or removed but not yet dropped)."""
        r = (serial - self.base) * _WIDTH
        return bytes(self._ids[r : r + _WIDTH])

    def remove(self, serial: int) -> bool:
        """Hold row `serial`'s id no more; False when it was not held (removed before)."""
        slots, mask, hashes, base = self._slots, self._mask, self._hashes, self.base
        i = hashes[serial - base] & mask
        held = serial % _MOD
        s = slots[i]
        while s != held:
            if s == _EMPTY:
                return False
            i = (i + 1) & mask
            s = slots[i]
        # Shift the rest of the run back over the hole: a slot's serial moves to the hole
        # unless its home slot lies after the hole (cyclically, up to where it is).
        j = i
        while True:
            j = (j + 1) & mask
            s = slots[j]
            if s == _EMPTY:
                break
            k = hashes[(s - base) % _MOD] & mask
            if (k <= i or k > j) if i < j else (j < k <= i):
                slots[i] = s
                i = j
        slots[i] = _EMPTY
        self.count -= 1
        if 8 * self.count < len(slots) and len(slots) > _MIN_SLOTS:
            self._resize(len(slots) // 2)
        return True

    def drop_before(self, serial: int) -> None:
        """Give back the rows before `serial` (every one removed)."""
        n = serial - self.base
        if n > 0:
            del self._ids[: n * _WIDTH]
            del self._hashes[:n]
            self.base = serial

    def _resize(self, size: int) -> None:
        """Move every held serial to a table of `size` slots: O(slots), at a doubling or a
        halving, so O(1) an id on average."""
        old = self._slots
        slots = self._slots = array("I", [_EMPTY]) * size
        mask = self._mask = size - 1
        hashes, base = self._hashes, self.base
        for s in old:
            if s != _EMPTY:
                i = hashes[(s - base) % _MOD] & mask
                while slots[i] != _EMPTY:
                    i = (i + 1) & mask
                slots[i] = s
