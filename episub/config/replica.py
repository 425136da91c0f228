"""A configuration replica kept by a running Node: the topic `_episub.config.<name>`.

    replica = ConfigReplica(node, "default", bootstrap=[...])
    await nursery.start(replica.run)          # joined, subscribed; syncing in the background
    await replica.synced.wait()               # a neighbour's snapshot merged (or none to ask)
    version = await replica.write({"threshold": 0.7, "old_flag": DELETE})
    replica.state.get("threshold"); await replica.wait_for(version, timeout=5)

Each write travels as a one-message stream of its own (`write_stream`, seq 0), not on the
writer node's own stream: the node holds a stream's later messages behind an earlier one
still being repaired (IHAVE, GRAFT: a few hundred ms), and a newcomer's first message of a
stream that started before it for `stream_settle`. So writes may arrive out of order; the
state (episub.config.state) applies them in version order, keeping one that arrived above
a gap aside until the gap fills, and its version means "every write up to here is held":
`wait_for(v)` returns True only once v's values are.

Rules this replica keeps:
- A replica that knows of a version it does not hold is *behind* (`behind`, `lag()`) and
  says so; a gap the overlay's own repair (IHAVE + GRAFT) has not filled within GAP_GRACE
  is repaired by snapshots: asked of the nodes that may hold one, one after another (at
  most MAX_ASKED_PER_ROUND), in rounds with a growing pause between them (REPAIR_PAUSE up
  to REPAIR_PAUSE_MAX), until the replica holds every version it knows of. It logs once
  when it starts repairing and once when it has caught up, not per request.
- Who is asked: the nodes that reported holding a version above ours (writers, snapshot
  senders, other replicas' sync requests) first, then neighbours nearest by RTT, and the
  bootstrap nodes (the driver, in Spark) last, so that repair does not load them. A
  replica's first catch-up asks the nodes that reported a version and the bootstrap nodes
  first: replicas that start together would otherwise ask each other, and none of them has
  anything yet.
- A catch-up also starts at once on a Lost notice from the node (messages given up on),
  on a sync request from a node that holds a version above any this replica knew of, and
  when the replica links again to the overlay after it had no neighbour, or to a node it
  had lost (a healed partition: a write made meanwhile announces itself to nobody, but
  the nodes on the other side ask the relinked one, and so tell it).
- A sync request names one node; that node publishes its snapshot with its version, which
  every replica behind it merges (the same highest-stamp rule as updates). When every
  requester holds that version already, the snapshot carries no entries, and a replica
  behind it takes from it only that the version exists (state.py, merge_snapshot). A
  replica that has not caught up itself answers at once that it is not ready (no
  entries), so the asker moves on instead of waiting SYNC_TIMEOUT; it answers at most one
  snapshot per SNAPSHOT_INTERVAL (requests arriving meanwhile are answered together by the
  next one), so a peer naming it in a loop costs one bounded message per interval.
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
from episub.net.peer_id import PeerIdError, parse_peer_id
from episub.node import Node
from episub.proto.messages import check_topic_name
from episub.proto.reserved import CONFIG_TOPIC_PREFIX
from episub.subscription import Delivery, Lost

__all__ = [
    "DELETE",
    "GAP_GRACE",
    "REPAIR_PAUSE",
    "SNAPSHOT_INTERVAL",
    "SYNC_TIMEOUT",
    "ConfigReplica",
    "config_topic",
    "write_message",
    "write_stream",
]

log = logging.getLogger("episub.config")

TOPIC_PREFIX = CONFIG_TOPIC_PREFIX  # the core gives these topics their broadcast config
# How long a sync request waits for the named node's snapshot before naming the next:
# a node answers at once, so this is a few RTTs plus a busy Python process's pause.
SYNC_TIMEOUT = 2.0  # guess
SNAPSHOT_INTERVAL = 0.2  # s between two snapshot answers; guess: 5/s stays cheap at 512 KiB
# How long a known version may stay missing before snapshots are asked for: a write that
# overtook another on its way comes from a separate stream, and the late one is repaired
# by IHAVE + GRAFT within the announcer's flush period plus graft_timeout (up to 1.5 +
# 0.5 s on a config topic, episub/proto/config.py CONFIG_TOPIC_BROADCAST).
GAP_GRACE = 4.0  # guess: about twice that repair
# The pause after a repair round that left the replica behind, doubled each round up to
# the max: a partition heals in seconds to minutes, and a round costs a sync request and
# a snapshot per node asked.
REPAIR_PAUSE = 0.5  # guess
REPAIR_PAUSE_MAX = 8.0  # guess: a healed partition is noticed within this much
MAX_HOLDERS = 64  # nodes remembered with the version they reported; as MAX_REQUESTERS
MAX_LOST_NEIGHBOURS = 64  # links remembered after they went, to see them come back
# Nodes asked in one round at most (the bootstrap nodes kept): a round costs a sync request
# and an answer per node asked, and the next round asks again. Guess: a view and a half.
MAX_ASKED_PER_ROUND = 12


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
                         "malformed": 0, "repairs": 0}  # fmt: skip
        # The nodes this replica asked for a snapshot, in order (bounded: the last 256).
        self.asked: list[bytes] = []
        # wait_for's callers, parked until the version reaches theirs or their deadline
        # passes: woken by _changed (True) or _timeout_loop (False) directly.
        self._waiters: list[_Waiter] = []
        self._timeouts: trio.CancelScope | None = None  # _timeout_loop's sleep, while running
        self._sync_wanted = trio.Event()
        self._answer_wanted = trio.Event()
        self._asking: bytes | None = None  # the node whose snapshot _ask waits for
        self._answered = trio.Event()
        self._answer_ready = False  # whether that node had caught up itself
        self._last_answer: dict[str, Entry] = {}  # the last snapshot sent for us
        self._requesters: dict[bytes, int] = {}  # sync requests to answer: id -> its version
        self._holders: dict[bytes, int] = {}  # node -> the version it reported holding
        self._relinked: dict[bytes, None] = {}  # links to ask first (a healed partition)
        self._behind_since: float | None = None
        self._behind_noticed = trio.Event()
        self._repairing_logged = False
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
                nursery.start_soon(self._link_watcher)
                nursery.start_soon(self._timeout_loop)
                task_status.started()

    @property
    def behind(self) -> bool:
        """Whether this replica knows of a version it does not hold yet (it is repairing)."""
        return self.state.behind

    def lag(self) -> int:
        """How many versions this replica knows of but does not hold yet (0: caught up)."""
        return self.state.lag

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
            self._note_holder(message.writer, version)  # type: ignore[union-attr]
            self._changed(self.state.apply_update(version, message.changes))  # type: ignore[union-attr]
        elif kind is SyncRequest:
            self._note_holder(message.requester, message.version)  # type: ignore[union-attr]
            if message.version > self.state.top and self.synced.is_set():  # type: ignore[union-attr]
                # A node holds writes nothing had announced to us (a healed partition: it
                # asks us as a link it had lost): no overlay repair will bring them.
                self._sync_wanted.set()
            self.state.note_version(message.version)  # type: ignore[union-attr]
            self._changed([])
            if message.responder == self._me and len(self._requesters) < MAX_REQUESTERS:  # type: ignore[union-attr]
                least = self._requesters.get(message.requester, message.version)
                self._requesters[message.requester] = min(least, message.version)
                self._answer_wanted.set()
        elif kind is Snapshot:
            if message.ready:  # type: ignore[union-attr]
                self._note_holder(publisher, message.version)  # type: ignore[union-attr]
                changed = self.state.merge_snapshot(message.version, message.entries)  # type: ignore[union-attr]
                if changed:
                    self.counters["snapshots_merged"] += 1
                self._changed(changed)
            if self._me in message.requesters and publisher == self._asking:  # type: ignore[union-attr]
                self._last_answer = message.entries  # type: ignore[union-attr]
                self._answer_ready = message.ready  # type: ignore[union-attr]
                self._answered.set()

    def _note_holder(self, node: bytes, version: int) -> None:
        if node == self._me:
            return
        holders = self._holders
        if node not in holders and len(holders) >= MAX_HOLDERS:
            lowest = min(holders, key=holders.__getitem__)
            if holders[lowest] >= version:
                return
            del holders[lowest]
        holders[node] = max(version, holders.get(node, 0))

    def _changed(self, changed: list[str]) -> None:
        """After the state took something in: wake wait_for's callers it reached, and
        keep track of whether the replica is behind."""
        version = self.state.version
        if changed and self._waiters:
            waiting = []
            for waiter in self._waiters:
                if waiter[0] <= version:
                    trio.lowlevel.reschedule(waiter[1], outcome.Value(True))
                else:
                    waiting.append(waiter)
            self._waiters = waiting
        if self.state.behind:
            if self._behind_since is None:
                self._behind_since = trio.current_time()
                self._behind_noticed.set()
        elif self._behind_since is not None:
            if self._repairing_logged:
                log.info("config %r: caught up at version %d, %.1f s after falling behind",
                         self.name, version, trio.current_time() - self._behind_since)  # fmt: skip
            self._behind_since = None
            self._repairing_logged = False

    async def _gap_watcher(self) -> None:
        """A version missing past GAP_GRACE (the overlay's own repair did not bring it)
        starts a catch-up by snapshots."""
        while True:
            await self._behind_noticed.wait()
            self._behind_noticed = trio.Event()
            since = self._behind_since
            if since is None:
                continue
            await trio.sleep_until(since + GAP_GRACE)
            if self._behind_since == since:
                self._sync_wanted.set()

    async def _link_watcher(self) -> None:
        """Ask for a catch-up when the replica links to the overlay again after it had no
        neighbour, or to a node it had lost: writes made while it was cut off announce
        themselves to nobody once they are done. Woken by the node at each link change."""
        changed = self.node.link_change(self.topic)  # taken before the links are read
        links = dict.fromkeys(n.peer_id for n in self.node.neighbors(self.topic))
        lost: dict[bytes, None] = {}
        while True:
            await changed.wait()
            changed = self.node.link_change(self.topic)
            now = dict.fromkeys(n.peer_id for n in self.node.neighbors(self.topic))
            for peer in links:
                if peer not in now:
                    lost[peer] = None
            while len(lost) > MAX_LOST_NEIGHBOURS:
                del lost[next(iter(lost))]
            fresh = [p for p in now if p not in links and (not links or p in lost)]
            links = now
            if fresh and self.synced.is_set():
                for peer in fresh:
                    lost.pop(peer, None)
                    self._relinked[peer] = None
                self._sync_wanted.set()

    async def _syncer(self) -> None:
        await self._sync_round(first=True)
        self.synced.set()
        if self.state.behind:  # the answer showed more than it held: repair at once
            self._sync_wanted.set()
        while True:
            await self._sync_wanted.wait()
            self._sync_wanted = trio.Event()
            await self._catch_up()

    async def _catch_up(self) -> None:
        """Rounds of sync requests until one leaves the replica holding every version it
        knows of, with a growing pause between rounds."""
        pause = REPAIR_PAUSE
        while True:
            await self._sync_round(first=False)
            if not self.state.behind:
                return
            self.counters["repairs"] += 1
            if not self._repairing_logged:
                self._repairing_logged = True
                log.warning(
                    "config %r: behind: holds version %d of %d (missing %s); asking every "
                    "node it can reach for a snapshot until it has caught up",
                    self.name, self.state.version, self.state.top, self.state.missing(5),
                )  # fmt: skip
            await trio.sleep(pause)
            pause = min(2 * pause, REPAIR_PAUSE_MAX)

    def _candidates(self, first: bool) -> list[tuple[bytes, str]]:
        """Whom to ask, in order (see the module's rules), at most MAX_ASKED_PER_ROUND:
        (node id, address)."""
        seeds = set(self.bootstrap)
        neighbours = {n.peer_id: n for n in self.node.neighbors(self.topic)}
        relinked = [p for p in self._relinked if p in neighbours]
        self._relinked.clear()
        version = self.state.version
        holders = sorted(
            (p for p, v in self._holders.items() if v > version or (first and v > 0)),
            key=lambda p: -self._holders[p],
        )
        near = sorted(neighbours.values(), key=lambda n: math.inf if n.rtt_ms is None else n.rtt_ms)
        # The nodes we joined through, linked yet or not: join() returns at the first
        # link, which may be another newcomer's (a JOIN walked on), not the contact's.
        contacts = self.node.contacts(self.topic)
        ordered = [*relinked, *holders, *(n.peer_id for n in near), *contacts]
        out: dict[bytes, str] = {}
        for peer in ordered:
            if peer not in out and peer != self._me:
                out[peer] = neighbours[peer].address if peer in neighbours else _address_of(peer)
        # The bootstrap nodes: first on the first catch-up, else last.
        seeded = [p for p, a in out.items() if a in seeds or p in contacts]
        seeded = seeded[:MAX_ASKED_PER_ROUND]
        rest = [p for p in out if p not in seeded][: MAX_ASKED_PER_ROUND - len(seeded)]
        order = [*seeded, *rest] if first else [*rest, *seeded]
        return [(p, out[p]) for p in order]

    async def _sync_round(self, first: bool) -> None:
        """Ask each candidate in turn until a ready answer leaves us not behind."""
        for peer, address in self._candidates(first):
            if await self._ask(peer, address, self.state.version) and not self.state.behind:
                return

    async def _ask(self, peer: bytes, address: str, version: int) -> bool:
        """Ask `peer` for its snapshot (in full if its version is above `version`); True
        once it answered, ready, within sync_timeout."""
        self.counters["syncs"] += 1
        self.asked = [*self.asked[-255:], peer]
        self._asking, self._answered = peer, trio.Event()
        try:
            await self.node.publish(self.topic, encode_sync(self._me, peer, version))
            with trio.move_on_after(self.sync_timeout):
                await self._answered.wait()
                if not self._answer_ready:
                    log.debug("config %r: %s has not caught up itself", self.name, address)
                return self._answer_ready
            log.debug("config %r: no snapshot from %s", self.name, address)
            return False
        finally:
            self._asking = None

    async def confirm(self, keys: Sequence[str], timeout: float) -> bool:
        """Wait until a neighbour's snapshot holds our entries of `keys` (or newer): a
        short-lived writer's last write has then left this node. False on timeout."""
        ours = {k: self.state.entries()[k].stamp for k in keys}
        with trio.move_on_after(timeout):
            while True:
                for peer, address in self._candidates(first=False):
                    if await self._ask(peer, address, 0):  # version 0: the whole snapshot
                        held = self._last_answer
                        if all(k in held and held[k].stamp >= s for k, s in ours.items()):
                            return True
                await trio.sleep(self.sync_timeout / 10)  # nobody has it yet: ask again
        return False

    async def _answerer(self) -> None:
        # A replica that has not caught up yet answers that it is not ready: were it to
        # answer with its empty state, a newcomer asking it would take that for the
        # overlay's and stop asking; were it silent, the newcomer would wait SYNC_TIMEOUT.
        while True:
            await self._answer_wanted.wait()
            self._answer_wanted = trio.Event()
            # Requests that arrive while this one is answered wait for the next round.
            requesters, self._requesters = self._requesters, {}
            ready = self.synced.is_set()
            version = self.state.version
            behind = ready and any(v < version for v in requesters.values())
            entries = self.state.entries() if behind else {}
            await self.node.publish(
                self.topic, encode_snapshot(list(requesters), entries, version, ready)
            )
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
        self._changed(self.state.apply_update(version, entries))
        return version

    async def wait_for(self, version: int, timeout: float) -> bool:
        """Wait until this replica holds every write up to `version`; False on timeout."""
        if not timeout >= 0:
            raise ValueError(f"timeout must be >= 0 seconds, not {timeout!r}")
        if self.state.version >= version:
            await trio.lowlevel.checkpoint()  # there already: no deadline to set up
            return True
        # Parked until _changed reaches `version` and reschedules this task (True), or the
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


def _address_of(peer: bytes) -> str:
    """The "host:port" a node id names ("" if it names none: asked all the same)."""
    try:
        return str(parse_peer_id(peer))
    except PeerIdError:
        return ""
