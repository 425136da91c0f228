"""A configuration replica kept by a running Node: the topic `_episub.config.<name>`.

    replica = ConfigReplica(node, "default", bootstrap=[...])
    await nursery.start(replica.run)          # joined, subscribed; syncing in the background
    await replica.synced.wait()               # a neighbour's snapshot merged (or none to ask)
    version = await replica.write({"threshold": 0.7, "old_flag": DELETE})
    replica.state.get("threshold"); await replica.wait_for(version, timeout=5)

Each write travels as a one-message stream of its own (`write_stream`, seq 0), not on the
writer node's own stream: the node holds a stream's later messages behind an earlier one
still being repaired (IHAVE, GRAFT: a few hundred ms), and a newcomer's first message of a
stream that started before it for `stream_settle`, while the highest-stamp rule makes the
order of writes irrelevant. So a replica applies every write as soon as its first copy
arrives; the price is that a single writer's writes may be applied out of order, so
`wait_for(v)` returning means this replica holds version v or a later one (as with several
writers already), not that every write below v has arrived (a gap is filled within
GAP_GRACE, or by a snapshot).

How a replica catches up without any writer resending (the snapshot's owner is everyone):
- When it starts, and whenever it notices it missed something (an update stamped more than
  one above its version whose gap stays open for GAP_GRACE, or a Lost notice from the
  node), it publishes a sync request naming one neighbour, nearest by RTT first; that
  neighbour publishes its snapshot, which every replica merges (harmless: the same
  highest-stamp rule as updates). With no answer within SYNC_TIMEOUT it names the next
  neighbour; with no neighbour at all it is the first node and has nothing to learn.
- A replica answers sync requests naming it once it has caught up itself (a newcomer
  asking another newcomer then times out and names the next neighbour, instead of taking
  an empty answer for the truth), at most one snapshot per SNAPSHOT_INTERVAL
  (requests arriving meanwhile are answered together by the next one), so a peer naming
  it in a loop costs one bounded message per interval.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Mapping, Sequence

import outcome
import trio

from episub.config.codec import (
    MAX_REQUESTERS,
    ConfigCodecError,
    Snapshot,
    SyncRequest,
    Update,
    decode,
    encode_snapshot,
    encode_sync,
    encode_update,
    entry_for,
)
from episub.config.state import ConfigState, Entry, check_key
from episub.node import Neighbor, Node
from episub.proto.config import CONFIG_TOPIC_PREFIX
from episub.proto.messages import check_topic_name
from episub.subscription import Delivery, Lost

__all__ = [
    "DELETE",
    "GAP_GRACE",
    "SNAPSHOT_INTERVAL",
    "SYNC_TIMEOUT",
    "ConfigReplica",
    "config_topic",
    "write_message",
    "write_stream",
]

log = logging.getLogger("episub.config")

TOPIC_PREFIX = CONFIG_TOPIC_PREFIX  # the core gives these topics their broadcast config
# How long a sync request waits for the named neighbour's snapshot before naming the next:
# a neighbour answers at once, so this is a few RTTs plus a busy Python process's pause.
SYNC_TIMEOUT = 2.0  # guess
# How long a replica whose only neighbours are seeds waits for another before asking a seed.
SEED_GRACE = 1.0  # guess: a few RTTs and a shuffle of a busy Python node
SNAPSHOT_INTERVAL = 0.2  # s between two snapshot answers; guess: 5/s stays cheap at 512 KiB
# How long versions skipped by an update may stay missing before a snapshot is asked for:
# a write that overtook another on its way comes from a separate stream, and the late one
# is repaired by IHAVE + GRAFT within the announcer's flush period plus graft_timeout (up to
# 1.5 + 0.5 s on a config topic, episub/proto/config.py CONFIG_TOPIC_BROADCAST).
GAP_GRACE = 4.0  # guess: about twice that repair
MAX_MISSING_VERSIONS = 4096  # versions tracked as skipped; past it, a snapshot is asked at once


_Waiter = list  # [version, task, deadline]: a wait_for caller's, parked


class _Delete:
    def __repr__(self) -> str:
        return "DELETE"


DELETE = _Delete()  # a write's value that deletes its key


def write_stream(writer: bytes, version: int) -> bytes:
    """The one-message stream a write travels on: unique per (writer, version), <= 64 bytes."""
    return _write_streams_of(writer) + b"%d" % version


def write_message(
    changes: Mapping[str, object], version: int, writer: bytes
) -> tuple[dict[str, Entry], bytes, tuple[bytes, int]]:
    """One write as it goes on the topic: its entries (keys checked, DELETE a tombstone),
    the update's bytes, and the place it takes (a one-message stream of its own)."""
    entries = {
        check_key(k): Entry(version, writer, "deleted", b"")
        if v is DELETE
        else entry_for(v, version, writer)
        for k, v in changes.items()
    }
    return entries, encode_update(version, writer, entries), (write_stream(writer, version), 0)


