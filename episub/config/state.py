"""A replicated key-value configuration: one replica's state, plain data, no I/O.

Rules (checked by tests/test_config_state.py):
- Every write carries a *stamp* (version, writer id). A key takes the value of the highest
  stamp it has seen, compared as (version, writer) tuples: last writer wins by version, and
  a tie between two writers is broken by the larger writer id. Deletes are values too
  (tombstones), so a late or replayed older write can never bring a deleted key back.
- A replica's version means "I hold every write up to here": its values are exactly
  those of the writes stamped 1..version (with one writer at a time; two writers racing on
  one version are told apart by writer id, and a replica that holds one of them counts the
  version as held). It never goes backwards and never advances past a gap.
- An update above version + 1 is kept aside (pending, bounded) until the versions under it
  arrive or a snapshot covers them, then applied in order; `top` is the highest version
  this replica knows exists (pending updates, snapshots, versions peers report), so
  `behind` (top > version) says the replica knows it lacks something, and `lag` how much.
- A snapshot carries its sender's version: merging it is applying each of its entries by
  the same rule (state transfer and ordinary updates obey one rule), and it moves the
  version to the sender's only when that is above ours (an older snapshot is ignored).
- A writer stamps its write with version + 1, so versions order writes causally (a writer
  that saw version v writes above it) and concurrent writers collide only on ties, which
  the writer id breaks the same way everywhere: every replica that has applied the same
  set of writes, in any order, holds the same snapshot.
- Bounded: `max_keys` keys (tombstones included) and `max_bytes` of keys plus values. A
  local write past a bound is refused with ConfigLimitError; a peer's entry past a bound
  is dropped and counted (`rejected`), never raised. Pending updates are bounded as well
  (MAX_PENDING_UPDATES, max_bytes); one past a bound is dropped and counted
  (`pending_dropped`): the version it stands for stays missing, for a snapshot to cover.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "MAX_CONFIG_BYTES",
    "MAX_CONFIG_KEYS",
    "MAX_KEY_LENGTH",
    "MAX_PENDING_UPDATES",
    "ConfigLimitError",
    "ConfigState",
    "Entry",
    "Kind",
    "Stamp",
]

# The whole snapshot travels in one message to a late joiner, so it must fit in the node's
# max_message_size (1 MiB by default); entries are counted at their encoded size (Entry.size),
# so half of that leaves room for a smaller configured limit.
MAX_CONFIG_BYTES = 512 * 1024
MAX_CONFIG_KEYS = 10_000  # guess: feature flags and thresholds, not a database
MAX_KEY_LENGTH = 256  # guess: longer than any dotted Spark conf name
# Updates kept aside above a gap; guess: a 60 s partition of a writer writing twice a
# second. Past it, the gap is filled by a snapshot, which the replica asks for anyway.
MAX_PENDING_UPDATES = 128
ENTRY_OVERHEAD = 32  # an entry's JSON punctuation, kind and version, rounded up

Kind = Literal["json", "bytes", "deleted"]
KINDS = ("json", "bytes", "deleted")
Stamp = tuple[int, bytes]  # (version, writer id)


class ConfigLimitError(ValueError):
    """A local write the configuration's bounds refuse; nothing of it was applied."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One key's value: `data` is JSON text (kind "json"), raw bytes, or b"" when deleted."""

    version: int
    writer: bytes
    kind: Kind
    data: bytes

    def __post_init__(self) -> None:
        if not isinstance(self.version, int) or self.version < 1:
            raise ValueError(f"an entry's version must be an int >= 1, not {self.version!r}")
        if self.kind not in KINDS:
            raise ValueError(f"an entry's kind must be one of {KINDS}, not {self.kind!r}")
        if self.kind == "deleted" and self.data:
            raise ValueError("a deleted entry carries no data")

    @classmethod
    def checked(cls, version: int, writer: bytes, kind: Kind, data: bytes) -> Entry:
        """An entry from parts a decoder has checked already (episub.config.codec): made
        without checking them again, on the path of every update."""
        entry = object.__new__(cls)
        setattr_ = object.__setattr__  # frozen: the dataclass's own __init__ does the same
        setattr_(entry, "version", version)
        setattr_(entry, "writer", writer)
        setattr_(entry, "kind", kind)
        setattr_(entry, "data", data)
        return entry

    @property
    def stamp(self) -> Stamp:
        return (self.version, self.writer)

    @property
    def size(self) -> int:
        """Its bytes in a snapshot message, near enough: data as sent (base64 grows bytes
        by a third), the writer id in hex, and the JSON around them."""
        return _cost("", self)


def check_key(key: object) -> str:
    if not isinstance(key, str) or not 1 <= len(key) <= MAX_KEY_LENGTH:
        raise ValueError(
            f"a config key must be a str of 1..{MAX_KEY_LENGTH} chars, not {key!r:.80}"
        )
    return key


class ConfigState:
    """One replica: key -> Entry, plus the highest version applied."""

    def __init__(
        self, *, max_keys: int = MAX_CONFIG_KEYS, max_bytes: int = MAX_CONFIG_BYTES
    ) -> None:
        self.max_keys = max_keys
        self.max_bytes = max_bytes
        self._entries: dict[str, Entry] = {}
        self._costs: dict[str, int] = {}  # key -> what its entry counts against max_bytes
        self._bytes = 0
        self.version = 0  # every write up to here is held, none above it applied
        self.top = 0  # the highest version known to exist
        # version -> the updates stamped with it, above a gap (several on a writers' tie)
        self._pending: dict[int, list[Mapping[str, Entry]]] = {}
        self._pending_bytes = 0
        self.rejected = 0  # peer entries dropped by a bound
        self.pending_dropped = 0  # updates above a gap not kept (past the pending bounds)

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def size(self) -> int:
        """Bytes of keys and entries held, as the max_bytes bound counts them."""
        return self._bytes

    def entries(self) -> dict[str, Entry]:
        """Every key, tombstones included (what a snapshot for a neighbour carries)."""
        return dict(self._entries)

    def values(self) -> dict[str, Entry]:
        """The live keys: what `snapshot()` shows an application."""
        return {k: e for k, e in self._entries.items() if e.kind != "deleted"}

    def get(self, key: str) -> Entry | None:
        entry = self._entries.get(key)
        return None if entry is None or entry.kind == "deleted" else entry

    @property
    def behind(self) -> bool:
        """Whether this replica knows of a version it does not hold yet."""
        return self.top > self.version

    @property
    def lag(self) -> int:
        """How many versions this replica knows of but does not hold (0: caught up)."""
        return self.top - self.version

    def missing(self, limit: int = 8) -> list[int]:
        """The lowest versions (at most `limit`) under `top` that nothing here holds."""
        out: list[int] = []
        version = self.version + 1
        while version <= self.top and len(out) < limit:
            if version not in self._pending:
                out.append(version)
            version += 1
        return out

    def stamp_for_write(self, writer: bytes) -> Stamp:
        """The stamp a local write takes: above every version this replica knows of."""
        return (self.top + 1, writer)

    def note_version(self, version: int) -> None:
        """A peer reports holding `version` (a sync request, a snapshot's sender)."""
        if version > self.top:
            self.top = version

    def apply_update(self, version: int, changes: Mapping[str, Entry]) -> list[str]:
        """One write stamped `version`: applied if it is the next version (then any pending
        ones it unblocks) or at or under ours (a duplicate, or a writer's tie), else kept
        aside until the gap under it fills. Returns the keys whose entry changed."""
        self.note_version(version)
        if version > self.version + 1:
            self._keep_pending(version, changes)
            return []
        changed = self._merge(changes.items())
        if version == self.version + 1:
            self.version = version
            changed += self._apply_pending()
        return changed

    def merge_snapshot(self, version: int, entries: Mapping[str, Entry]) -> list[str]:
        """A peer's whole state as of its `version`: merged if that is above ours, the
        version moved up to it, and pending updates it unblocks applied; else ignored
        (everything in it is held here already). Returns the keys whose entry changed.
        A snapshot without entries answered replicas that held its version already (its
        sender leaves the entries out then), and reaches every replica of the topic: it
        says that the version exists, not what it holds, so it moves `top` only."""
        self.note_version(version)
        if version <= self.version or not entries:
            return []
        changed = self._merge(entries.items())
        self.version = version
        for stale in [v for v in self._pending if v <= version]:
            self._drop_pending(stale)
        return changed + self._apply_pending()

    def _keep_pending(self, version: int, changes: Mapping[str, Entry]) -> None:
        if changes in self._pending.get(version, ()):
            return  # a duplicate
        cost = sum(_cost(k, e) for k, e in changes.items())
        count = sum(len(updates) for updates in self._pending.values())
        if count >= MAX_PENDING_UPDATES or self._pending_bytes + cost > self.max_bytes:
            self.pending_dropped += 1
            return
        self._pending.setdefault(version, []).append(changes)
        self._pending_bytes += cost

    def _drop_pending(self, version: int) -> list[Mapping[str, Entry]]:
        updates = self._pending.pop(version)
        self._pending_bytes -= sum(_cost(k, e) for u in updates for k, e in u.items())
        return updates

    def _apply_pending(self) -> list[str]:
        changed = []
        while self.version + 1 in self._pending:
            for changes in self._drop_pending(self.version + 1):
                changed += self._merge(changes.items())
            self.version += 1
        return changed

    def check_write(self, changes: Mapping[str, Entry]) -> None:
        """Raise ConfigLimitError if applying `changes` (a local write) would break a bound."""
        keys = len(self._entries) + sum(1 for k in changes if k not in self._entries)
        if keys > self.max_keys:
            raise ConfigLimitError(
                f"the configuration would hold {keys} keys (deleted ones included), "
                f"more than its limit of {self.max_keys}"
            )
        size = self._bytes
        for key, entry in changes.items():
            size += _cost(key, entry) - self._costs.get(key, 0)
        if size > self.max_bytes:
            raise ConfigLimitError(
                f"the configuration would hold {size} bytes of keys and values, more than "
                f"its limit of {self.max_bytes}"
            )

    def _merge(self, changes: Iterable[tuple[str, Entry]]) -> list[str]:
        """Apply entries by the highest-stamp rule; returns the keys whose entry changed.
        The version is the caller's to move (apply_update, merge_snapshot)."""
        changed = []
        entries = self._entries
        costs = self._costs
        for key, entry in changes:
            old = entries.get(key)
            if old is not None and (old.version, old.writer) >= (entry.version, entry.writer):
                continue
            cost = _cost(key, entry)
            growth = cost if old is None else cost - costs[key]
            if (old is None and len(entries) >= self.max_keys) or (
                self._bytes + growth > self.max_bytes
            ):
                self.rejected += 1
                continue
            entries[key] = entry
            costs[key] = cost
            self._bytes += growth
            changed.append(key)
        return changed


def _cost(key: str, entry: Entry) -> int:
    """What `key` and `entry` count against max_bytes: len(key.encode()) + entry.size, in
    line (it runs once per key of every update; ConfigState keeps what each key counts)."""
    data = entry.data
    size = len(data) if entry.kind != "bytes" else 4 * ((len(data) + 2) // 3)
    return len(key.encode()) + size + 2 * len(entry.writer) + ENTRY_OVERHEAD
