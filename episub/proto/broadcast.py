"""Plumtree broadcast for one topic, with the Episub draft's batching and per-publisher order.

Rules this machine keeps:
- `eager` and `lazy` are disjoint and their union is exactly the active view that
  membership reported through neighbor_up/neighbor_down.
- A message id is accepted once (the node's store, store.py, keeps what was seen); its id
  must be blake3 of its envelope, and its hop count must leave room to forward it (below
  MAX_HOPS), checked before it enters the store. History we fetched (a HISTORY answer
  behind its stream) is checked the same way and held in the store but not seen: neither
  delivered nor forwarded, and a live copy of it is still a first copy.
- With signing on (a `signer`), we sign what we publish on our own stream, and a first
  copy of a node's stream must carry a valid signature bound to its publisher
  (signing.py) before it enters the store or ordering; else it is dropped and counted
  (`bad_signatures`). Named streams are bound to no key: neither signed nor checked.
- Each first copy of a message (and our own publish at a named stream's place) goes to
  `ordering` (ordering.py), which gives the application each publisher's messages in
  sequence order, each once, and repairs gaps; its rules are at the top of that module.
- Every table a peer can grow is bounded: the store (store.py) bounds what it holds,
  missing places (their due queue: twice as many rows), announcers per place;
  ordering.py and announcements.py bound their own.

Rules from the draft (and Plumtree):
- publish / first receipt: GOSSIP to eager peers with hops + 1, id queued for IHAVE;
  not to a peer that announced the id to us (it holds it already). A lazy sender of a
  first copy is made eager at both ends (empty GRAFT).
- duplicate GOSSIP: PRUNE the sender, which moves to lazy; except from a peer that sent
  us an empty GRAFT less than `graft_grace` ago, a peer answering a GRAFT of ours for
  that id (`_asked_for`), our one eager parent and our last eager link
  (`_prune_redundant`). A lazy sender is PRUNEd again (it holds us eager), at most once
  per `graft_grace`.
- first receipt from a lazy neighbour makes it eager at both ends (an empty GRAFT), unless
  we pruned it less than `graft_grace` ago (the copy was sent before our PRUNE arrived).
- PRUNE: the sender moves to lazy; unless we GRAFTed it less than `graft_grace` ago: then
  the two crossed, it has made us eager since, and we GRAFT again (once) to agree. If the
  PRUNE left us with no eager link, or came from the neighbour that fed us last with no
  eager one feeding us since, an empty GRAFT goes to the lazy neighbour that fed us most
  lately, or another lazy one (see `_keep_a_parent`).
- every `ihave_interval` the queue (announcements.py) is flushed as IHAVE batches to lazy
  peers, leaving out messages a peer sent or announced to us meanwhile. An IHAVE names
  messages by place: runs (publisher, first_seq..last_seq, hops) of consecutive seqs
  received at one hop count, so a burst is one range per flush and link, not an id per
  message.
- IHAVE of a place we do not hold (not in the store, not delivered, not held back): the
  place is missing; `graft_timeout` after its first announcement it is GRAFTed (as ranges,
  batched per peer) from its first announcer, then every `missing_check_interval` from the
  next (Plumtree's per-message timer, kept as one queue in due order and one timer). A
  range wholly behind the publisher's stream position costs one comparison.
- GRAFT: the sender becomes eager and gets the messages of the ranges it asked for that
  the store holds.
- PULL: the sender gets the publisher's messages it asked for that the store holds.
- GRAFT and PULL answers go a bounded batch at a time, the next when the asker has read
  the last (answers.py, whose rules are at its top).
- one message per place: a first copy for a (publisher, seq) the store holds another
  message at takes it only by the store's rule (`MessageStore.takes_place`); a losing one
  is dropped and its sender gets the winner (`_rival_loses`).
- tree optimisation: a lazy path shorter than the eager one by `optimization_threshold`
  hops swaps the two (GRAFT the lazy announcer, PRUNE the eager sender).
- near parent (ours, off by default): an IHAVE of an id we hold, from a lazy neighbour
  our own RTT samples put `near_parent_factor` times nearer than the eager neighbour we
  got the id from, announced at fewer hops than ours, whose copy could have reached us no
  later than ours + its RTT, swaps the two the same way; at most once per `graft_grace`
  (see `_prefer_near_parent`).
- lazy race (ours, off by default: `race_lazy_hops`): an IHAVE of an id we hold, from a
  lazy neighbour announcing it `race_lazy_hops` hops shorter than ours, less than half a
  flush period after our copy came, gets it an empty GRAFT naming the stream (we stay lazy
  towards it); the duplicate rule then prunes the slower of it and our parent. At most
  once per `graft_grace` per tree, never to a peer pruned less than `race_backoff` ago
  (see `_race_lazy_announcer`).
- a new link starts eager, except a RAND link at a node with a parent (an eager
  neighbour that has sent it a message first): that starts lazy, and a PRUNE at link-up
  makes it lazy at the other end too (`neighbor_up`). A NEAR link races (starts eager) in
  the `near_race_trees` trees seen most lately: from both ends in the latest, from the
  lower id's end only in the others (the other end starts it lazy and sends no PRUNE).
- hub links (ours, `hub_parent`: configuration topics): a NEAR link is a hub link
  (membership.py); it starts eager and is never pruned for a duplicate, and while one
  stands every RAND link starts lazy; one coming up makes our eager RAND links lazy.
- IHAVE flush period (ours, `ihave_spread`): ihave_interval times a share of the node's
  own, fixed by its id, so that nodes fed at the same moment do not flush together.
- optional eager repair when an eager neighbour goes down (empty GRAFT to at most
  `eager_repair_grafts` lazy peers in the latest tree, one in the others, those that fed
  us most lately first), unless a remaining eager neighbour has sent us a message first
  since it did.
- per-publisher gaps are pulled (PULL first..last) from neighbours in turn (ordering.py).
- stream heads (ours, heads.py): `heads_quiet` after a stream's newest message came, its
  seq is named once in a HEADS to every neighbour not known to hold it. A HEADS is taken
  as an IHAVE of the places above what our stream holds, up to the head (at most
  MAX_TAIL_PLACES per stream and MAX_IDS_PER_MESSAGE per HEADS): a lost last message is
  GRAFTed as an announced one is.
"""

from __future__ import annotations

import zlib
from collections import OrderedDict, deque
from collections.abc import Callable, Container, Hashable, Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import Any, TypeAlias, assert_never

from episub.proto import messages as m
from episub.proto.announcements import Announcements
from episub.proto.answers import AnswerCursors, HistoryReader
from episub.proto.config import BroadcastConfig
from episub.proto.envelope import IdHasher, Record
from episub.proto.errors import MessageTooLarge, OwnStreamNamed, too_large
from episub.proto.events import (
    AlreadyPublished,
    OutEvent,
    PeerMisbehaved,
    Published,
    Recovered,
    ScheduleTimer,
    Send,
    check_publish_batch,
)
from episub.proto.heads import StreamHeads
from episub.proto.messages import Envelope, LinkKind, MessageId, PeerId
from episub.proto.ordering import OrderedDelivery, PublisherStream
from episub.proto.peers import RttTable
from episub.proto.signing import Signer, check_message
from episub.proto.store import MessageStore
from episub.proto.tables import BroadcastCounters, OwnStream
from episub.proto.timers import BroadcastTimer
from episub.proto.trees import Tree, Trees

# The IHAVE flush may come this part of ihave_interval early when the node is awake for a
# message anyway (ScheduleTimer.early): at 50 messages/s (the config benchmark) one always
# comes within it. Guess: a quarter, so flushes stay about ihave_interval apart.
IHAVE_EARLY = 0.25
# Timers looked at per message or announcement: module constants, not an enum lookup each.
_IHAVE = BroadcastTimer.IHAVE
_HEADS = BroadcastTimer.HEADS
_MISSING = BroadcastTimer.MISSING
_NOBODY: frozenset[PeerId] = frozenset()  # a message no announcer holds

