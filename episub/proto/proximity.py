"""GoCast proximity for one topic's active view: which links are NEAR, and which peers are
near enough to change links for.

Membership (membership.py) keeps the active view and the links (passive.py the peers
outside it), and asks this machine when a choice depends on round-trip times; it owns no
view. It compares RTTs, picks the near link to give up or to make, and relabels standing
links (RAND <-> NEAR) through NEIGHBOR requests over them; membership requests, accepts
and drops the links it names.

Rules this machine keeps:
- A NEAR link is its requester's choice: it counts against the C_near of the node that
  asked for it (`Link.chosen`), not of the node that accepted it, which holds it for the
  peer beside its own A links (at most max_active - A of them) and never replaces it.
  Our near count, our farthest near neighbour and every swap below are about our own.
- A peer is nearer than another, enough to change links for (a swap, an adoption), when
  its RTT is smaller by the factor alpha and by more than the two RTTs' variation.
  With several publisher streams in the topic (and `swap_factor_growth` > 1, as by
  default), each swap we ask for multiplies the factor our next swap needs by it, up to
  `swap_factor_max`: a node's first swaps converge at alpha, later ones need a clearly
  nearer peer.
  Relabelling a standing link drops no link and keeps alpha only. An unknown RTT counts
  as the farthest.
- A demotion to RAND takes effect when we ask for it; a promotion to NEAR when the peer
  agrees (its ACCEPT carries the kind it settled on). A promotion that leaves more than
  C_near near links demotes the farthest one.

Rules from GoCast and the Episub draft:
- NEIGHBOR request for a NEAR link, beyond the draft's degree rules: accepted while there
  is room (membership.py); the draft's "closer than our farthest near neighbour" rule let
  a full peer block a node's choice, and near links converged slowly (docs/simulation.md).
- optimisation: adopt a near link held for a peer when it is nearer than our farthest own
  by alpha or fills a missing slot (our farthest own is then demoted); replace the
  farthest near neighbour by a known peer closer by alpha. When no
  known peer could do better (every candidate measured, none closer than our nearest random
  neighbour), relabel instead: ask that random neighbour to make the link NEAR, and once it
  agrees demote our farthest near neighbour to RAND. Without this a zone-mate first linked
  as RAND (joins make random links) stays RAND, and a small zone whose every member is
  already a neighbour keeps a far near link for good.
  A node left with more than C_near near links and fewer than C_rand random ones demotes
  its farthest near link, on the same condition.
- relabel request (NEIGHBOR over a standing link): always agreed to. RAND drops no link;
  NEAR is the peer's choice, held for it like an accepted NEAR request (ours too if we
  asked the same at once).
"""

from __future__ import annotations

from episub.proto import messages as m
from episub.proto.config import MembershipConfig
from episub.proto.events import OutEvent, Send
from episub.proto.messages import LinkKind, NeighborOp, PeerId
from episub.proto.peers import RttTable
from episub.proto.tables import Link, MembershipCounters