def _write_streams_of(writer: bytes) -> bytes:
    """What every write stream of `writer` starts with (and no other writer's)."""
    return b"cfg/" + hashlib.blake2b(writer, digest_size=12).hexdigest().encode() + b"/"


def config_topic(name: str) -> str:
    topic = TOPIC_PREFIX + name
    check_topic_name(topic)
    return topic


class ConfigReplica:
    """One configuration `name` on `node` (running). `run` joins and follows the topic."""

    def __init__(
        self,
        node: Node,
        name: str,
        *,
        bootstrap: Sequence[str] = (),
        state: ConfigState | None = None,
        sync_timeout: float = SYNC_TIMEOUT,
    ) -> None:
        self.node = node
        self.name = name
        self.topic = config_topic(name)
        self.bootstrap = list(bootstrap)
        self.state = state or ConfigState()
        self.sync_timeout = sync_timeout
        self.synced = trio.Event()  # set once the first catch-up is over
        self.counters = {"updates": 0, "snapshots_sent": 0, "snapshots_merged": 0, "syncs": 0,
                         "malformed": 0}  # fmt: skip
        # wait_for's callers, parked until the version reaches theirs or their deadline
        # passes: woken by _apply (True) or _timeout_loop (False) directly.
        self._waiters: list[_Waiter] = []
        self._timeouts: trio.CancelScope | None = None  # _timeout_loop's sleep, while running
        self._sync_wanted = trio.Event()
        self._answer_wanted = trio.Event()
        self._snapshot_for_us = trio.Event()
        self._last_answer: dict[str, Entry] = {}  # the last snapshot sent for us
        self._requesters: dict[bytes, int] = {}  # sync requests to answer: id -> its version
        self._missing: dict[int, float] = {}  # versions an update skipped -> when noticed
        self._gap_noticed = trio.Event()
        # Our own writes come back from the node as its deliveries: applied when made, they
        # are recognised by their stream, without decoding them again.
        self._me = node.id
        self._own_writes = _write_streams_of(self._me)

    # -- running ---------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen, join, then apply what arrives until cancelled; syncs in between."""
        # A listener, not a subscription: each message is applied as the node delivers
        # it, with no task switch and no buffer to lag (an update reaches wait_for sooner).
        with self.node.deliver_to(self.topic, self._on_item):
            async with trio.open_nursery() as nursery:
                try:
                    # Not retained: a replica catches up by snapshot, never from history.
                    await self.node.join(self.topic, self.bootstrap, retain=False)
                except TimeoutError as exc:  # joined; the node keeps looking for neighbours
                    log.warning("config %r: %s", self.name, exc)
                nursery.start_soon(self._syncer)
                nursery.start_soon(self._answerer)
                nursery.start_soon(self._gap_watcher)
                nursery.start_soon(self._timeout_loop)
                task_status.started()

    def _on_item(self, item: object) -> None:
        if isinstance(item, Lost):
            log.info("config %r: missed messages (%r); asking for a snapshot", self.name, item)
            self._sync_wanted.set()
            return
        if type(item) is not Delivery:
            return
        publisher = item.publisher
        if publisher == self._me or publisher.startswith(self._own_writes):
            return  # our own sync requests, snapshots and writes (applied when made)
        try:
            message = decode(item.value)
        except ConfigCodecError as exc:
            self.counters["malformed"] += 1
            log.warning("config %r: dropped a malformed message from %r: %s", self.name,
                        item.publisher, exc)  # fmt: skip
            return
        kind = type(message)
        if kind is Update:
            if message.writer == self._me:  # type: ignore[union-attr]
                return  # our own write (on a stream of its own), applied when made
            self.counters["updates"] += 1
            version = message.version  # type: ignore[union-attr]
            if self._missing:
                self._missing.pop(version, None)
            if version > self.state.version + 1:
                self._notice_gap(self.state.version + 1, version)
            self._apply(message.changes.items())  # type: ignore[union-attr]
        elif kind is SyncRequest:
            if message.responder == self._me and len(self._requesters) < MAX_REQUESTERS:  # type: ignore[union-attr]
                least = self._requesters.get(message.requester, message.version)
                self._requesters[message.requester] = min(least, message.version)
                self._answer_wanted.set()
        elif kind is Snapshot:
            if self._me in message.requesters:  # type: ignore[union-attr]
                self._last_answer = message.entries
            if message.entries:
                self.counters["snapshots_merged"] += 1
                self._apply(message.entries.items())
                top = max(entry.version for entry in message.entries.values())
                for version in [v for v in self._missing if v <= top]:
                    del self._missing[version]
            if self._me in message.requesters:  # type: ignore[union-attr]
                self._snapshot_for_us.set()

    def _apply(self, changes: object) -> None:
        if self.state.apply(changes) and self._waiters:  # type: ignore[arg-type]
            version = self.state.version
            waiting = []
            for waiter in self._waiters:
                if waiter[0] <= version:
                    trio.lowlevel.reschedule(waiter[1], outcome.Value(True))
                else:
                    waiting.append(waiter)
            self._waiters = waiting

    def _notice_gap(self, first: int, end: int) -> None:
        """Versions first..end-1 were skipped: a snapshot if they stay missing GAP_GRACE."""
        if len(self._missing) + end - first > MAX_MISSING_VERSIONS:
            self._missing.clear()
            self._sync_wanted.set()  # too far behind to wait: ask now
            return
        now = trio.current_time()
        for version in range(first, end):
            self._missing.setdefault(version, now)
        self._gap_noticed.set()

    async def _gap_watcher(self) -> None:
        while True:
            await self._gap_noticed.wait()
            self._gap_noticed = trio.Event()
            while self._missing:
                await trio.sleep_until(min(self._missing.values()) + GAP_GRACE)
                now = trio.current_time()
                if any(since + GAP_GRACE <= now for since in self._missing.values()):
                    log.info("config %r: versions %s still missing; asking for a snapshot",
                             self.name, sorted(self._missing)[:5])  # fmt: skip
                    self._missing.clear()
                    self._sync_wanted.set()

    async def _syncer(self) -> None:
        self._sync_wanted.set()
        while True:
            await self._sync_wanted.wait()
            self._sync_wanted = trio.Event()
            await self._sync_once()
            self.synced.set()

    def _neighbours_to_ask(self) -> list[Neighbor]:
        """Nearest first; the bootstrap nodes last, as every newcomer contacts them already."""
        seeds = set(self.bootstrap)
        return sorted(
            self.node.neighbors(self.topic),
            key=lambda n: (n.address in seeds, math.inf if n.rtt_ms is None else n.rtt_ms),
        )

    async def _ask(self, neighbour: Neighbor, version: int) -> bool:
        """Ask `neighbour` for its snapshot (in full if its version is above `version`);
        True once it answered within sync_timeout."""
        self.counters["syncs"] += 1
        self._snapshot_for_us = trio.Event()
        await self.node.publish(self.topic, encode_sync(self.node.id, neighbour.peer_id, version))
        with trio.move_on_after(self.sync_timeout):
            await self._snapshot_for_us.wait()
            return True
        log.info("config %r: no snapshot from %s", self.name, neighbour.address)
        return False

    async def _sync_once(self) -> None:
        # A newcomer's first links are to the seeds; the others arrive within a round trip
        # or two (FORWARDJOIN). Asking one of those keeps the load off the seeds.
        with trio.move_on_after(SEED_GRACE):
            while (links := self.node.neighbors(self.topic)) and all(
                n.address in self.bootstrap for n in links
            ):
                await trio.sleep(SEED_GRACE / 20)
        for neighbour in self._neighbours_to_ask():
            if await self._ask(neighbour, self.state.version):
                return

    async def confirm(self, keys: Sequence[str], timeout: float) -> bool:
        """Wait until a neighbour's snapshot holds our entries of `keys` (or newer): a
        short-lived writer's last write has then left this node. False on timeout."""
        ours = {k: self.state.entries()[k].stamp for k in keys}
        with trio.move_on_after(timeout):
            while True:
                for neighbour in self._neighbours_to_ask():
                    if await self._ask(neighbour, 0):  # version 0: the whole snapshot
                        held = self._last_answer
                        if all(k in held and held[k].stamp >= s for k, s in ours.items()):
                            return True
                await trio.sleep(self.sync_timeout / 10)  # nobody has it yet: ask again
        return False

    async def _answerer(self) -> None:
        # A replica that has not caught up yet has nothing to tell: were it to answer, a
        # newcomer asking it (two starting together ask each other first) would take its
        # empty state for the overlay's and stop asking. Requests wait here until it has.
        await self.synced.wait()
        while True:
            await self._answer_wanted.wait()
            self._answer_wanted = trio.Event()
            # Requests that arrive while this one is answered wait for the next round.
            requesters, self._requesters = self._requesters, {}
            behind = any(version < self.state.version for version in requesters.values())
            entries = self.state.entries() if behind else {}
            await self.node.publish(self.topic, encode_snapshot(list(requesters), entries))
            self.counters["snapshots_sent"] += 1
            await trio.sleep(SNAPSHOT_INTERVAL)

    # -- the application's side -------------------------------------------------------------

    async def write(self, changes: Mapping[str, object]) -> int:
        """Set keys to values (bytes or JSON-serialisable) or DELETE them, as one write;
        returns its version. Raises ConfigLimitError past the bounds, nothing applied."""
        if not changes:
            raise ValueError("a config write needs at least one key")
        version, writer = self.state.stamp_for_write(self.node.id)
        entries, payload, stream = write_message(changes, version, writer)
        self.state.check_write(entries)
        # Published first: if the node refuses it (size), nothing was applied here either.
        await self.node.publish_record(self.topic, payload, stream=stream)
        self._apply(entries.items())
        return version

    async def wait_for(self, version: int, timeout: float) -> bool:
        """Wait until this replica's version is at least `version`; False on timeout."""
        if not timeout >= 0:
            raise ValueError(f"timeout must be >= 0 seconds, not {timeout!r}")
        if self.state.version >= version:
            await trio.lowlevel.checkpoint()  # there already: no deadline to set up
            return True
        # Parked until _apply reaches `version` and reschedules this task (True), or the
        # timeout task finds its deadline passed (False): no Event, lock or cancel scope
        # per call (a follower waits once per version, on the hot path of every update).
        waiter: _Waiter = [version, trio.lowlevel.current_task(), trio.current_time() + timeout]
        timeouts = self._timeouts
        if timeouts is None:  # not running (yet): a cancel scope of its own
            with trio.move_on_at(waiter[2]):
                return await self._park(waiter)
            return False
        if waiter[2] < timeouts.deadline:
            timeouts.deadline = waiter[2]
        return await self._park(waiter)

    async def _park(self, waiter: _Waiter) -> bool:
        def abort(_: object) -> trio.lowlevel.Abort:
            self._waiters.remove(waiter)  # a waiter leaves the list only as it is woken
            return trio.lowlevel.Abort.SUCCEEDED

        self._waiters.append(waiter)
        return await trio.lowlevel.wait_task_rescheduled(abort)  # type: ignore[no-any-return]

    async def _timeout_loop(self) -> None:
        """Wakes wait_for's callers whose deadline passed, with False; sleeps until the
        earliest deadline left (wait_for moves it nearer, never a wakeup per call)."""
        try:
            while True:
                now = trio.current_time()
                waiting = []
                for waiter in self._waiters:
                    if waiter[2] <= now:
                        trio.lowlevel.reschedule(waiter[1], outcome.Value(False))
                    else:
                        waiting.append(waiter)
                self._waiters = waiting
                deadline = min((waiter[2] for waiter in waiting), default=math.inf)
                with trio.CancelScope(deadline=deadline) as self._timeouts:
                    await trio.sleep_forever()
        finally:
            self._timeouts = None