# How long after our copy an IHAVE may come, in flush periods, for its sender to be raced
# (`_race_lazy_announcer`). Tuned at 300 nodes, 8 senders, seed 1: a whole period (any copy
# that may have come first) raced so often that RMR went 0.023 -> 0.054 for p99 103 -> 72
# ms; half of one, 0.025 for 88 ms; a quarter, 0.023 for 99 ms.
RACE_WINDOW = 0.5

# A GRAFT due this close after a timer fires goes with that timer's batch: float sums of
# due times and timer delays differ in the last bits, and a timer of 1e-17 s is waste.
DUE_SLACK = 1e-6

# Places below a head that one HEADS range makes missing: a GRAFT's worth (max_graft_ids'
# default). A stream further behind gets its tail first; the gap before it is then pulled
# (ordering.py).
MAX_TAIL_PLACES = 256

Place: TypeAlias = tuple[PeerId, int]  # (publisher, seq): a message's place in its stream


@dataclass(slots=True)
class Missing:
    """A place announced by IHAVE whose message we have not received."""

    announcers: list[tuple[PeerId, int]]  # (peer, hops it announced), first come first
    ticks: int = 0  # times its GRAFT came due
    grafted_from: list[PeerId] = field(default_factory=list)  # whom we GRAFTed it from


