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
from episub.proto.reserved import CONFIG_TOPIC_PREFIX


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
    shuffle_interval: float = 30.0  # tuned: iroh's 60 s left a 95% crash's survivors isolated
    stabilize_interval: float = 2.0  # tuned: GoCast maintains every second or so; 4 s cost p99
    stabilize_interval_unsettled: float = 2.0  # guess: the same while the view is off its size
    optimize_interval: float = 5.0  # guess: slower than stabilisation so swaps settle
    optimize_interval_improving: float = 1.0  # tuned: while near links still improve
    ping_interval: float = 10.0  # guess: pings are most control traffic, so sparse
    passive_probe_interval: float = 2.0  # guess: the 42 passive peers measured in ~90 s
    passive_probe_interval_unmeasured: float = 2.0  # guess: while a candidate has no RTT
    passive_probes_per_tick: int = 1  # guess
    passive_probes_per_tick_unmeasured: int = 4  # tuned: one a tick missed near candidates
    ping_timeout: float = 5.0  # guess: far above any RTT we serve
    neighbor_request_timeout: float = 2.0  # guess: iroh waits 500 ms; we allow slow links
    join_retry_interval: float = 3.0  # guess
    recovery_retry: float = 1.0  # guess: an isolated node asks again after a few round trips
    recovery_max_retry: float = 60.0  # guess: an isolated node costs its contacts little
    recovery_fanout: int = 16  # guess: remembered peers (from the RTT table) asked per attempt
    timer_jitter: float = 0.25  # guess: +-25% so periodic work does not synchronise
    alpha: float = 1.5  # tuned: 2.0 converged slower (docs/simulation.md, proximity runs)
    swap_factor_growth: float = 1.3  # tuned: 8-32 senders at one's LDH, p99 (docs/simulation.md)
    swap_factor_max: float = 4.0  # guess: a peer 4x nearer is always worth a swap (zones)
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
    hub_links: int = 0  # off; a contact's links to its joiners beside A (docs/protocol.md)
    settled_upkeep: float | None = None  # None: 1 here, the runtime's own (docs/protocol.md)
    pong_rtt: bool | None = None  # None: yes here, the runtime's own (docs/protocol.md)

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
        if not self.swap_factor_growth >= 1.0:
            raise ValueError(
                f"swap_factor_growth must be >= 1 (1: off), not {self.swap_factor_growth!r}"
            )
        if not self.swap_factor_max >= self.alpha:
            raise ValueError(
                f"swap_factor_max must be >= alpha ({self.alpha}), not {self.swap_factor_max!r}"
            )
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
    ihave_spread: float = 0.0  # off: each node flushes on a period of its own when > 0
    graft_timeout: float = 0.1  # = ihave_interval: an IHAVE trails its copy by one flush
    missing_check_interval: float = 0.2  # guess: an answer's round trip, with room
    missing_give_up_ticks: int = 25  # guess: ~5 s of grafting before giving an id up
    optimization_threshold: int = 15  # tuned: iroh's 7 made several senders' trees flutter
    race_lazy_hops: int = 0  # off: 1 races a lazy announcer one hop shorter (docs/simulation.md)
    race_backoff: float = 5.0  # tuned: 30 s lost four fifths of the race's p99 gain (8 senders)
    near_parent_factor: float = 0.0  # off: for deployments whose far links cost much more
    eager_repair: bool = True  # draft: "for applications that value latency minimization"
    eager_repair_grafts: int = 2  # tuned: in the latest stream's tree; the others graft one
    lazy_start: bool = True  # tuned: upkeep's new links carried a redundant copy of each
    hub_parent: bool = False  # off: hub links' topics turn it on (CONFIG_TOPIC_BROADCAST)
    graft_grace: float = 0.5  # guess: ihave_interval + 2 * 200 ms
    max_missing: int = 10_000  # guess: ids we track as announced but not received
    max_announcers: int = 8  # guess: whom we may GRAFT from, per missing id
    max_ihave_ids: int = 1024  # guess: ids per IHAVE frame
    max_graft_ids: int = 256  # guess: ids per GRAFT
    gap_timeout: float = 1.0  # guess: let the tree and IHAVE repair a gap before pulling
    heads_quiet: float = 1.0  # = gap_timeout: IHAVE and GRAFT have had their turn
    gap_retry_interval: float = 0.5  # guess
    gap_max_attempts: int = 6  # guess: then the gap is reported as DataLost
    max_gap: int = 4096  # = messages.MAX_PULL_SPAN; a bigger jump is resynchronised
    max_held_per_publisher: int = 4096  # out-of-order messages held for in-order delivery
    stream_settle: float = 0.5  # guess: ihave_interval + 2 * missing_check_interval; 0: off
    max_publishers: int = 100_000  # guess: per-publisher state entries per topic
    max_stream_trees: int = 1024  # guess: a Spark job's sink partitions and executors, with room
    near_race_trees: int = 6  # tuned: 8 and 32 publishers, one end racing (docs/protocol.md)
    max_fetches: int = 1024  # guess: publishers whose history one topic fetches at once
    max_message_size: int = 1024 * 1024  # guess: Kafka's message.max.bytes is about 1 MB
    answer_batch_messages: int = 256  # a GRAFT's worth (max_graft_ids), like gossipsub's IWANT cap
    answer_batch_bytes: int = 64 * 1024  # guess: a 20-byte PULL never queues megabytes at once
    answer_interval: float | None = 0.1  # next batch where no drain is reported (sim)

    def __post_init__(self) -> None:
        for name in (
            "ihave_interval",
            "graft_timeout",
            "missing_check_interval",
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
        if self.answer_batch_messages < 1 or self.answer_batch_bytes < 1:
            raise ValueError(
                "answer_batch_messages and answer_batch_bytes must be >= 1, not "
                f"{self.answer_batch_messages} and {self.answer_batch_bytes}"
            )
        if self.answer_interval is not None:
            _positive("answer_interval", self.answer_interval)
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
        if self.race_lazy_hops < 0:
            raise ValueError(f"race_lazy_hops must be >= 0 (0: off), not {self.race_lazy_hops}")
        _positive("race_backoff", self.race_backoff)
        if not (self.near_parent_factor == 0 or self.near_parent_factor >= 1):
            raise ValueError(
                f"near_parent_factor must be 0 (off) or >= 1, not {self.near_parent_factor}"
            )


_Part = TypeVar("_Part", "MembershipConfig", "BroadcastConfig")

# A configuration topic: a few small writes every node gets eagerly from one writer, each
# on a stream of its own, so its IHAVEs only repair a loss (docs/protocol.md).
CONFIG_TOPIC_BROADCAST: tuple[tuple[str, Any], ...] = (
    ("ihave_interval", 1.0),  # tuned: repair within ~2 s is live enough for configuration
    ("ihave_spread", 1.0),  # tuned: every node its own period, 0.5-1.5 s, so flushes spread
    ("graft_grace", 1.4),  # ihave_interval + 2 * 200 ms, as the default's
    ("graft_timeout", 0.5),  # an IHAVE names a loss (all copies come from the hub): half a period
    ("hub_parent", True),  # the star of CONFIG_TOPIC_MEMBERSHIP's hub links
    ("heads_quiet", 4.0),  # guess: after IHAVE repair (~2 s) had its turn
    ("max_stream_trees", 0),  # a write is a stream of one message: one tree serves them all
)

# ... and its overlay: random links that stay put, the writer one hop from every reader.
CONFIG_TOPIC_MEMBERSHIP: tuple[tuple[str, Any], ...] = (
    ("proximity", False),  # tuned: near-link swaps cost catch-ups and late writes
    ("hub_links", 64),  # guess: "a small config group"; larger groups relay through readers
    ("c_near", 0),
    ("c_rand", 3),  # guess: A = 3 own links, with a hub link beside them
    ("passive_probe_interval", 12.0),  # a settled node's pace (settled_upkeep 6 x 2 s)
    ("passive_probe_interval_unmeasured", 12.0),  # no RTT is wanted without proximity
    ("passive_probes_per_tick_unmeasured", 1),
    ("recovery_max_retry", 4.0),  # guess: a cut-off replica relinks seconds after its link's return
)


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeConfig:
    membership: MembershipConfig = field(default_factory=MembershipConfig)
    broadcast: BroadcastConfig = field(default_factory=BroadcastConfig)
    # Per topic-name prefix, the `broadcast` fields its topics change (first match wins).
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
