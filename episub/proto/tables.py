"""What the parts of one topic's core share, in a leaf module: the parts import it, and so
never each other (iroh-gossip's proto/topic.rs composes hyparview.rs and plumtree.rs the
same way). Membership's parts (membership.py, passive.py, proximity.py) share the active
view's links and count into one `MembershipCounters`; broadcast's parts (broadcast.py,
ordering.py) count into one `BroadcastCounters`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from episub.proto.messages import LinkKind, PeerId

__all__ = ["BroadcastCounters", "Link", "MembershipCounters", "OwnStream"]


@dataclass(slots=True)
class OwnStream:
    """This node's own stream of one topic: the seq its next publish takes. NodeState keeps
    it across a leave and a join again and hands it to the topic's broadcast, so that a
    (publisher, seq) never names two messages."""

    next_seq: int = 0


@dataclass(slots=True)
class Link:
    """One active link and what we last heard of the peer's own view."""

    kind: LinkKind
    since: float
    peer_active: int = 0
    peer_rand: int = 0
    peer_view: tuple[PeerId, ...] = ()
    relabel: LinkKind | None = None  # the kind we asked the peer to give this link
    relabel_at: float = 0.0
    serial: int = 0  # tells this link from an earlier one to the same peer
    # A NEAR link we asked for: one of our own C_near. A NEAR link a peer asked us for is
    # its choice and does not count against ours (proximity.py).
    chosen: bool = False
    # A link between a contact and a node that joined through it (MembershipConfig
    # hub_links): held beside A at both ends, never dropped by stabilisation.
    hub: bool = False
    pinged_at: float = float("-inf")  # when the peer last pinged us over this link


@dataclass(slots=True)
class MembershipCounters:
    joins_accepted: int = 0
    joins_forwarded: int = 0
    neighbor_accepted: int = 0
    neighbor_refused: int = 0
    evictions: int = 0
    stabilize_drops: int = 0
    optimize_swaps: int = 0
    shuffles: int = 0
    passive_expired: int = 0
    revived: int = 0
    relabels: int = 0
    near_adopted: int = 0  # near links a peer chose that we took as ours too
    one_sided_dropped: int = 0
    recoveries: int = 0  # attempts to get back in with no neighbour and no passive peer
    late_pongs: int = 0  # PONGs to PINGs we had given up on (expired, or the link lost)
    late_shuffle_replies: int = 0  # SHUFFLEREPLYs to SHUFFLEs a newer one had replaced
    extra: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class BroadcastCounters:
    published: int = 0
    gossip_received: int = 0
    duplicates_received: int = 0
    delivered: int = 0
    prunes_sent: int = 0
    grafts_sent: int = 0
    graft_ids_sent: int = 0
    ihave_ids_sent: int = 0
    pulls_sent: int = 0
    bad_ids: int = 0
    bad_signatures: int = 0  # signing on: unsigned, unbound or forged first copies dropped
    data_lost: int = 0
    optimizations: int = 0
    near_parent_swaps: int = 0  # a far eager parent swapped for a near lazy announcer
    lazy_races: int = 0  # lazy announcers of a shorter path grafted to race our parent
    recovered: int = 0  # messages pulled from behind a stream's position (history)
    republished: int = 0  # publishes at a named stream place that was taken already
    streams_evicted: int = 0  # idle publisher streams forgotten to make room (max_publishers)
    rivals_won: int = 0  # first copies that took a place from another message (sooner stamp)
    rivals_refused: int = 0  # first copies for a place whose held message stays
    crossed_prunes: int = 0  # PRUNEs that crossed our GRAFT, answered by GRAFT again
    regrafts: int = 0  # empty GRAFTs sent because a PRUNE took our last eager link
    # Streams first seen after our join that pulled back for what came before (ordering.py),
    # the messages from after the join that this found, and reaches that stopped short:
    # unanswered or out of reach (max_gap).
    reach_backs: int = 0
    reached_back: int = 0
    reach_backs_cut: int = 0
    held_dropped: int = 0  # messages beyond a gap dropped unheld, held full (ordering.py)
    answer_batches: int = 0  # batches of PULL and GRAFT answers served (answers.py)
    answer_ranges_merged: int = 0  # asked again while waiting: nothing added
    answer_ranges_refused: int = 0  # past a peer's waiting bounds: not answered
    answer_askers_evicted: int = 0  # peers whose waiting answers made room for another's