class Broadcast:
    def __init__(
        self,
        *,
        me: PeerId,
        topic: str,
        config: BroadcastConfig,
        timer_prefix: tuple[Hashable, ...],
        id_key: bytes | None = None,
        signer: Signer | None = None,
        rtts: RttTable | None = None,
        store: MessageStore | None = None,
        own_stream: OwnStream | None = None,
    ) -> None:
        self.me = me
        # The node's message store (NodeState's, shared by its topics; one of its own when
        # none is given): seen ids, the messages held and their places (store.py).
        self.store = store if store is not None else MessageStore()
        self.places = self.store.places(topic)
        self.seen = self.store.seen
        self._at_place = self.store.lookup(self.places)
        # Our own RTT samples (membership's table, read only): the near parent rule.
        self.rtts = rtts
        self.topic = topic
        self.config = config
        # This node's IHAVE flush period, ihave_interval spread by ihave_spread around it.
        self.ihave_period = config.ihave_interval * _spread_share(me, config.ihave_spread)
        self.id_key = id_key
        self.signer = signer
        self._message_id = IdHasher(topic, id_key)
        self._timer_prefix = timer_prefix
        # Eager and lazy neighbours per publisher stream (trees.py), with the times each
        # tree's rules look at (parents, GRAFTs and PRUNEs sent and received).
        self.trees = Trees(config.max_stream_trees)
        # What we received or published since the last IHAVE flush, and the neighbours
        # not to announce each to (announcements.py). Emptied by each flush.
        self.announcements = Announcements()
        self.missing: dict[Place, Missing] = {}
        # (when its next GRAFT is due, place, entry) per missing place, due times in
        # order: each entry is due graft_timeout after its first announcement, then every
        # missing_check_interval. A place received meanwhile leaves a stale row, skipped.
        self.missing_due: deque[tuple[float, Place, Missing]] = deque()
        # hub_parent: the NEAR neighbours (hub links); at most one entry per active neighbour.
        self.hubs: dict[PeerId, None] = {}
        # id -> the peers we GRAFTed it from that have not answered yet; their answers are
        # copies we asked for, not a redundant path (bounded by max_missing).
        self.graft_answers: OrderedDict[MessageId, list[PeerId]] = OrderedDict()
        self.own_stream = own_stream if own_stream is not None else OwnStream()
        # Each stream's newest place, named in a HEADS once the stream goes quiet.
        self.heads = StreamHeads(config)
        self._armed: set[BroadcastTimer] = set()  # set and not fired yet: one at a time each
        self.counters = BroadcastCounters()
        # What peers asked (PULL, GRAFT over ranges) and were not sent yet (answers.py).
        self.answers = AnswerCursors(topic, config, self.counters, self._message_id)
        # Per-publisher order (ordering.py): it counts into our counters.
        self.ordering = OrderedDelivery(
            topic=topic,
            store=self.store,
            places=self.places,
            config=config,
            timer_prefix=timer_prefix,
            counters=self.counters,
        )

    @property
    def streams(self) -> dict[PeerId, PublisherStream]:
        """Ordered delivery state per publisher, least recently active first."""
        return self.ordering.streams

    @property
    def fetches(self) -> OrderedDict[PeerId, list[tuple[int, int]]]:
        """publisher -> the last spans we fetched of it, publishers oldest first."""
        return self.ordering.fetches

    # -- neighbours ---------------------------------------------------------------------

    @property
    def eager(self) -> dict[PeerId, None]:
        """Eager neighbours of the tree the latest message took (`shared` before any)."""
        return self._latest_tree().eager

    @property
    def lazy(self) -> dict[PeerId, None]:
        """Lazy neighbours of the tree the latest message took (`shared` before any)."""
        return self._latest_tree().lazy

    def _latest_tree(self) -> Tree:
        by_stream = self.trees.by_stream
        return next(reversed(by_stream.values())) if by_stream else self.trees.shared

    def neighbor_up(
        self, peer: PeerId, now: float, out: list[OutEvent], kind: LinkKind = LinkKind.RAND
    ) -> None:
        """A new link joins every tree. In each it starts eager, unless it is a RAND link
        and that tree has a parent (`Tree.has_parent`): then it starts lazy there, and a
        PRUNE naming those streams tells the other end, which makes it lazy there too (and
        grafts it back where that leaves it with no eager link: `_on_prune`). A NEAR link,
        chosen for its low RTT, starts eager: its first copies race our parent's, and the
        loser is pruned, so the trees move onto fast links. O(trees)."""
        trees = self.trees
        for _, tree in trees:
            tree.lazy.pop(peer, None)
            tree.eager.pop(peer, None)
        self.heads.link_up(peer, now)
        self.announcements.link_up(peer)
        hub_parent = self.config.hub_parent
        if hub_parent and kind is LinkKind.NEAR:
            # Our contact, or our joiner: the links of our own that came up before it go
            # lazy in every tree (they would relay a second copy of what the hub link carries).
            for other in [p for p in trees.shared.eager if p not in self.hubs]:
                for _, tree in trees:
                    tree.make_lazy(other)
                self._prune(other, (), now, out)
            self.hubs[peer] = None
        lazy_start = self.config.lazy_start
        hubbed = hub_parent and bool(self.hubs)
        racing = self._racing(kind)
        # The end that does not push a race, and the stream both ends race in.
        waits = self._waits_in_races(kind, peer)
        latest = next(reversed(trees.by_stream), None)
        lazy_in: list[tuple[PeerId | None, Tree]] = []
        for publisher, tree in trees:
            if racing is not None and (publisher is None or publisher in racing):
                if waits and publisher not in (None, latest) and tree.has_parent():
                    tree.lazy[peer] = None  # the other end pushes: no PRUNE
                else:
                    tree.eager[peer] = None
            elif lazy_start and (hubbed or tree.has_parent()):
                tree.lazy[peer] = None
                lazy_in.append((publisher, tree))
            else:
                tree.eager[peer] = None
        if len(lazy_in) == len(trees) + 1:
            self._prune(peer, (), now, out)  # every tree, `shared` too: the whole link
        elif lazy_in:
            self._prune(peer, lazy_in, now, out)

    def _racing(self, kind: LinkKind) -> Container[PeerId] | None:
        """The streams whose trees a new link starts eager in whatever their parents: for
        a NEAR link the `near_race_trees` seen most lately (every one with hub_parent,
        where a NEAR link is a hub link); None for a RAND link. Each race costs its
        tree a duplicate or two, so racing in every tree made a node's link churn cost
        O(streams) redundant copies: with 32 publishers RMR 0.22 (docs/protocol.md)."""
        if kind is not LinkKind.NEAR:
            return None
        by_stream = self.trees.by_stream
        budget = self.config.near_race_trees
        if self.config.hub_parent or len(by_stream) <= budget:
            return by_stream
        return set(islice(reversed(by_stream), budget))

    def _waits_in_races(self, kind: LinkKind, peer: PeerId) -> bool:
        """Does a new link start lazy here in the trees it races in, but the one of the
        stream seen most lately (a single publisher's)? For a NEAR link at the end with the
        higher id (`_pushes_race`), so that one end pushes each race; never with hub_parent
        (a hub link stays eager). A race both ends push costs two copies when neither end
        gains, one when one end pushes, and the lazy end that gets the pushed copy first
        grafts it back (`_lazy_sender_first`). With both ends pushing in 8 trees, races
        were half the redundant copies of 8 publishers (docs/protocol.md, "Delivery trees")."""
        return (
            kind is LinkKind.NEAR and not self.config.hub_parent and not _pushes_race(self.me, peer)
        )

    def neighbor_down(
        self, peer: PeerId, now: float, out: list[OutEvent], *, repair: bool = True
    ) -> None:
        """The link leaves every tree (O(trees)); a tree it was the parent of is repaired
        (`repair` False when we are leaving: nothing to repair then)."""
        self.hubs.pop(peer, None)
        self.announcements.link_down(peer)
        self.heads.link_down(peer)
        self.answers.forget(peer)
        repairing = repair and self.config.eager_repair
        # Every tree grafts eager_repair_grafts with hub_parent; else the latest and `shared`.
        full = self.config.eager_repair_grafts
        latest = next(reversed(self.trees.by_stream), None)
        targets: dict[PeerId, list[tuple[PeerId | None, Tree]]] = {}
        for publisher, tree in self.trees:
            was_eager, lost_at = tree.drop(peer)
            if was_eager and repairing and self._parentless(publisher, tree, lost_at, down=True):
                whole = self.config.hub_parent or publisher in (None, latest)
                grafts = full if whole else 1
                for lazy_peer in self._repair_targets(tree, grafts):
                    targets.setdefault(lazy_peer, []).append((publisher, tree))
        for lazy_peer, trees in targets.items():
            self._graft(lazy_peer, trees, now, out)

    def _parentless(
        self, publisher: PeerId | None, tree: Tree, lost_at: float | None, *, down: bool
    ) -> bool:
        """Has `tree` lost its parent with a link that went `down` or was pruned (whose
        feeding, if it fed us, ended at `lost_at`)? A tree that carries messages has, when
        no remaining eager link fed us as lately (after a PRUNE: when it has no eager link
        left, or the pruner fed us last). `shared` beside the streams' own trees carries
        none, only what a new tree starts from: it is repaired when left with no eager link."""
        if publisher is None and self.trees.cap:
            return not tree.eager
        if down:
            return not tree.still_fed(lost_at)
        return not tree.eager or (lost_at is not None and not tree.still_fed(lost_at))

    def _repair_targets(self, tree: Tree, grafts: int) -> list[PeerId]:
        """At most `grafts` lazy neighbours to graft when a tree's parent went: those that
        fed us most lately first, then the others in the order they became lazy. Grafting
        every lazy one (up to 13 with near links chosen by each end) pushed a copy of each
        message over every one of them, both ways, unpruned for graft_grace. The tree of
        the stream seen most lately (a single publisher's) grafts `eager_repair_grafts`,
        the others one (with hub_parent, where each write is a stream, all grafts): a link
        that goes down (a proximity swap) is the parent of many trees, and their second
        grafts were a third of 32 publishers' redundant copies (docs/protocol.md,
        "Delivery trees")."""
        lazy = tree.lazy
        fed = [p for p in reversed(tree.first_from) if p in lazy]
        others = [p for p in lazy if p not in tree.first_from]
        return (fed + others)[:grafts]

    def _graft(
        self,
        peer: PeerId,
        trees: list[tuple[PeerId | None, Tree]],
        now: float,
        out: list[OutEvent],
    ) -> None:
        """Graft `peer` for these trees, making it eager in them: an empty GRAFT naming
        their streams; with `shared` among them, naming none: every tree, the whole link."""
        if any(publisher is None for publisher, _ in trees):
            trees = list(self.trees)
        for _, tree in trees:
            tree.note_graft_sent(peer, now)
        for streams in _stream_chunks(trees):
            out.append(Send(peer, self.topic, m.Graft(streams=streams)))
        self._make_eager(peer, trees, out)

    def _graft_ranges(
        self, peer: PeerId, ranges: tuple[m.StreamRange, ...], now: float, out: list[OutEvent]
    ) -> None:
        """GRAFT the messages of `ranges`, which makes us eager for their streams there."""
        for publisher in dict.fromkeys(r[0] for r in ranges):
            self.trees.get(publisher).note_graft_sent(peer, now)
        out.append(Send(peer, self.topic, m.Graft(ranges=ranges)))

    def _prune(
        self,
        peer: PeerId,
        trees: tuple[()] | list[tuple[PeerId | None, Tree]],
        now: float,
        out: list[OutEvent],
    ) -> None:
        """PRUNE `peer` for these trees (the caller made it lazy in them); () or a list
        with `shared`: for every tree, the whole link."""
        if not trees:
            trees = list(self.trees)
        for _, tree in trees:
            tree.note_pruned(peer, now)
        for streams in _stream_chunks(trees):
            self.counters.prunes_sent += 1
            out.append(Send(peer, self.topic, m.Prune(streams=streams)))

    def _trees_named(self, streams: tuple[PeerId, ...]) -> list[tuple[PeerId | None, Tree]]:
        """The trees a PRUNE or GRAFT names: every one when it names no stream."""
        if not streams:
            return list(self.trees)
        get = self.trees.get
        return [(p, get(p)) for p in dict.fromkeys(streams)]

    def _on_prune(
        self, peer: PeerId, streams: tuple[PeerId, ...], now: float, out: list[OutEvent]
    ) -> None:
        if not self._is_neighbor(peer):
            return
        grace = self.config.graft_grace
        crossed: list[tuple[PeerId | None, Tree]] = []
        orphans: list[tuple[PeerId | None, Tree]] = []
        for publisher, tree in self._trees_named(streams):
            sent = tree.take_graft_sent(peer)
            if sent is not None and now - sent < grace and peer in tree.eager:
                # The peer pruned us before our GRAFT reached it: the two crossed, and it
                # has made us eager since. Taking its PRUNE would leave the link eager at
                # its end only, and us maybe with no eager link at all (the property tests
                # found it: eager repair after a neighbour left, against a PRUNE for a
                # duplicate). GRAFT again, once, so the last word on the link is the same
                # at both ends.
                self.counters.crossed_prunes += 1
                crossed.append((publisher, tree))
                continue
            lost_at = tree.first_from.get(peer)
            # Left with no eager link, or the PRUNE came from the neighbour that fed us last
            # and no eager one has fed us since (PRUNEs crossed: we pruned our other parent
            # for a duplicate while this one pruned us for one): we have no parent.
            if tree.make_lazy(peer) and self._parentless(publisher, tree, lost_at, down=False):
                orphans.append((publisher, tree))
        # Not through _graft: no new graft_sent_at, so a second PRUNE is taken.
        for named in _stream_chunks(crossed):
            out.append(Send(peer, self.topic, m.Graft(streams=named)))
        targets: dict[PeerId, list[tuple[PeerId | None, Tree]]] = {}
        for publisher, tree in orphans:
            target = self._parent_to_keep(tree, peer)
            if target is not None:
                self.counters.regrafts += 1
                targets.setdefault(target, []).append((publisher, tree))
        for target, trees in targets.items():
            self._graft(target, trees, now, out)

    def _parent_to_keep(self, tree: Tree, pruned: PeerId) -> PeerId | None:
        """Whom to graft back at once, as eager repair does when a parent goes down. With
        no parent every message waits for IHAVE and a GRAFT (0.3-0.5 s), or never comes
        when IHAVEs are lost (`--drop ihave=1.0`: both remaining parents pruned a node that
        forwarded repaired messages, and it missed the rest of the stream). The lazy
        neighbour that fed us most lately, the pruner itself only if no other did; with no
        such record, another lazy neighbour than the pruner. Its graft_grace keeps our
        in-flight forwards from pruning us again."""
        if not tree.lazy:
            return None
        parents = [p for p in tree.first_from if p in tree.lazy]
        others = [p for p in parents if p != pruned]
        another = next((p for p in tree.lazy if p != pruned), pruned)
        return (others or parents or [another])[-1]

    def _make_eager(
        self,
        peer: PeerId,
        trees: list[tuple[PeerId | None, Tree]],
        out: list[OutEvent],
        skip: tuple[m.StreamRange, ...] = (),
    ) -> None:
        made = [publisher for publisher, tree in trees if tree.make_eager(peer)]
        if not made:
            return
        # What was queued for IHAVE while the peer was lazy was not pushed to it, and the
        # next flush goes to lazy peers only: announce it now, or it falls through the gap
        # (seen in the simulator after a partition: a node lost its eager parent, grafted
        # its lazy peers, and a message that had just passed them never reached it).
        streams = None if None in made else set(made).__contains__
        self._send_ihave(peer, streams, out, skip)

    def _send_ihave(
        self,
        peer: PeerId,
        announced: Callable[[PeerId], bool] | None,
        out: list[OutEvent],
        skip: tuple[m.StreamRange, ...] = (),
    ) -> None:
        """Announce to `peer` what is queued for it of the publishers `announced` says yes
        to (None: all; `Announcements.runs_for`), as runs, in IHAVEs of at most
        max_ihave_ids messages and MAX_RANGES_PER_MESSAGE ranges."""
        places, batches = self.announcements.runs_for(
            peer, announced, skip, self.config.max_ihave_ids
        )
        if not places:
            return
        self.counters.ihave_ids_sent += places
        topic = self.topic
        for runs in batches:
            for ranges in _chunks(runs):
                out.append(Send(peer, topic, m.IHave(ranges=ranges)))

    def _is_neighbor(self, peer: PeerId) -> bool:
        shared = self.trees.shared
        return peer in shared.eager or peer in shared.lazy

    # -- publishing ---------------------------------------------------------------------

    def publish(
        self,
        payload: bytes,
        key: bytes | None,
        headers: tuple[tuple[str, bytes], ...],
        now: float,
        out: list[OutEvent],
        stream: tuple[PeerId, int] | None = None,
        timestamp_ms: int | None = None,
    ) -> MessageId | None:
        """Publish on our own stream, or at `stream` = (publisher, seq) of a named one,
        stamped `timestamp_ms` if given (named streams only), else now.

        A named stream's place that is taken already (delivered here, or held waiting for
        a gap) publishes nothing and reports AlreadyPublished; None is returned then.
        """
        if stream is not None and stream[0] == self.me:
            raise OwnStreamNamed("this node's own stream is numbered by the node: name another")
        publisher, seq = stream if stream is not None else (self.me, self.own_stream.next_seq)
        envelope = Envelope(
            publisher=publisher,
            seq=seq,
            timestamp_ms=int(now * 1000) if timestamp_ms is None else timestamp_ms,
            payload=payload,
            key=key,
            headers=headers,
        )
        if envelope.size > self.config.max_message_size:
            raise MessageTooLarge(self._too_large(envelope.size))
        return self._publish(envelope, stream, now, out)

    def publish_many(self, records: Sequence[Record], now: float, out: list[OutEvent]) -> None:
        """Publish `records` in order, as `publish` does each: all or none, so every
        record's size and place is looked at before the first is stamped. A Record was
        checked when it was made (envelope.py) and is trusted here."""
        check_publish_batch(records, self.me, self.config.max_message_size, self.topic)
        stamp = Envelope.stamp
        stamped_at = int(now * 1000)
        me, own = self.me, self.own_stream
        for record in records:
            place = record.stream
            if place is None:
                self._publish(stamp(record, me, own.next_seq, stamped_at), None, now, out)
            else:
                at = stamped_at if record.timestamp_ms is None else record.timestamp_ms
                self._publish(stamp(record, place[0], place[1], at), place, now, out)

    def _too_large(self, size: int) -> str:
        return too_large(size, self.config.max_message_size, self.topic)

    def _publish(
        self,
        envelope: Envelope,
        stream: tuple[PeerId, int] | None,
        now: float,
        out: list[OutEvent],
    ) -> MessageId | None:
        if stream is not None and self.ordering.place_taken(*stream):
            self.counters.republished += 1
            held = self.store.place(self.places, *stream)
            out.append(AlreadyPublished(self.topic, *stream, held))
            return None
        mid = self._message_id(envelope.unsigned)
        if self.signer is not None:
            envelope = self.signer.sign_message(mid, envelope)
        self.counters.published += 1
        self.store.add(self.places, mid, envelope, 0, now)
        if stream is None:
            self.own_stream.next_seq += 1
            out.append(Published(self.topic, mid, envelope))
        else:
            # A named stream's messages reach our own application the way a peer's do: in
            # order, once per place, so a second writer of the same place is dropped.
            self.ordering.deliver(mid, envelope, 0, now, out)
        gossip = m.Gossip(id=mid, envelope=envelope, hops=1)
        topic = self.topic
        for peer in self.trees.get(envelope.publisher).eager:
            out.append(Send(peer, topic, gossip))
        self._took_in(mid, envelope.publisher, envelope.seq, 0, None, now, out)
        return mid

    # -- messages -----------------------------------------------------------------------

    def on_message(
        self, peer: PeerId, msg: m.BroadcastMessage, now: float, out: list[OutEvent]
    ) -> None:
        match msg:
            case m.Gossip():
                self._on_gossip(peer, msg, now, out)
            case m.IHave(ranges=ranges):
                self._on_ihave(peer, ranges, now, out)
            case m.Prune(streams=streams):
                self._on_prune(peer, streams, now, out)
            case m.Graft(ranges=ranges, streams=streams):
                self._on_graft(peer, ranges, streams, now, out)
            case m.Pull(publisher=publisher, first_seq=first, last_seq=last):
                self._on_pull(peer, publisher, first, last, now, out)
            case m.Heads(ranges=ranges):
                self._on_heads(peer, ranges, now, out)
            case m.History():
                self._on_history(peer, msg, now, out)
            case _:
                assert_never(msg)  # a broadcast message without a case: a bug of ours

    def _on_gossip(self, peer: PeerId, msg: m.Gossip, now: float, out: list[OutEvent]) -> None:
        """Plumtree's push: a first copy, checked once before anything of it is kept, is
        kept, pushed to the eager peers, queued for IHAVE and delivered; a duplicate may
        prune its sender (`_on_duplicate`)."""
        if msg.hops >= m.MAX_HOPS:
            # Checked before it enters the store: forwarding needs hops + 1 on the wire.
            out.append(PeerMisbehaved(peer, f"GOSSIP hops {msg.hops} leaves no room to forward"))
            return
        mid = msg.id
        if mid in self.seen:
            self._on_duplicate(peer, msg, now, out)
            return
        envelope = self._checked_envelope(peer, msg, out)
        if envelope is None or self._rival_loses(peer, mid, envelope, out):
            return
        place = (envelope.publisher, envelope.seq)
        self.counters.gossip_received += 1
        self.store.add(self.places, mid, envelope, msg.hops, now, peer)
        if self.ordering.within_reach(envelope):
            # A stream reaching back for what was published after our join (ordering.py):
            # news to nobody downstream, so neither forwarded nor announced.
            self.missing.pop(place, None)
            self.ordering.reach_answer(peer, mid, envelope, msg.hops, now, out)
            return
        if self.ordering.behind_stream(envelope):
            # History, kept but not delivered again. An answer to our own fetch is news to
            # nobody downstream; any other copy may be live for nodes that joined before us.
            self.counters.recovered += 1
            out.append(Recovered(self.topic, mid, envelope))
            if self.ordering.fetched(*place):
                self.missing.pop(place, None)
                return
        missing = self.missing.pop(place, None) if self.missing else None
        publisher, seq = place
        hops = msg.hops
        tree = self.trees.get(publisher)
        neighbor = self._is_neighbor(peer)
        if neighbor:
            if peer in tree.lazy:
                self._lazy_sender_first(publisher, tree, peer, now, out)
            tree.fed_first(peer, now)
        holders: frozenset[PeerId] = _NOBODY
        if missing is not None:
            # Announcers hold it: a push there is a duplicate, answered by a PRUNE.
            holders = frozenset(p for p, _ in missing.announcers)
            self._expect_answers(mid, peer, missing)
        forward = None  # made for the first eager peer to push to (a leaf has none)
        topic = self.topic
        for eager_peer in tree.eager:
            if eager_peer != peer and eager_peer not in holders:
                if forward is None:
                    forward = msg.forwarded(hops + 1)
                out.append(Send(eager_peer, topic, forward))
        if missing is not None and neighbor:
            # After the push, as Plumtree does: the announcer we graft must not get this copy.
            self._maybe_optimize(publisher, tree, peer, hops, missing.announcers, now, out)
        self._took_in(mid, publisher, seq, hops, peer, now, out)
        if publisher != self.me:
            self.ordering.deliver(mid, envelope, hops, now, out)

    def _on_duplicate(self, peer: PeerId, msg: m.Gossip, now: float, out: list[OutEvent]) -> None:
        mid = msg.id
        self.counters.duplicates_received += 1
        self._note_holder(mid, peer)
        # Its place: from the store, which holds the first copy (a duplicate's bytes are
        # not decoded), else from its envelope when that decodes.
        place = self.store.place_of(mid)
        if place is None:
            try:
                place = msg.envelope.publisher, msg.envelope.seq
            except ValueError:
                return  # neither held nor decodable: no stream to prune it for
        publisher = place[0]
        if self.ordering.wants(*place) and self._take_again(msg, now, out):
            return
        tree = self.trees.get(publisher)
        if not self._asked_for(tree, peer, mid, now):
            self._prune_redundant(publisher, tree, peer, now, out)

    def _take_again(self, msg: m.Gossip, now: float, out: list[OutEvent]) -> bool:
        """Deliver a copy of a message whose place its stream still wants (ordering
        dropped it unheld: its held table was full). Checked as a first copy is (a
        duplicate's envelope is otherwise never decoded); not forwarded: it was, when
        first seen."""
        mid = msg.id
        try:
            again = msg.envelope
        except ValueError:
            return False
        if self._message_id(again.unsigned) != mid or (
            self.signer is not None and check_message(mid, again) is not None
        ):
            return False
        self.ordering.deliver(mid, again, msg.hops, now, out)
        return True

    def _asked_for(self, tree: Tree, peer: PeerId, mid: MessageId, now: float) -> bool:
        """Is this duplicate a copy we asked for rather than a redundant path? From a peer
        that sent us an empty GRAFT less than `graft_grace` ago (it lost its parent or
        swaps to us, and forwards what was in flight to it), or the answer to a GRAFT of
        ours for `mid` (we asked two announcers in turn and both answered)."""
        grafted = tree.grafted_since(peer)
        if grafted is not None and now - grafted < self.config.graft_grace:
            return True
        asked = self.graft_answers.get(mid)
        if asked is not None and peer in asked:
            asked.remove(peer)
            if not asked:
                del self.graft_answers[mid]
            return True
        return False

    def _prune_redundant(
        self, publisher: PeerId, tree: Tree, peer: PeerId, now: float, out: list[OutEvent]
    ) -> None:
        """Plumtree: the sender of a duplicate moves to lazy. Never our last eager link, nor
        our one parent (it alone has sent us messages first). A lazy peer that still pushes
        after `graft_grace` holds us eager (our PRUNE, or its GRAFT's answer, was lost): it
        is pruned again."""
        if peer in self.hubs:
            return  # hub_parent: the star's links stay eager
        if peer in tree.eager and len(tree.eager) > 1 and not tree.only_parent(peer):
            tree.make_lazy(peer)
            self._prune(peer, [(publisher, tree)], now, out)
        elif peer in tree.lazy and now - tree.pruned_since(peer) >= self.config.graft_grace:
            self._prune(peer, [(publisher, tree)], now, out)

    def _checked_envelope(
        self, peer: PeerId, msg: m.Gossip, out: list[OutEvent]
    ) -> Envelope | None:
        """A first copy's envelope, if it is canonical, matches its id, fits
        max_message_size and (signing on) is signed by its publisher; else None, and the
        peer misbehaved."""
        try:
            envelope = msg.envelope
        except ValueError as exc:
            out.append(PeerMisbehaved(peer, f"GOSSIP envelope is not canonical: {exc}"))
            return None
        mid = msg.id
        if self._message_id(envelope.unsigned) != mid:
            self.counters.bad_ids += 1
            out.append(PeerMisbehaved(peer, "GOSSIP id does not match its envelope"))
            return None
        if envelope.size > self.config.max_message_size:
            out.append(
                PeerMisbehaved(peer, f"GOSSIP of {envelope.size} bytes exceeds max_message_size")
            )
            return None
        if self.signer is not None and (problem := check_message(mid, envelope)) is not None:
            self.counters.bad_signatures += 1
            out.append(PeerMisbehaved(peer, f"GOSSIP of {envelope.publisher!r} {problem}"))
            return None
        return envelope

    def _lazy_sender_first(
        self, publisher: PeerId, tree: Tree, peer: PeerId, now: float, out: list[OutEvent]
    ) -> None:
        """A lazy neighbour sent us a message first: it becomes eager at both ends (an empty
        GRAFT: the copy may be a PULL answer, not an eager push), unless we pruned it less
        than `graft_grace` ago: then the copy left before our PRUNE arrived, and the peer
        makes us lazy on reading it."""
        if now - tree.pruned_since(peer) >= self.config.graft_grace:
            self._graft(peer, [(publisher, tree)], now, out)

    def _expect_answers(self, mid: MessageId, peer: PeerId, missing: Missing) -> None:
        """The other announcers we GRAFTed `mid` from will answer: their copies are ones we
        asked for, not a redundant path (`_asked_for`)."""
        asked = [p for p in missing.grafted_from if p != peer]
        if asked:
            self.graft_answers[mid] = asked
            if len(self.graft_answers) > self.config.max_missing:
                self.graft_answers.popitem(last=False)

    def _rival_loses(
        self, peer: PeerId, mid: MessageId, envelope: Envelope, out: list[OutEvent]
    ) -> bool:
        """A first copy for a place that holds another message (a sink row written again
        with another stamp): one of the two must win on every node, by the store's rule
        (`MessageStore.takes_place`). A losing rival is dropped, and the sender gets the
        winner, so that it converges too; a winning one goes on as any first copy,
        replacing the place's message here (the place stays delivered)."""
        keeper = self.store.takes_place(
            self.places, envelope.publisher, envelope.seq, envelope.timestamp_ms, mid
        )
        if keeper < 0:
            if keeper == -2:
                self.counters.rivals_won += 1
            return False
        self.counters.rivals_refused += 1
        out.append(Send(peer, self.topic, self.store.row(keeper).gossip(1)))
        return True

    def fetch(
        self, peer: PeerId, publisher: PeerId, first: int, last: int, out: list[OutEvent]
    ) -> None:
        """PULL first..last of `publisher` from `peer`, in spans the wire allows."""
        self.ordering.fetch(peer, publisher, first, last, out)

    def _maybe_optimize(
        self,
        publisher: PeerId,
        tree: Tree,
        eager_sender: PeerId,
        hops: int,
        announcers: list[tuple[PeerId, int]],
        now: float,
        out: list[OutEvent],
    ) -> None:
        """Plumtree's optimisation: a lazy path `threshold` hops shorter replaces the eager one."""
        best = min(
            ((h, p) for p, h in announcers if p in tree.lazy),
            default=None,
            key=lambda item: item[0],
        )
        if best is None:
            return
        lazy_hops, lazy_peer = best
        if hops - (lazy_hops + 1) >= self.config.optimization_threshold:
            self.counters.optimizations += 1
            self._graft(lazy_peer, [(publisher, tree)], now, out)
            tree.make_lazy(eager_sender)
            self._prune(eager_sender, [(publisher, tree)], now, out)

    def _prefer_near_parent(
        self,
        publisher: PeerId,
        peer: PeerId,
        mid: MessageId,
        hops: int,
        now: float,
        out: list[OutEvent],
    ) -> None:
        """Swap a far eager parent for a near lazy announcer of a message it sent us first.

        Plumtree keeps whichever copy comes first. On the zones model 32 of a message's 36
        cross-zone copies were first copies over far links, and for 19 of them a lazy
        zone-mate held the message 1-2 ms later; its IHAVE came at its next flush, and
        nothing moved the node to it (docs/simulation.md). Its copy costs a near link
        instead of a far one, for at most its RTT of latency. The announcer must be
        nearer by `near_parent_factor` by our own RTT samples (a peer's word counts for
        nothing here) and announce fewer hops than ours: hops then fall strictly along
        every parent taken, so two nodes cannot take each other (at equal hops they did,
        and cut subtrees off: 2-D p99 124 -> 448 ms, seed 1). Its copy, by the IHAVE's
        arrival less one flush interval, must have been able to reach us no later than
        ours + its RTT. Once per `graft_grace`, so that a swap's GRAFT and PRUNE settle
        before the next."""
        c = self.config
        rtts = self.rtts
        if c.near_parent_factor == 0 or rtts is None:
            return
        tree = self.trees.peek(publisher)
        if (
            peer not in tree.lazy
            or now - tree.swapped_at < c.graft_grace
            or now - tree.pruned_since(peer) < c.graft_grace
        ):
            return
        cached = self.store.cached(mid)
        if cached is None or hops >= cached.hops:
            return
        parent = cached.sender
        if parent is None or parent not in tree.eager:
            return
        near_rtt, far_rtt = rtts.measured(peer), rtts.measured(parent)
        if near_rtt is None or far_rtt is None or near_rtt * c.near_parent_factor >= far_rtt:
            return
        if now - c.ihave_interval > cached.received_at + near_rtt:
            return
        tree = self.trees.get(publisher)  # the stream's own (peek gave it, or shared)
        tree.swapped_at = now
        self.counters.near_parent_swaps += 1
        self._graft(peer, [(publisher, tree)], now, out)
        tree.make_lazy(parent)
        self._prune(parent, [(publisher, tree)], now, out)

    def _race_lazy_announcer(
        self,
        publisher: PeerId,
        peer: PeerId,
        mid: MessageId,
        hops: int,
        now: float,
        out: list[OutEvent],
    ) -> None:
        """Race a lazy neighbour that announces a message we hold at fewer hops than ours.

        A tree keeps whichever copy came first when its links were made, and a link pruned
        then stays lazy when the paths upstream change (overlay upkeep moves them all the
        time): at 300 nodes, 8 senders, most deliveries slower than 1.2x the fastest path
        the overlay offered sat below a NEAR link both ends had pruned. Hops do not rank
        paths by latency (swapping on hops alone raised p99 by 8-26%), so the announcer is
        only raced: an empty GRAFT for the stream makes it push to us, and Plumtree's
        duplicate rule prunes whichever of it and our parent is slower on the next
        message. We stay lazy towards it (a copy our way is all the race needs). Only when
        its copy likely came first: its IHAVE left it up to a flush period (ours stands for
        its) after it had the message, so an IHAVE that comes RACE_WINDOW periods or more
        after our copy more likely than not shows a slower path. Once per graft_grace per
        tree, and never to a peer we pruned less than `race_backoff` ago (it lost a race,
        or its link was redundant)."""
        c = self.config
        tree = self.trees.peek(publisher)
        if (
            peer not in tree.lazy
            or now - tree.swapped_at < c.graft_grace
            or now - tree.pruned_since(peer) < c.race_backoff
        ):
            return
        cached = self.store.cached(mid)
        if (
            cached is None
            or cached.hops - (hops + 1) < c.race_lazy_hops
            or now - self.ihave_period * RACE_WINDOW > cached.received_at
        ):
            return
        tree = self.trees.get(publisher)  # the stream's own (peek gave it, or shared)
        tree.swapped_at = now
        tree.note_graft_sent(peer, now)
        self.counters.lazy_races += 1
        for streams in _stream_chunks([(publisher, tree)]):
            out.append(Send(peer, self.topic, m.Graft(streams=streams)))

    def _on_ihave(
        self,
        peer: PeerId,
        ranges: tuple[m.StreamRange, ...],
        now: float,
        out: list[OutEvent],
    ) -> None:
        if not self._is_neighbor(peer):
            return  # IHAVE is lazy push along active links only
        c = self.config
        missing = self.missing
        streams = self.ordering.streams
        announcements = self.announcements
        for announced in ranges:
            publisher, first, last, hops = announced
            announcements.note_announced(peer, announced)
            if c.near_parent_factor or c.race_lazy_hops:
                held = self.store.place(self.places, publisher, last)
                if held is not None:
                    if c.near_parent_factor:
                        self._prefer_near_parent(publisher, peer, held, hops, now, out)
                    if c.race_lazy_hops:
                        self._race_lazy_announcer(publisher, peer, held, hops, now, out)
            if publisher == self.me:
                continue  # our own stream: we hold all of it that exists
            stream = streams.get(publisher)
            if stream is not None and last < stream.next_seq:
                continue  # wholly behind the stream's position: delivered or given up
            for seq in range(first, last + 1):
                place = (publisher, seq)
                if self._holds(place):
                    continue
                entry = missing.get(place)
                if entry is None:
                    if len(missing) >= c.max_missing:
                        continue
                    entry = missing[place] = Missing(announcers=[(peer, hops)])
                    self._due(now + c.graft_timeout, place, entry)
                elif len(entry.announcers) < c.max_announcers and all(
                    p != peer for p, _ in entry.announcers
                ):
                    entry.announcers.append((peer, hops))
        if missing and _MISSING not in self._armed:
            self._arm(_MISSING, c.graft_timeout, out)

    def _on_heads(
        self, peer: PeerId, ranges: tuple[m.StreamRange, ...], now: float, out: list[OutEvent]
    ) -> None:
        """A neighbour's stream heads: the places above what our stream holds, up to each
        head (the head alone for a stream we have not seen), are announced to us, as by an
        IHAVE. Below our highest held message a gap is ordering's to pull: announcing it
        too fetched it twice. Bounded: MAX_TAIL_PLACES per head, MAX_IDS_PER_MESSAGE in
        all, so a HEADS costs what an IHAVE may; a lying head costs GRAFTs to its sender
        until given up."""
        if not self._is_neighbor(peer):
            return
        streams = self.ordering.streams
        budget = m.MAX_IDS_PER_MESSAGE
        announced: list[m.StreamRange] = []
        tails: dict[PeerId, int] = {}  # publisher -> the first seq above what we hold
        for publisher, _, head, hops in ranges:
            self.heads.held_by(publisher, head, peer)
            if publisher == self.me:
                continue
            tail = tails.get(publisher)
            if tail is None:
                stream = streams.get(publisher)
                tail = head if stream is None else max(stream.held, default=stream.next_seq - 1) + 1
                tails[publisher] = tail
            first = max(tail, head - MAX_TAIL_PLACES + 1, head - budget + 1)
            if first > head:
                continue  # wholly behind our stream's position
            budget -= head - first + 1
            announced.append((publisher, first, head, hops))
            if budget <= 0:
                break
        if announced:
            self._on_ihave(peer, tuple(announced), now, out)

    def _holds(self, place: Place) -> bool:
        """Have we this place's message: in the store, delivered or given up, or held?"""
        return self.places.row(*place) is not None or self.ordering.place_taken(*place)

    def _on_graft(
        self,
        peer: PeerId,
        ranges: tuple[m.StreamRange, ...],
        streams: tuple[PeerId, ...],
        now: float,
        out: list[OutEvent],
    ) -> None:
        if self._is_neighbor(peer):
            self._grafted(peer, ranges, streams, now, out)
        if ranges:
            self._ask(peer, False, [(p, first, last) for p, first, last, _ in ranges], now, out)

    def _grafted(
        self,
        peer: PeerId,
        ranges: tuple[m.StreamRange, ...],
        streams: tuple[PeerId, ...],
        now: float,
        out: list[OutEvent],
    ) -> None:
        """A GRAFT makes the sender eager in the trees of the streams it names and of its
        ranges' publishers (every tree when it names neither). A stream it names without
        a range is a lost parent or a swap: its in-flight duplicates are not pruned for
        graft_grace (`_asked_for`)."""
        if ranges:
            get = self.trees.get
            named = dict.fromkeys((*streams, *(r[0] for r in ranges)))
            self._make_eager(peer, [(p, get(p)) for p in named], out, skip=ranges)
            trees = [(p, get(p)) for p in dict.fromkeys(streams)]
        else:
            trees = self._trees_named(streams)
            self._make_eager(peer, trees, out)
        for _, tree in trees:
            tree.note_grafted(peer, now)

    def _on_pull(
        self,
        peer: PeerId,
        publisher: PeerId,
        first: int,
        last: int,
        now: float,
        out: list[OutEvent],
    ) -> None:
        """Answer from the store."""
        self._ask(peer, True, [(publisher, first, last)], now, out)

    def _ask(
        self,
        peer: PeerId,
        pull: bool,
        ranges: list[tuple[PeerId, int, int]],
        now: float,
        out: list[OutEvent],
    ) -> None:
        """A PULL's or GRAFT's ranges, answered a batch at a time (answers.py)."""
        if self.answers.ask(peer, pull, ranges, self._at_place, self._history(now), out):
            self._arm_answers(out)

    def _history(self, now: float) -> HistoryReader:
        """A PULL's places as of `now`: the store's message at a place."""
        reader, places = self.store.reader, self.places

        def held_at(publisher: PeerId) -> Callable[[int], tuple[bytes, int] | None]:
            return reader(places, publisher, now)

        return held_at

    def answers_drained(self, peer: PeerId, now: float, out: list[OutEvent]) -> None:
        """`peer` has read the answers it was sent: its next batch, if any waits."""
        self.answers.drained(peer, self._at_place, self._history(now), out)

    def forget_answers(self, peer: PeerId) -> None:
        """`peer`'s connection went: what it asked and was not sent is not made."""
        self.answers.forget(peer)

    def _arm_answers(self, out: list[OutEvent]) -> None:
        interval = self.config.answer_interval
        if interval is not None:
            self._arm(BroadcastTimer.ANSWERS, interval, out)

    def _on_history(self, peer: PeerId, msg: m.History, now: float, out: list[OutEvent]) -> None:
        """A PULL answered in bulk (history.py). Each envelope is checked as a GOSSIP's
        first copy is, its id computed from its bytes. A message that is history we
        fetched goes to the store only (Recovered), held but not seen: not delivered, not
        forwarded, and a live copy of it is still a first copy; a copy fetched twice is
        Recovered twice and the store holds one. Any other goes the GOSSIP way (a gap
        repair's answer is live). A pack that is not one publisher's rising seqs, or holds
        a bad envelope, ends there."""
        last_seq = -1
        for raw, hops in zip(msg.envelopes, msg.hops, strict=True):
            try:
                envelope = Envelope.decode(raw)
            except ValueError as exc:
                out.append(PeerMisbehaved(peer, f"HISTORY envelope is not canonical: {exc}"))
                return
            if envelope.publisher != msg.publisher or envelope.seq <= last_seq:
                out.append(PeerMisbehaved(peer, "HISTORY is not one publisher's rising seqs"))
                return
            last_seq = envelope.seq
            mid = self._message_id(envelope.unsigned)
            if mid in self.seen or not (
                self.ordering.fetched(msg.publisher, envelope.seq)
                and self.ordering.behind_stream(envelope)
            ):
                self._on_gossip(peer, m.Gossip(id=mid, envelope=envelope, hops=hops), now, out)
                continue
            if envelope.size > self.config.max_message_size:
                out.append(PeerMisbehaved(peer, f"HISTORY message of {envelope.size} bytes"))
                return
            if self.signer is not None and (problem := check_message(mid, envelope)) is not None:
                self.counters.bad_signatures += 1
                out.append(PeerMisbehaved(peer, f"HISTORY of {envelope.publisher!r} {problem}"))
                return
            if self._rival_loses(peer, mid, envelope, out):
                continue
            self.counters.gossip_received += 1
            self.counters.recovered += 1
            self.store.add(self.places, mid, envelope, hops, now, peer, seen=False)
            out.append(Recovered(self.topic, mid, envelope))
            self.missing.pop((envelope.publisher, envelope.seq), None)

    # -- timers -------------------------------------------------------------------------

    def on_timer(self, timer: BroadcastTimer, now: float, out: list[OutEvent]) -> None:
        self._armed.discard(timer)
        match timer:
            case BroadcastTimer.IHAVE:
                self._flush_ihave(out)
            case BroadcastTimer.MISSING:
                self._graft_due(now, out)
            case BroadcastTimer.GAP:
                tree = self._latest_tree()
                self.ordering.on_gap_timer([*tree.eager, *tree.lazy], now, out)
            case BroadcastTimer.SETTLE:
                tree = self._latest_tree()
                self.ordering.on_settle_timer([*tree.eager, *tree.lazy], now, out)
            case BroadcastTimer.HEADS:
                self._send_heads(now, out)
            case BroadcastTimer.ANSWERS:
                if self.answers.retry(self._at_place, self._history(now), out):
                    self._arm_answers(out)
            case _:
                assert_never(timer)

    def _took_in(
        self,
        mid: MessageId,
        publisher: PeerId,
        seq: int,
        hops: int,
        sender: PeerId | None,
        now: float,
        out: list[OutEvent],
    ) -> None:
        """A message we published or took in first (from `sender`; None: our own): its
        stream's head moves, and it waits for the IHAVE flush (not announced to `sender`)."""
        self.heads.note(publisher, seq, hops, sender, now)
        self.announcements.add(mid, publisher, seq, hops, sender)
        armed = self._armed
        if _HEADS not in armed:
            self._arm(_HEADS, self.config.heads_quiet, out, upkeep=True)
        if _IHAVE not in armed:
            interval = self.ihave_period
            self._arm(_IHAVE, interval, out, early=interval * IHAVE_EARLY)

    def _arm(
        self,
        timer: BroadcastTimer,
        delay: float,
        out: list[OutEvent],
        *,
        upkeep: bool = False,
        early: float = 0.0,
    ) -> None:
        """Set `timer` `delay` seconds from now, unless it is set already."""
        if timer in self._armed:
            return
        self._armed.add(timer)
        token = (*self._timer_prefix, timer)
        out.append(ScheduleTimer(delay, token, upkeep=upkeep, early=early))

    def _send_heads(self, now: float, out: list[OutEvent]) -> None:
        """Name the heads gone quiet to each neighbour not known to hold them."""
        heads = self.heads
        due = heads.take_due(now)
        if due:
            topic = self.topic
            for peer in [*self.eager, *self.lazy]:
                for ranges in _chunks(heads.ranges_for(peer, due)):
                    out.append(Send(peer, topic, m.Heads(ranges=ranges)))
        wait = heads.next_due(now)
        if wait is not None:
            self._arm(_HEADS, max(wait, self.config.heads_quiet / 2), out, upkeep=True)

    def _note_holder(self, mid: MessageId, peer: PeerId) -> None:
        """`peer` holds `mid` (it sent or announced it): while `mid` waits for the IHAVE
        flush, it is not announced to `peer`. On a lazy link both ends announced every
        message to each other, and IHAVE frames were ~70% of what a config benchmark
        node sent at 10 updates/s (its CPU goes to per-frame syscalls, not Python)."""
        if self._is_neighbor(peer):
            self.announcements.note_holder(mid, peer)

    def _flush_ihave(self, out: list[OutEvent]) -> None:
        """Announce to each neighbour what it is lazy for: the queued messages of the
        streams whose tree has it lazy now (the latest tree's lazy neighbours first)."""
        peek = self.trees.peek
        shared = self.trees.shared
        latest = self._latest_tree()
        for peer in dict.fromkeys([*latest.lazy, *shared.eager, *shared.lazy]):
            if not self.trees.by_stream:  # one tree for every stream: one answer for all
                if peer not in shared.eager:
                    self._send_ihave(peer, None, out)
                continue

            def lazy_here(publisher: PeerId, peer: PeerId = peer) -> bool:
                return peer not in peek(publisher).eager

            self._send_ihave(peer, lazy_here, out)
        self.announcements.clear()

    def _due(self, at: float, place: Place, entry: Missing) -> None:
        """Queue `entry`'s next GRAFT at `at` (never before any queued one: `at` is now +
        a fixed delay). Stale rows are dropped when they outnumber the live ones."""
        due = self.missing_due
        due.append((at, place, entry))
        if len(due) > 2 * self.config.max_missing:
            missing = self.missing
            self.missing_due = deque(row for row in due if missing.get(row[1]) is row[2])

    def _graft_due(self, now: float, out: list[OutEvent]) -> None:
        """Plumtree's per-message timer, kept as one queue and one timer: a place still
        missing `graft_timeout` after its first IHAVE is GRAFTed from its first announcer,
        then every missing_check_interval from the next, until missing_give_up_ticks."""
        c = self.config
        missing = self.missing
        due = self.missing_due
        grafts: dict[PeerId, list[tuple[PeerId, int, int]]] = {}
        until = now + DUE_SLACK
        while due and due[0][0] <= until:
            _, place, entry = due.popleft()
            if missing.get(place) is not entry:
                continue  # received (or given up) since it was queued
            entry.ticks += 1
            if entry.ticks > c.missing_give_up_ticks:
                del missing[place]  # the per-publisher gap pull may still recover it
                continue
            live = [p for p, _ in entry.announcers if self._is_neighbor(p)]
            if not live:
                del missing[place]
                continue
            peer = live[(entry.ticks - 1) % len(live)]
            if peer not in entry.grafted_from:
                entry.grafted_from.append(peer)
            grafts.setdefault(peer, []).append((*place, 0))
            self._due(now + c.missing_check_interval, place, entry)
        get = self.trees.get
        for peer, places in grafts.items():
            publishers = dict.fromkeys(place[0] for place in places)
            self._make_eager(peer, [(p, get(p)) for p in publishers], out)
            for start in range(0, len(places), c.max_graft_ids):
                for ranges in _chunks(_runs(places[start : start + c.max_graft_ids])):
                    self.counters.grafts_sent += 1
                    self.counters.graft_ids_sent += sum(r[2] - r[1] + 1 for r in ranges)
                    self._graft_ranges(peer, ranges, now, out)
        while due and missing.get(due[0][1]) is not due[0][2]:
            due.popleft()  # received since: no wakeup for it
        if due:
            self._arm(_MISSING, max(due[0][0] - now, 0.0), out)