class Proximity:
    """Membership's RTT judgements. It shares membership's `active` and `refused_by`
    tables (read here, changed there, except a link's kind) and counts into its counters."""

    def __init__(
        self,
        *,
        topic: str,
        config: MembershipConfig,
        rtts: RttTable,
        active: dict[PeerId, Link],
        refused_by: dict[PeerId, float],
        counters: MembershipCounters,
    ) -> None:
        self.topic = topic
        self.config = config
        self.rtts = rtts
        self.active = active
        self.refused_by = refused_by
        self.counters = counters
        self.swaps_asked = 0  # swaps optimisation asked for; dearer each (swap_factor_growth)
        # Publisher streams with a tree of their own in the topic (topic.py sets it): a
        # swap touches each of them.
        self.stream_trees = 0

    # -- queries ------------------------------------------------------------------------

    def _rand_count(self) -> int:
        return sum(1 for link in self.active.values() if link.kind is LinkKind.RAND)

    def _near_count(self) -> int:
        """Our own near links: those we chose (a peer's choice does not count)."""
        return sum(1 for link in self.active.values() if link.kind is LinkKind.NEAR and link.chosen)

    def nearer(
        self,
        peer: PeerId,
        rtt: float,
        far_peer: PeerId,
        far_rtt: float,
        factor: float | None = None,
    ) -> bool:
        """Is `peer` at `rtt` nearer than `far_peer` at `far_rtt`, enough to change links
        for (a swap, an eviction)? By the factor alpha (GoCast), and by more than the two
        RTTs' variation (RTTVAR): a difference inside it is noise, not distance. Between
        processes of one busy host RTTs of 0.7-3 ms wandered by ms, and swaps on that
        noise went on for good (the config benchmark at 32 nodes: 10-13 swaps and ~20
        evictions in 4 s, each one a burst of duplicates and PRUNEs in the tree). With
        steady samples (the simulator) the variation is 0 and this is GoCast's rule.
        Relabelling a standing link (RAND <-> NEAR) drops no link and keeps alpha only.
        `factor`: the one to use instead of alpha (`swap_factor`)."""
        if not rtt * (self.config.alpha if factor is None else factor) < far_rtt:
            return False
        noise = self.rtts.variation(peer) + self.rtts.variation(far_peer)
        return far_rtt - rtt > noise

    def swap_factor(self) -> float:
        """How many times nearer a peer must be to replace our farthest near neighbour:
        alpha, times `swap_factor_growth` for each swap asked already, at most
        `swap_factor_max` (and never below alpha), where the topic has several publisher
        streams. Each swap brings a link up and another down, and every link change
        touches every stream's tree; late swaps gain a few ms of RTT each. With one
        stream, alpha: there the swaps cost little, and damping them cost one
        publisher's p99 (docs/simulation.md)."""
        c = self.config
        if self.stream_trees <= 1:
            return c.alpha
        grown = c.alpha * c.swap_factor_growth**self.swaps_asked
        return max(c.alpha, min(grown, c.swap_factor_max))

    def rtt_or_inf(self, peer: PeerId) -> float:
        """Our RTT to `peer`; an unmeasured peer sorts as the farthest."""
        rtt = self.rtts.get(peer)
        return float("inf") if rtt is None else rtt

    def farthest_near(self) -> tuple[PeerId, float] | None:
        """Our chosen near neighbour with the largest RTT (unknown RTT counts as farthest)."""
        worst: tuple[PeerId, float] | None = None
        for peer, link in self.active.items():
            if link.kind is not LinkKind.NEAR or not link.chosen:
                continue
            rtt = self.rtts.get(peer)
            rtt = float("inf") if rtt is None else rtt
            if worst is None or rtt > worst[1]:
                worst = (peer, rtt)
        return worst

    def surplus_rand_link(self) -> PeerId | None:
        """A random link we hold beyond C_rand whose peer can spare it, or None."""
        c = self.config
        if self._rand_count() <= c.c_rand:
            return None
        spare = [
            (link.peer_active, -link.since, p)
            for p, link in self.active.items()
            if link.kind is LinkKind.RAND
            and (link.peer_rand > c.c_rand or link.peer_active > self.config.active_size)
        ]
        return max(spare, key=lambda item: (item[0], item[1]))[2] if spare else None

    # -- optimisation and relabelling ---------------------------------------------------

    def optimize(
        self, known: list[tuple[float | None, PeerId]], now: float, out: list[OutEvent]
    ) -> tuple[PeerId, PeerId | None] | None:
        """GoCast: fill the near slots with the nearest measured peers, then swap the
        farthest near neighbour for a measured peer closer by alpha. `known`: (RTT or None,
        peer) of the peers we could link to. Relabels a standing link itself; returns the
        peer to ask for a NEAR link and the neighbour it displaces, or None."""
        c = self.config
        candidates = [(rtt, p) for rtt, p in known if rtt is not None]
        if (
            self._demote_surplus_near(known, now, out)
            or self.adopt_held_near(known, now, out)
            or self._relabel_nearest_rand(known, now, out)
        ):
            return None
        if not candidates:
            return None
        best_rtt, best = min(candidates, key=lambda item: item[0])
        if self._near_count() < c.c_near:
            # Short of near links while full: the new one displaces a surplus random link.
            return best, self.surplus_rand_link()
        farthest = self.farthest_near()
        if farthest is not None and self.nearer(best, best_rtt, *farthest, self.swap_factor()):
            self.swaps_asked += 1
            return best, farthest[0]
        return None

    def adopt_held_near(
        self, known: list[tuple[float | None, PeerId]], now: float, out: list[OutEvent]
    ) -> bool:
        """Take the nearest near link a peer chose (we hold it for that peer) as one of
        ours too, when it fills a missing near slot or beats our farthest near link by
        alpha, and no known peer (`known`, as in `optimize`) is unmeasured or nearer; a
        near link of ours left over is demoted. No message: the link is NEAR at both ends
        already. Without this, a zone-mate that chose us first stayed out of our own
        choice (it is active, so no candidate), and a small zone whose members all hold
        each other kept a far near link. Only when nothing known could do better: a link
        both ends count is one link fewer in the overlay, and adopting whenever nearer
        lowered the 2-D gain (2.30x to 2.09x on seed 2, docs/simulation.md). True if
        adopted."""
        get_rtt = self.rtts.get
        held = [
            (rtt, p)
            for p, link in self.active.items()
            if link.kind is LinkKind.NEAR and not link.chosen and (rtt := get_rtt(p)) is not None
        ]
        if not held:
            return False
        rtt, peer = min(held, key=lambda item: item[0])
        if any(known_rtt is None or known_rtt < rtt for known_rtt, _ in known):
            return False
        if self._near_count() >= self.config.c_near:
            farthest = self.farthest_near()
            if farthest is None or not self.nearer(peer, rtt, *farthest):
                return False
        self.active[peer].chosen = True
        self.counters.near_adopted += 1
        if self._near_count() > self.config.c_near:
            farthest = self.farthest_near()
            if farthest is not None and farthest[0] != peer:
                self._ask_relabel(farthest[0], LinkKind.RAND, now, out)
        return True

    def _demote_surplus_near(
        self, known: list[tuple[float | None, PeerId]], now: float, out: list[OutEvent]
    ) -> bool:
        """Holding more than C_near near links and fewer than C_rand random ones (accepted
        NEAR requests and relabels at the other end get there), demote the farthest near
        link to RAND, when no known peer could replace it instead. True if demoted."""
        c = self.config
        if self._near_count() <= c.c_near or self._rand_count() >= c.c_rand:
            return False
        farthest = self.farthest_near()
        if farthest is None or any(rtt is None or rtt * c.alpha < farthest[1] for rtt, _ in known):
            return False
        self._ask_relabel(farthest[0], LinkKind.RAND, now, out)
        return True

    def _relabel_nearest_rand(
        self, known: list[tuple[float | None, PeerId]], now: float, out: list[OutEvent]
    ) -> bool:
        """When our nearest random neighbour is the best near neighbour we know of (every
        candidate measured and none closer), ask it to make the link NEAR, if that fills
        a missing near slot or beats our farthest near neighbour by alpha. True if asked.

        Only when nothing known could do better: relabelling keeps the far link, as RAND,
        where replacing it by a candidate drops it. On the zones model that cut the
        cross-zone gain from 4.5x to 3.7x when relabelling came first (docs/simulation.md).
        """
        c = self.config
        get_rtt = self.rtts.get
        rands = [
            (rtt, p)
            for p, link in self.active.items()
            if link.kind is LinkKind.RAND
            and p not in self.refused_by
            and (rtt := get_rtt(p)) is not None
        ]
        if not rands:
            return False
        rand_rtt, rand = min(rands, key=lambda item: item[0])
        if any(rtt is None or rtt < rand_rtt for rtt, _ in known):
            return False
        if self._near_count() < c.c_near:
            if self._rand_count() <= c.c_rand:
                return False
        else:
            farthest = self.farthest_near()
            if farthest is None or rand_rtt * c.alpha >= farthest[1]:
                return False
        self._ask_relabel(rand, LinkKind.NEAR, now, out)
        return True

    def judge_relabel(
        self, peer: PeerId, link: Link, req: m.Neighbor, now: float, out: list[OutEvent]
    ) -> None:
        """The peer asks to turn our standing link into `req.kind`; agree by setting it."""
        # A demotion, always agreed to (a node short of near links finds new ones by
        # optimisation), or a promotion: the peer's choice, which costs none of our near
        # slots, so agreed to as well; ours too if we asked the same at once.
        self.relabel(peer, link, req.kind, now, out, chosen=link.relabel is req.kind)

    def relabel(
        self,
        peer: PeerId,
        link: Link,
        kind: LinkKind,
        now: float,
        out: list[OutEvent],
        *,
        chosen: bool,
    ) -> None:
        """Set the link's kind, a NEAR one `chosen` by us or not; a surplus near link left by
        a promotion of ours is demoted."""
        link.relabel = None
        link.chosen = chosen and kind is LinkKind.NEAR
        if link.kind is kind:
            return
        link.kind = kind
        self.counters.relabels += 1
        if link.chosen and self._near_count() > self.config.c_near:
            farthest = self.farthest_near()
            if farthest is not None and farthest[0] != peer:
                self._ask_relabel(farthest[0], LinkKind.RAND, now, out)

    def _ask_relabel(self, peer: PeerId, kind: LinkKind, now: float, out: list[OutEvent]) -> None:
        """Ask `peer` to relabel our link; a demotion to RAND takes effect at once."""
        link = self.active[peer]
        if kind is LinkKind.RAND:
            link.kind, link.chosen = kind, False
            self.counters.relabels += 1
        link.relabel, link.relabel_at = kind, now
        request = m.Neighbor(
            op=NeighborOp.REQUEST,
            kind=kind,
            rtt=self.rtts.get(peer),
            active_count=len(self.active),
            rand_count=self._rand_count(),
        )
        out.append(Send(peer, self.topic, request))
