"""Protocol parameters. Every default says where it came from.

Sources: "draft" = libp2p's Episub draft (pubsub/gossipsub/episub.md, 2018);
"HyParView" = Leitão et al., DSN 2007; "Plumtree" = Leitão et al., SRDS 2007;
"GoCast" = Tang et al., DSN 2005; "iroh" = iroh-gossip's proto config;
"tuned" = chosen with the simulator (docs/simulation.md says which runs);
"guess" = no source, a reasoned starting point.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from episub.proto import messages as m


def _positive(name: str, value: float) -> None:
    if not value > 0:
        raise ValueError(f"{name} must be > 0, not {value!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class MembershipConfig:
    c_rand: int = 4  # draft: C_rand = log(N) for N = 10,000
    c_near: int = 3  # draft
    proximity: bool = True  # GoCast's near links; False = plain HyParView (random links only)
    max_active_factor: float = 2.0  # guess: a view may oversubscribe to 2A, never more
    passive_size: int = 42  # draft: P = 6 * A (HyParView's k = 6)
    join_ttl: int = 6  # HyParView: ARWL = 6
    forward_join_ttl: int = 3  # HyParView: PRWL = 3 (each hop of the walk learns the joiner)
    shuffle_ttl: int = 6  # iroh: shuffle_random_walk_length = 6
    shuffle_active: int = 3  # HyParView: k_a = 3
    shuffle_passive: int = 4  # HyParView: k_p = 4
    leave_ttl: int = 2  # guess: two rings of eager diffusion reach ~A^2 nodes
    # 60 s (iroh's) left survivors of a 95% crash out of the overlay for good
    # (tests/test_sim_scenarios.py): their passive views refresh too slowly.
    shuffle_interval: float = 30.0  # guess: iroh uses 60 s; halved for faster churn recovery
    # 4 s (and probes every 6 s) halved idle wakeups before upkeep rode on 2 s ticks, but
    # the simulator's 4-sender run went from RMR 0.027, p99 306 ms to 0.111, 665 ms.
    stabilize_interval: float = 2.0  # guess: GoCast maintains every second or so
    # ... while the active view is not at its size (thin or oversubscribed).
    stabilize_interval_unsettled: float = 2.0  # guess: GoCast maintains every second or so
    optimize_interval: float = 5.0  # guess: slower than stabilisation so swaps settle
    # ... and this often while the near links still improve (the last round asked for a
    # link): 90 s of rounds every 5 s left near links far from converged (docs/simulation.md).
    optimize_interval_improving: float = 1.0  # tuned: docs/simulation.md, proximity runs
    # Pings are most of the control traffic (the simulator shows 60%), so they are sparse:
    ping_interval: float = 10.0  # guess: an RTT sample and view refresh per neighbour per 10 s
    # Upkeep rides on 2 s ticks (the runtime), so probing every 2 s costs few wakeups.
    passive_probe_interval: float = 2.0  # guess: the 42 passive peers measured in ~90 s
    # ... and as often as before while some passive peer or near candidate has no RTT yet,
    # so that a new overlay finds its near links as fast as it did.
    passive_probe_interval_unmeasured: float = 2.0  # guess: 42 passive peers in ~90 s
    passive_probes_per_tick: int = 1  # guess
    # ... and this many while near candidates have no RTT yet: one a tick measured few of
    # the candidates neighbours' views bring before newer ones pushed them out.
    passive_probes_per_tick_unmeasured: int = 4  # tuned: docs/simulation.md, proximity runs
    ping_timeout: float = 5.0  # guess: far above any RTT we serve
    neighbor_request_timeout: float = 2.0  # guess: iroh waits 500 ms; we allow slow links
    join_retry_interval: float = 3.0  # guess
    # A node with no neighbour and no passive peer asks its contacts and the peers it
    # remembers again, first after recovery_retry, the wait doubling up to its maximum.
    recovery_retry: float = 1.0  # guess: a few round trips; the first attempt is at once
    recovery_max_retry: float = 60.0  # guess: an isolated node costs its contacts little
    recovery_fanout: int = 16  # guess: remembered peers (from the RTT table) asked per attempt
    timer_jitter: float = 0.25  # guess: +-25% so periodic work does not synchronise
    alpha: float = 1.5  # tuned: 2.0 converged slower (docs/simulation.md, proximity runs)
    rtt_smoothing: float = 0.125  # RFC 6298's alpha for SRTT
    rtt_variation_gain: float = 0.25  # RFC 6298's beta for RTTVAR (see Proximity.nearer)
    left_memory: float = 60.0  # guess: how long a LEAVE keeps a peer out of our views
    max_left_memory: int = 4096  # bound on remembered departures
    recent_reject_memory: float = 10.0  # guess: don't re-ask a peer that just refused
    max_pending_requests: int = 4  # guess: neighbour requests in flight at once
    near_candidates: int = 16  # guess: peers of near neighbours kept as near candidates
    max_shuffle_intake: int = 16  # guess: passive entries one SHUFFLE may bring (k_a+k_p+1=8)
    initial_probes: int = 8  # guess: RTT probes sent to fresh contacts when joining
    dormant_size: int = 16  # guess: unreachable peers re-probed, so split overlays re-merge
    dormant_retry: float = 10.0  # guess: first re-probe of an unreachable peer; doubles after
    dormant_max_retry: float = 120.0  # guess: ceiling of that backoff
    # A contact (a node others join through: they asked it for peers, GETNODES) takes in
    # every joiner's JOIN with a link of its own, up to this many such links beside its A,
    # and the joiner keeps its link to its contact beside its own A; stabilisation drops
    # neither end's (membership.py, "hub links"). 0: off, a contact takes a joiner in only
    # while its view has room (HyParView). Configuration topics set it: one writer, the
    # readers' contact, reaches every reader in one hop.
    hub_links: int = 0
    # Once a node is settled (its view at size, every known peer measured, the last
    # optimisation round asked for nothing), its pings, probes, stabilisation and
    # optimisation come this many times less often (shuffles at most twice), and it does
    # not ping a link the peer pinged within that ping period; timers set at the old pace
    # (but optimisation) are re-armed when it settles; anything that unsettles it brings
    # the periods above back at its next timer. None: 1 (every period as above, nothing
    # re-armed) in the core and the simulator; the trio runtime sets its own (episub/net/runtime.py
    # SETTLED_UPKEEP), because a real process pays ~0.5 ms of CPU per wakeup and its
    # kernel watches the connections (TCP keepalive) between pings.
    settled_upkeep: float | None = None
    # Does a PONG give an RTT sample? None: yes in the core and the simulator; the trio
    # runtime says no where it feeds the kernel's RTT of every connection instead
    # (RttMeasured: measured by TCP's own segments, without the receiving process's
    # scheduling delay, and without a PING), and yes where it cannot (no TCP_INFO, or
    # emulated link delays the kernel never sees).
    pong_rtt: bool | None = None

    def __post_init__(self) -> None:
        if self.c_rand < 1:
            raise ValueError(
                f"c_rand must be >= 1 (the overlay needs random links), not {self.c_rand}"
            )
        if self.c_near < 0:
            raise ValueError(f"c_near must be >= 0, not {self.c_near}")
        if self.hub_links < 0:
            raise ValueError(f"hub_links must be >= 0 (0: off), not {self.hub_links}")
        if self.hub_links and self.proximity:
            raise ValueError("hub_links needs proximity=False: hub links are labelled NEAR")
        if self.passive_size < 1:
            raise ValueError(f"passive_size must be >= 1, not {self.passive_size}")
        for name in ("join_ttl", "forward_join_ttl", "shuffle_ttl", "leave_ttl"):
            value = getattr(self, name)
            if not 0 <= value <= m.MAX_TTL:
                raise ValueError(f"{name} must be in 0..{m.MAX_TTL}, not {value}")
        for name in (
            "shuffle_interval",
            "stabilize_interval",
            "optimize_interval",
            "optimize_interval_improving",
            "ping_interval",
            "passive_probe_interval",
            "passive_probe_interval_unmeasured",
            "stabilize_interval_unsettled",
            "ping_timeout",
            "neighbor_request_timeout",
            "join_retry_interval",
            "recovery_retry",
            "recovery_max_retry",
        ):
            _positive(name, getattr(self, name))
        if not self.alpha >= 1.0:
            raise ValueError(f"alpha must be >= 1, not {self.alpha}")
        if not 0.0 <= self.rtt_variation_gain <= 1.0:
            raise ValueError(f"rtt_variation_gain must be in [0, 1], not {self.rtt_variation_gain}")
        if not 0.0 < self.rtt_smoothing <= 1.0:
            raise ValueError(f"rtt_smoothing must be in (0, 1], not {self.rtt_smoothing}")
        if self.settled_upkeep is not None and not self.settled_upkeep >= 1.0:
            raise ValueError(f"settled_upkeep must be >= 1, not {self.settled_upkeep!r}")
        if not 0.0 <= self.timer_jitter < 1.0:
            raise ValueError(f"timer_jitter must be in [0, 1), not {self.timer_jitter}")

    @property
    def active_size(self) -> int:
        """A = C_rand + C_near (draft)."""
        return self.c_rand + self.c_near

    @property
    def max_active(self) -> int:
        """The hard cap on the active view, oversubscription included."""
        return max(self.active_size + 1, int(self.active_size * self.max_active_factor))


@dataclass(frozen=True, slots=True, kw_only=True)
class BroadcastConfig:
    ihave_interval: float = 0.1  # draft: "a period in the order of 0.1s"
    # Each node flushes every ihave_interval times its own share of 1 - spread/2 ..
    # 1 + spread/2 (fixed by its id). 0: every node flushes ihave_interval after the first
    # id it queued, so nodes fed the same messages at the same time flush together: on a
    # config topic (32 readers fed by one writer) every ~20th write met 32 flushes and
    # their ~150 IHAVE frames at once, 10-20 ms late (the benchmark's p99).
    ihave_spread: float = 0.0
    # A place announced by IHAVE and not received is GRAFTed this long after its first
    # announcement (Plumtree's per-message timer), then every missing_check_interval from
    # the next announcer. An IHAVE can trail its announcer's copy by one flush interval,
    # so an eager copy later than that comes by a slower path than the lazy one.
    graft_timeout: float = 0.1  # = ihave_interval
    missing_check_interval: float = 0.2  # guess: an answer's round trip, with room
    missing_give_up_ticks: int = 25  # guess: ~5 s of grafting before giving an id up
    # The draft: "closer to the diameter of the tree to avoid constant changes". iroh uses 7;
    # at 7 the simulator saw 4 senders flutter (RMR 0.38, p50 327 ms; 15: 0.11, 204 ms).
    optimization_threshold: int = 15
    # Near parent (broadcast.py, `_prefer_near_parent`): a lazy announcer whose RTT is this
    # many times smaller than our eager parent's, and whose copy was about as early, takes
    # its place. 0: off (the default). At 4 the simulator's zones model met its 4x target
    # on 4 seeds of 5 (mean 4.4x, 3.67x off), but the 2-D model's p99 rose on 3 seeds of 5
    # (docs/simulation.md): for deployments whose far links cost much more than near ones.
    near_parent_factor: float = 0.0
    # The draft recommends it "for applications that value latency minimization"; with
    # proximity swaps it cut p99 from 447 to 199 ms at 1,000 nodes (docs/simulation.md).
    eager_repair: bool = True
    # Lazy neighbours grafted by eager repair, those that fed us most lately first: all of
    # them (up to 13) pushed a copy each, both ways, for graft_grace (churn RMR 0.08).
    eager_repair_grafts: int = 2
    # A RAND link that comes up while an eager neighbour feeds us starts lazy at both ends
    # (broadcast.py `neighbor_up`): links made by overlay upkeep and repair carried a
    # redundant copy of every message until their first duplicate pruned them.
    lazy_start: bool = True
    # Hub links (MembershipConfig.hub_links, which labels them NEAR): a NEAR link stays
    # eager (a duplicate from it is never pruned) and, while one stands, every RAND link
    # starts lazy; the contact's copies reach its joiners in one hop, and their own links
    # are the lazy repair paths. Off: Plumtree kept whichever copy came first, and at 32
    # readers the contact fed 9 of them, the rest 2-4 hops down.
    hub_parent: bool = False
    # After an empty GRAFT (eager repair, optimisation) the grafter is not pruned for the
    # duplicates already in flight: one IHAVE round plus a slow round trip.
    graft_grace: float = 0.5  # guess: ihave_interval + 2 * 200 ms
    cache_ttl: float = 120.0  # guess: payloads kept for GRAFT and PULL answers
    cache_max_messages: int = 100_000  # guess: bounds memory with cache_max_bytes
    # No more than retention's default (episub/retention.py): on a node the cache shares
    # retention's bytes objects, and a cache larger than retention would keep payloads
    # retention has let go. Older messages are served from retention (PULL).
    cache_max_bytes: int = 64 * 1024 * 1024
    seen_ttl: float = 600.0  # guess: must exceed the longest time a copy can wander
    seen_max: int = 1_000_000  # guess
    max_missing: int = 10_000  # guess: ids we track as announced but not received
    max_announcers: int = 8  # guess: whom we may GRAFT from, per missing id
    max_ihave_ids: int = 1024  # guess: ids per IHAVE frame
    max_graft_ids: int = 256  # guess: ids per GRAFT
    gap_timeout: float = 1.0  # guess: let the tree and IHAVE repair a gap before pulling
    # A stream with nothing newer for this long has its head (last seq) named once to each
    # neighbour in a HEADS (heads.py): a lost last message shows no gap otherwise.
    heads_quiet: float = 1.0  # = gap_timeout: IHAVE and GRAFT have had their turn
    gap_retry_interval: float = 0.5  # guess
    gap_max_attempts: int = 6  # guess: then the gap is reported as DataLost
    max_gap: int = 4096  # = messages.MAX_PULL_SPAN; a bigger jump is resynchronised
    max_held_per_publisher: int = 4096  # out-of-order messages held for in-order delivery
    # A new subscriber's first copy of a publisher may overtake an earlier message still on
    # its way (by about an IHAVE + GRAFT round); the stream's start is fixed after this.
    stream_settle: float = 0.5  # guess: ihave_interval + 2 * missing_check_interval; 0: off
    max_publishers: int = 100_000  # guess: per-publisher state entries per topic
    # Publisher streams of a topic with a delivery tree of their own (trees.py); the least
    # recently seen give theirs up past it and start again from the links' sets when next
    # seen. ~1.2 KB a tree (docs/protocol.md). 0: one tree for every stream (Plumtree's).
    max_stream_trees: int = 1024  # guess: a Spark job's sink partitions and executors, with room
    # A NEAR link starts eager (races the parent's copies, so trees move onto fast links)
    # in the trees of at most this many streams, those seen most lately; lazy in the
    # others that have a parent. Every race costs a duplicate or two: racing in all 32
    # trees gave RMR 0.22, in none p99 1.4x (docs/protocol.md, "Delivery trees").
    near_race_trees: int = 8  # measured: 8 publishers at one publisher's p99
    max_fetches: int = 1024  # guess: publishers whose history one topic fetches at once
    max_message_size: int = 1024 * 1024  # issue: 1 MiB default, configurable

    def __post_init__(self) -> None:
        for name in (
            "ihave_interval",
            "graft_timeout",
            "missing_check_interval",
            "cache_ttl",
            "seen_ttl",
            "gap_timeout",
            "gap_retry_interval",
            "heads_quiet",
        ):
            _positive(name, getattr(self, name))
        if not 0.0 <= self.ihave_spread < 2.0:
            raise ValueError(f"ihave_spread must be in [0, 2), not {self.ihave_spread!r}")
        if self.stream_settle < 0:
            raise ValueError(
                f"stream_settle must be >= 0 (0: no settling), not {self.stream_settle}"
            )
        if not 1 <= self.max_ihave_ids <= m.MAX_IDS_PER_MESSAGE:
            raise ValueError(f"max_ihave_ids must be in 1..{m.MAX_IDS_PER_MESSAGE}")
        if not 1 <= self.max_graft_ids <= m.MAX_IDS_PER_MESSAGE:
            raise ValueError(f"max_graft_ids must be in 1..{m.MAX_IDS_PER_MESSAGE}")
        if not 1 <= self.max_gap <= m.MAX_PULL_SPAN:
            raise ValueError(f"max_gap must be in 1..{m.MAX_PULL_SPAN}")
        if self.max_held_per_publisher < 2:
            # A stream resynchronises beyond pulling reach only when two messages there
            # show it goes on (ordering.py): one slot could never show that.
            raise ValueError(
                f"max_held_per_publisher must be >= 2, not {self.max_held_per_publisher}"
            )
        if self.max_message_size < 1:
            raise ValueError(f"max_message_size must be >= 1, not {self.max_message_size}")
        if self.near_race_trees < 0:
            raise ValueError(f"near_race_trees must be >= 0, not {self.near_race_trees}")
        if self.max_stream_trees < 0:
            raise ValueError(
                f"max_stream_trees must be >= 0 (0: one tree), not {self.max_stream_trees}"
            )
        if self.eager_repair_grafts < 1:
            raise ValueError(
                f"eager_repair_grafts must be >= 1 (eager_repair=False: none), "
                f"not {self.eager_repair_grafts}"
            )
        if not (self.near_parent_factor == 0 or self.near_parent_factor >= 1):
            raise ValueError(
                f"near_parent_factor must be 0 (off) or >= 1, not {self.near_parent_factor}"
            )


_Part = TypeVar("_Part", "MembershipConfig", "BroadcastConfig")

# Live configuration's topics (episub.config): `_episub.config.<name>`.
CONFIG_TOPIC_PREFIX = "_episub.config."
# A configuration topic carries a few small writes that every node gets eagerly, each on a
# one-message stream of its own (episub/config/replica.py), so its IHAVEs only ever repair
# a loss. At 0.1 s they were a third of what a config benchmark node received and sent at
# 50 writes/s (one frame per lazy neighbour per flush, each range a stream of its own); at
# 0.5 s, every reader fed by the one writer at the same moment flushed at the same moment,
# and each ~20th write met ~150 IHAVE frames at once on a 2-core host (10-20 ms late: the
# benchmark's p99). Now each node flushes at a period of its own, 0.5-1.5 s: a lost write
# is grafted within ~2 s (its announcer's flush, then graft_timeout), and a reader reads
# ~0.1 IHAVE frames per write at 50 writes/s (0.26 at 0.5 s).
CONFIG_TOPIC_BROADCAST: tuple[tuple[str, Any], ...] = (
    ("ihave_interval", 1.0),  # guess: repair within ~2 s is live enough for configuration
    ("ihave_spread", 1.0),  # every node its own period, 0.5-1.5 s: the flushes spread
    ("graft_grace", 1.4),  # ihave_interval + 2 * 200 ms, as the default's
    # An announcer got its copy from the hub when we did ours (hub_parent), so an IHAVE of
    # a place we lack names a loss, not a copy on its way: grafted after half a period.
    ("graft_timeout", 0.5),
    ("hub_parent", True),  # the star of CONFIG_TOPIC_MEMBERSHIP's hub links
    # Each write is a stream of its own, so each is a head: at 4 s a link carries at most
    # one HEADS frame every 2 s (heads.py), after IHAVE repair (~2 s) had its turn.
    ("heads_quiet", 4.0),  # guess
)


# ... and its overlay keeps its links where they are: no near links, so no optimisation
# rounds swapping links on RTT noise. Every link that comes up costs a catch-up (GETHELD /
# HELD listing the topic's streams: one per write) and every link that goes re-grafts the
# Plumtree tree under it; at 32 readers a reader saw ~4 swaps and ~8 connections a second
# while writes flowed, and the writes in flight while a subtree lost its parent reached it
# by IHAVE + GRAFT, 0.2-0.8 s late (the benchmark's p99). A configuration's few small writes
# gain nothing from near links; its links are random ones (plain HyParView).
# Its contact (the writer, the Spark driver) holds a hub link to every node that joins
# through it (up to 64) and pushes each write over them: every reader one hop from it. A
# random tree was 3-4 hops deep, and each hop waited for its process to be scheduled on a
# busy host (a relay costs up to 40% more CPU than a leaf). The readers' own links (3: the
# lazy repair paths, and the overlay when the contact is gone) announce, they do not push.
# Without proximity no RTT is wanted, but passive peers never get one (the runtime reads
# RTTs of connections only), so probing stayed at its unmeasured pace: 4 PINGs every 2 s on
# the shared 2 s tick, every reader at once (a write met them every 2 s, 10-15 ms late).
CONFIG_TOPIC_MEMBERSHIP: tuple[tuple[str, Any], ...] = (
    ("proximity", False),
    ("hub_links", 64),  # guess: "a small config group"; larger groups relay through readers
    ("c_near", 0),
    ("c_rand", 3),  # guess: A = 3 own links, with a hub link beside them
    ("passive_probe_interval", 12.0),  # a settled node's pace (settled_upkeep 6 x 2 s)
    ("passive_probe_interval_unmeasured", 12.0),
    ("passive_probes_per_tick_unmeasured", 1),
    # A node cut off from the rest (its host's link down past TCP's user timeout) is
    # isolated on this topic and asks its contact and the peers it remembers again and
    # again: at the default's 60 s it came back up to a minute after the link did, its
    # values stale all that while. Guess: a few contacts asked every 4 s cost little, and
    # the replica holds the writes it missed a few seconds after the link's return.
    ("recovery_max_retry", 4.0),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeConfig:
    membership: MembershipConfig = field(default_factory=MembershipConfig)
    broadcast: BroadcastConfig = field(default_factory=BroadcastConfig)
    # Per topic-name prefix, `broadcast` fields a topic of that prefix changes (the first
    # prefix that matches); other topics use `broadcast` as it is.
    topic_broadcast: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = (
        (CONFIG_TOPIC_PREFIX, CONFIG_TOPIC_BROADCAST),
    )
    # ... and `membership` fields, the same way.
    topic_membership: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = (
        (CONFIG_TOPIC_PREFIX, CONFIG_TOPIC_MEMBERSHIP),
    )
    max_topics: int = 1024  # guess: per node
    id_key: bytes | None = None  # deployment key: message ids use keyed blake3 when set

    def __post_init__(self) -> None:
        if self.id_key is not None and len(self.id_key) != 32:
            raise ValueError(f"id_key must be 32 bytes (blake3 keyed mode), not {len(self.id_key)}")
        if not 1 <= self.max_topics <= m.MAX_TOPICS_PER_MESSAGE:
            raise ValueError(f"max_topics must be in 1..{m.MAX_TOPICS_PER_MESSAGE}")
        for _, changes in self.topic_broadcast:
            replace(self.broadcast, **dict(changes))  # a bad field or value raises here
        for _, changes in self.topic_membership:
            replace(self.membership, **dict(changes))

    def for_topic(self, topic: str) -> NodeConfig:
        """The config `topic` runs with: `broadcast` and `membership` with the changes of
        the first `topic_broadcast` and `topic_membership` prefix `topic` starts with."""
        broadcast = _changed(self.broadcast, self.topic_broadcast, topic)
        membership = _changed(self.membership, self.topic_membership, topic)
        if broadcast is self.broadcast and membership is self.membership:
            return self
        return replace(
            self,
            broadcast=broadcast,
            membership=membership,
            topic_broadcast=(),
            topic_membership=(),
        )


def _changed(
    part: _Part, by_prefix: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...], topic: str
) -> _Part:
    """`part` with the changes of the first prefix of `by_prefix` that `topic` starts with."""
    for prefix, changes in by_prefix:
        if topic.startswith(prefix):
            return replace(part, **dict(changes))
    return part