def _pushes_race(me: PeerId, peer: PeerId) -> bool:
    """Is `me` the end of a new link that pushes in a race one end pushes? The lower id, so
    that both ends agree without a message."""
    try:
        return bool(me < peer)  # type: ignore[operator]
    except TypeError:
        return repr(me) < repr(peer)


def _spread_share(me: PeerId, spread: float) -> float:
    """A node's own multiple of ihave_interval, 1 - spread/2 .. 1 + spread/2, fixed by its id
    (crc32: nodes differ, and a node's period stays put)."""
    if not spread:
        return 1.0
    key = me if isinstance(me, bytes) else repr(me).encode()
    return 1.0 - spread / 2 + spread * (zlib.crc32(key) / 2**32)


def _runs(places: list[tuple[PeerId, int, int]]) -> list[m.StreamRange]:
    """`places` (publisher, seq, hops) as runs: consecutive seqs of one publisher at one
    hop count make one range; ranges come in the order of their first place."""
    runs: list[list[Any]] = []  # [publisher, first, last, hops]
    open_runs: dict[PeerId, list[Any]] = {}
    for publisher, seq, hops in places:
        run = open_runs.get(publisher)
        if run is not None and seq == run[2] + 1 and hops == run[3]:
            run[2] = seq
            continue
        run = [publisher, seq, seq, hops]
        open_runs[publisher] = run
        runs.append(run)
    return [(p, first, last, hops) for p, first, last, hops in runs]


def _stream_chunks(trees: list[tuple[PeerId | None, Tree]]) -> list[tuple[PeerId, ...]]:
    """The streams of `trees` in groups of at most MAX_STREAMS_PER_MESSAGE, one PRUNE or
    GRAFT each; one naming none (every tree, the whole link) when `shared` is among them."""
    streams = [p for p, _ in trees if p is not None]
    if len(streams) < len(trees):
        return [()]
    size = m.MAX_STREAMS_PER_MESSAGE
    return [tuple(streams[i : i + size]) for i in range(0, len(streams), size)]


def _chunks(ranges: list[m.StreamRange]) -> list[tuple[m.StreamRange, ...]]:
    """`ranges` in groups of at most MAX_RANGES_PER_MESSAGE, one message each."""
    size = m.MAX_RANGES_PER_MESSAGE
    return [tuple(ranges[i : i + size]) for i in range(0, len(ranges), size)]
