"""HyParView membership with GoCast proximity, for one topic, as the Episub draft has it.

Rules this machine keeps (checked by tests and by the simulator):
- `active` and `passive` are disjoint and never contain ourselves; `active` never holds
  more than `max_active` (= 2A). passive.py keeps the passive view, the dormant peers and
  the PINGs in flight; its rules are at the top of that module.
- A peer enters `active` only once it has answered: we asked and it sent NEIGHBOR(ACCEPT),
  or it asked and we accepted. Every entry and exit is reported as NeighborUp/NeighborDown,
  and a link we drop is announced to the peer with DISCONNECT, so that after quiescence
  active views are symmetric. Should one of those messages be lost, the PONG answering a
  ping over the link says the peer does not hold us (`not_neighbor`) and we end it too.
- Each active link is RAND or NEAR (GoCast); both ends agree on the kind, because the
  acceptor decides it and the requester adopts it from the ACCEPT. That holds when a link
  changes kind too: a NEIGHBOR request over a standing link asks to relabel it, and the
  ACCEPT answering it carries the kind the peer settled on.
- A departed peer (LEAVE) is kept out of both views for `left_memory` seconds, unless it
  shows it is back: its own NEIGHBOR request, or a JOIN for it. A LEAVE about an active
  neighbour is taken from that neighbour only.

Rules from the draft, in the order a node meets them:
- join: GETNODES to the contacts, then JOIN(ttl) to C_rand of the peers learned; again
  every join_retry_interval until a JOIN of ours is taken in (a high-priority NEIGHBOR
  request reaches us), even with links made by nodes that joined through us. Each round's
  TTL is one less than the last's, down to 0 (the draft's retries for NATed hosts).
- JOIN: accept (NEIGHBOR request of high priority to the joiner, FORWARDJOIN to one random
  neighbour) when ttl is 0 or our view is below A; otherwise walk on to a random neighbour.
  With no room left (links and requests at 2A) it walks on too. If the joiner cannot be
  reached (the draft's connection check), the JOIN walks on, one hop shorter.
- FORWARDJOIN: add the joiner to the passive view; walk on while ttl > 0.
- NEIGHBOR request: accept while below A; accept a peer with fewer than C_rand links as
  RAND; accept a NEAR request while we hold fewer than max_active - A near links for
  peers (it is the requester's choice and does not count against our A: `link_count`);
  otherwise refuse with DISCONNECT.
- stabilisation: above A, drop links whose other end is oversubscribed too, then links
  closing a triangle (the draft counts the other end's random links: docs/protocol.md
  says why we count all of them); below A, request links from the passive view (random
  ones until C_rand RAND links, then the nearest by RTT).
- optimisation (GoCast), with a full view and no near request or relabel in flight: among
  the peers we know (near candidates and the passive view) and have asked nothing yet,
  proximity.py picks a near
  link to ask for and the one it displaces, or adopts or relabels a standing link
  instead; its rules are at the top of that module. A round that asked for or adopted a
  link schedules the next after optimize_interval_improving, not optimize_interval.
- relabel request (NEIGHBOR over a standing link): proximity.py decides the kind; the
  ACCEPT answering it carries the link's kind, agreed or not.
- SHUFFLE and passive probing: passive.py. A PONG from a dormant peer that is still
  subscribed and neither linked nor asked gets a high-priority NEIGHBOR request at once;
  a PONG saying the peer is no longer subscribed takes it out of every view.
- LEAVE: eager diffusion, forwarded when it removed the peer or its ttl is not spent.
- recovery (ours): a node left with no neighbour, no request in flight and no passive
  peer asks its contacts and every peer it remembers for peers (GETNODES, then JOINs as
  at a fresh join; remembered: dormant peers, near candidates, peers pushed out of the
  passive view or the near candidates, a sample of the RTT table), and says so
  (`Isolated`) for the runtime to dial its bootstrap addresses again; again with
  backoff (recovery_retry doubling to recovery_max_retry) until a neighbour comes.
  With no neighbour, a failed request is followed by the next at once, and a peer that
  probes us becomes a passive peer.
- hub links (ours, `hub_links` > 0: configuration topics, proximity off): a JOIN sent by
  the joiner itself after it asked us for peers (GETNODES: we are its contact) is taken
  in with a NEAR link whatever our view holds, while we hold fewer than hub_links such
  links; the joiner always sends its contact a JOIN and takes the kind its contact asks.
  Both ends hold a hub link beside A (never shed by stabilisation, left out of the view
  sizes we advertise), every other link is RAND; broadcast.py keeps NEAR links eager
  (`hub_parent`), so the contact feeds every joiner in one hop.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import assert_never

from episub.proto import messages as m
from episub.proto.config import MembershipConfig
from episub.proto.events import (
    Isolated,
    NeighborDown,
    NeighborUp,
    OutEvent,
    PeerMisbehaved,
    ScheduleTimer,
    Send,
)
from episub.proto.messages import LinkKind, NeighborOp, PeerId
from episub.proto.passive import PassiveView
from episub.proto.peers import Rng, RttTable, choice, jittered, sample
from episub.proto.proximity import Proximity
from episub.proto.tables import Link, MembershipCounters
from episub.proto.timers import MembershipTimer as Timer

# Periodic timers; each re-arms itself when it fires.
PERIODIC_TIMERS = (Timer.STABILIZE, Timer.OPTIMIZE, Timer.SHUFFLE, Timer.PING, Timer.PROBE)


@dataclass(slots=True)
class PendingRequest:
    kind: LinkKind
    sent_at: float
    replaces: PeerId | None = None  # optimisation: the near neighbour this one displaces
    join_ttl: int | None = None  # it answers a JOIN with this TTL: walked on if undeliverable


_COALESCED_TIMERS = frozenset({Timer.PING, Timer.PROBE})
# Periodic upkeep that MembershipConfig.settled_upkeep stretches once the node is settled
# (shuffles at most 2x: passive views must stay fresh for recovery after a crash).
_SETTLED_TIMERS = frozenset(PERIODIC_TIMERS)
_UPKEEP_TIMERS = frozenset({Timer.STABILIZE, Timer.OPTIMIZE, Timer.SHUFFLE})
# A periodic timer firing this much before its due time is stale (re-armed since): timers
# never fire early (the runtime rounds deadlines up), so this only absorbs float rounding.
_DUE_SLACK = 1e-6


@dataclass(slots=True)
class JoinProgress:
    """Our JOIN since we joined (or were told new contacts, or started recovering)."""

    sent: bool = False  # JOINs are out: GETNODES answers lead to no more of them
    # Someone took us in: accepted our JOIN (or revived us), with a high-priority NEIGHBOR
    # request. Until then join_retry goes on, links or not (see on_timer).
    confirmed: bool = False
    attempts: int = 0  # rounds of JOINs sent: each retry walks one hop shorter


@dataclass(slots=True)
class Recovery:
    """With no neighbour and no passive peer left: the wait before the next attempt to
    get back in (None: not recovering), and how many attempts so far."""

    wait: float | None = None
    attempts: int = 0


@dataclass(slots=True)
class SettledPace:
    """Runtime upkeep (settled_upkeep set): when each periodic timer is due, so that timers
    set at the unsettled pace are re-armed at the settled pace once the node settles (a
    timer firing before its name's due time is stale: it does nothing and sets no next
    one), and whether the node was settled when last looked at."""

    due: dict[Timer, float] = field(default_factory=dict)
    at_settled_pace: set[Timer] = field(default_factory=set)  # armed while settled: not re-armed
    was_settled: bool = False

    def stale(self, timer: Timer, now: float) -> bool:
        due = self.due.get(timer)
        return due is not None and now < due - _DUE_SLACK

    def armed(self, timer: Timer, due: float, *, settled: bool) -> None:
        self.due[timer] = due
        if settled:
            self.at_settled_pace.add(timer)
        else:
            self.at_settled_pace.discard(timer)


class Membership:
    def __init__(
        self,
        *,
        me: PeerId,
        topic: str,
        config: MembershipConfig,
        rng: Rng,
        rtts: RttTable,
        timer_prefix: tuple[Hashable, ...],
    ) -> None:
        self.me = me
        self.topic = topic
        self.config = config
        self.rng = rng
        self.rtts = rtts
        self._timer_prefix = timer_prefix
        self.active: dict[PeerId, Link] = {}
        self.pending: dict[PeerId, PendingRequest] = {}
        self.links_made = 0  # serials of links: a pong is judged by the link it was sent over
        self.left: dict[PeerId, float] = {}  # departed peer -> until when we ignore it
        self.refused_by: dict[PeerId, float] = {}  # peer -> until when we don't re-ask
        self.bootstrap: tuple[PeerId, ...] = ()
        self.joined = False
        self.entry = JoinProgress()
        self.recovery = Recovery()
        # The last optimisation round asked for a link: near links still improve, and the
        # next round comes sooner (optimize_interval_improving).
        self.improving = False
        self._pace = SettledPace()
        # Hub links (config.hub_links): the peers that asked us for peers (GETNODES), most
        # recent last: a JOIN such a peer sends us itself is taken in as a hub link.
        self.joiners: dict[PeerId, None] = {}
        self.counters = MembershipCounters()
        # The peers we know but are not linked to, and the PINGs in flight (passive.py).
        self.passive_view = PassiveView(
            me=me,
            topic=topic,
            config=config,
            rng=rng,
            rtts=rtts,
            active=self.active,
            left=self.left,
            counters=self.counters,
        )
        # GoCast's RTT judgements and relabelling (proximity.py) over our tables.
        self.proximity = Proximity(
            topic=topic,
            config=config,
            rtts=rtts,
            active=self.active,
            refused_by=self.refused_by,
            counters=self.counters,
        )

    # -- queries ------------------------------------------------------------------------

    @property
    def passive(self) -> dict[PeerId, None]:
        """The passive view, an ordered set; read here, changed by passive.py only."""
        return self.passive_view.passive

    @property
    def dormant(self) -> dict[PeerId, tuple[float, float]]:
        """Unreachable peers re-probed with backoff: peer -> (next probe, backoff)."""
        return self.passive_view.dormant

    @property
    def near_candidates(self) -> dict[PeerId, None]:
        return self.passive_view.near_candidates

    @property
    def active_size(self) -> int:
        return self.config.active_size

    def rand_count(self) -> int:
        """Our random links, hub links aside."""
        rand = LinkKind.RAND
        return sum(1 for link in self.active.values() if link.kind is rand and not link.hub)

    def _counts(self, link: Link) -> bool:
        """Does the link count against A? A random link, or a near link we chose; with
        proximity, a near link a peer chose is held beside them (proximity.py); a hub
        link is held beside them too."""
        return not link.hub and (
            link.kind is LinkKind.RAND or link.chosen or not self.config.proximity
        )

    def link_count(self) -> int:
        """Our links that count against A (every link without proximity or hub links)."""
        if not self.config.proximity and not self.config.hub_links:
            return len(self.active)
        return sum(1 for link in self.active.values() if self._counts(link))

    def hub_count(self) -> int:
        """Hub links: to joiners we took in as their contact, or to our contact."""
        if not self.config.hub_links:
            return 0
        return sum(1 for link in self.active.values() if link.hub)

    def own_count(self) -> int:
        """Links bounded by max_active: all but hub links (bounded by hub_links)."""
        return len(self.active) - self.hub_count()

    def held_for_others(self) -> int:
        """Near links peers chose and we hold for them (0 without proximity)."""
        return self.own_count() - self.link_count()

    def _pending_count(self, kind: LinkKind) -> int:
        return sum(1 for p in self.pending.values() if p.kind is kind and p.replaces is None)

    # -- commands -----------------------------------------------------------------------

    def join(self, bootstrap: tuple[PeerId, ...], now: float, out: list[OutEvent]) -> None:
        self.joined = True
        self.entry = JoinProgress()
        self.bootstrap = tuple(p for p in bootstrap if p != self.me)
        for name in PERIODIC_TIMERS:
            self._arm(name, now, out)
        if self.bootstrap:
            self._ask_contacts(out)
            self._schedule(Timer.JOIN_RETRY, self.config.join_retry_interval, out)

    def leave(self, now: float, out: list[OutEvent]) -> None:
        for peer in list(self.active):
            out.append(Send(peer, self.topic, m.Leave(peer=self.me, ttl=self.config.leave_ttl)))
            self._remove_active(peer, out)
        for peer in list(self.pending):
            out.append(Send(peer, self.topic, m.Disconnect(alive=False)))
        self.pending.clear()
        self.passive_view.clear()
        self.joined = False

    # -- timers -------------------------------------------------------------------------

    def on_timer(self, timer: Timer, now: float, out: list[OutEvent]) -> None:
        if not self.joined:
            return
        match timer:
            case Timer.RECOVER:
                self._on_recover_timer(now, out)
            case Timer.JOIN_RETRY:
                self._on_join_retry_timer(out)
            case Timer.STABILIZE | Timer.OPTIMIZE | Timer.SHUFFLE | Timer.PING | Timer.PROBE:
                self._on_periodic_timer(timer, now, out)
            case _:
                assert_never(timer)

    def _on_join_retry_timer(self, out: list[OutEvent]) -> None:
        # Also with links: if our GETNODES, its answer or our JOINs were lost, the
        # links we hold are to nodes that joined through us since, and without our
        # own JOIN taken in we are the root of an island that may never meet the
        # rest of the overlay (its few bridges can be evicted like any link).
        if not self.entry.confirmed or (not self.active and not self.pending):
            self.entry.sent = False
        if not self.entry.sent:
            self._ask_contacts(out)
            self._schedule(Timer.JOIN_RETRY, self.config.join_retry_interval, out)

    def _on_periodic_timer(self, timer: Timer, now: float, out: list[OutEvent]) -> None:
        if self._pace.stale(timer, now):
            return  # set at the pace before the node settled: re-armed since (_note_settled)
        handler = {
            Timer.STABILIZE: self._stabilize,
            Timer.OPTIMIZE: self._optimize,
            Timer.SHUFFLE: self.passive_view.start_shuffle,
            Timer.PING: self._ping_active,
            Timer.PROBE: self.passive_view.probe,
        }[timer]
        handler(now, out)
        self._arm(timer, now, out)
        if self.config.settled_upkeep is not None:
            self._note_settled(now, out)

    def _arm(self, name: Timer, now: float, out: list[OutEvent]) -> None:
        """Set periodic timer `name` at the current pace (runtime: and note when it is due)."""
        delay = self._period(name)
        if self.config.settled_upkeep is not None:
            self._pace.armed(name, now + delay, settled=self.settled())
        self._schedule(name, delay, out)

    def _note_settled(self, now: float, out: list[OutEvent]) -> None:
        """Runtime upkeep: when the node has just settled, re-arm the periodic timers set
        at the unsettled pace that would fire before the settled pace has them (pings,
        probes, stabilisation, and the first shuffle, which then waits for
        a settled view): otherwise each fires once more at the old pace, an idle node's
        first minute of wakeups and frames. A timer is re-armed at most once per arming
        (one armed settled is left alone), so a node that flaps cannot postpone its pings
        for good. Not optimisation: its next round, as due, may still find a nearer
        peer (left to fire, the idle overlay opened a third of the connections)."""
        settled = self.settled()
        pace = self._pace
        if settled and not pace.was_settled:
            for name in PERIODIC_TIMERS:
                due = pace.due.get(name)
                if due is None or name in pace.at_settled_pace or name is Timer.OPTIMIZE:
                    continue
                delay = self._period(name)
                if now + delay > due:
                    pace.due[name] = now + delay
                    self._schedule(name, delay, out)
                pace.at_settled_pace.add(name)
        pace.was_settled = settled

    def _period(self, name: Timer) -> float:
        c = self.config
        base = {
            Timer.STABILIZE: c.stabilize_interval,
            Timer.OPTIMIZE: c.optimize_interval,
            Timer.SHUFFLE: c.shuffle_interval,
            Timer.PING: c.ping_interval,
            Timer.PROBE: c.passive_probe_interval,
        }[name]
        # Upkeep is sparse once the view is settled and measured (an idle node's CPU goes
        # to wakeups), as frequent as it was before that.
        settled = c.settled_upkeep is not None and self.settled()
        if name is Timer.PROBE and self.passive_view.has_unmeasured():
            base = min(base, c.passive_probe_interval_unmeasured)
        elif name is Timer.STABILIZE and self.link_count() != self.active_size and not settled:
            base = min(base, c.stabilize_interval_unsettled)
        elif name is Timer.OPTIMIZE and self.improving:
            base = min(base, c.optimize_interval_improving)
        elif (
            settled
            and name in _SETTLED_TIMERS
            and not (name is Timer.OPTIMIZE and self.passive_view.has_unmeasured())
        ):
            # Shuffles at most twice as sparse (iroh's 60 s): passive views must stay
            # fresh for recovery after a crash of most of the overlay.
            base *= min(c.settled_upkeep, 2.0) if name is Timer.SHUFFLE else c.settled_upkeep
            if name is Timer.PROBE:
                # Probes back off further once optimisation finds nothing nearer: to
                # half the settled ping period (every 30 s at the defaults).
                base = max(base, c.ping_interval * c.settled_upkeep / 2)
        return jittered(self.rng, base, c.timer_jitter)

    def settled(self) -> bool:
        """Is there nothing for upkeep to do soon? At least A links held and none to shed
        (near links held for peers count: in a small overlay a node may hold many and find
        every peer too full to give it one of its own, and asking every 2 s changes
        nothing), no link changing kind, and the last optimisation round asked for
        nothing. (A query: settled_upkeep stretches the periods while it holds; probes and
        optimisation also wait for every known peer to be measured.)"""
        # Hub links (hub_links) count as held only while there is no passive peer to grow
        # our own links from: a contact holding joiners' links alone has nothing to do.
        held = self.own_count() if self.passive else len(self.active)
        return (
            not self.improving
            and self.link_count() <= self.active_size <= held
            and not any(link.relabel is not None for link in self.active.values())
        )

    def _schedule(self, name: Timer, delay: float, out: list[OutEvent]) -> None:
        # Pings and probes may share wakeups with other nodes' (ScheduleTimer.coalesce):
        # their answers then come while the node is awake anyway. The rest of the
        # periodic upkeep shares this node's own ticks (ScheduleTimer.upkeep), at a phase
        # of its own: lined up across nodes, it broke trees (docs/protocol.md).
        coalesce = name in _COALESCED_TIMERS
        upkeep = name in _UPKEEP_TIMERS
        out.append(ScheduleTimer(delay, (*self._timer_prefix, name), coalesce, upkeep))

    # -- messages -----------------------------------------------------------------------

    def on_message(
        self, peer: PeerId, msg: m.MembershipMessage, now: float, out: list[OutEvent]
    ) -> None:
        if peer == self.me:
            out.append(PeerMisbehaved(peer, "message claims to come from ourselves"))
            return
        match msg:
            case m.GetNodes():
                if self.config.hub_links:
                    self._note_joiner(peer)
                peers = [*self.active, *self.passive][: m.MAX_PEERS_PER_MESSAGE]
                out.append(Send(peer, self.topic, m.Nodes(peers=tuple(peers))))
            case m.Nodes(peers=peers):
                self._on_nodes(peer, peers, now, out)
            case m.Join(peer=joiner, ttl=ttl):
                self._on_join(peer, joiner, ttl, now, out)
            case m.ForwardJoin(peer=joiner, ttl=ttl):
                self._on_forward_join(peer, joiner, ttl, out)
            case m.Neighbor(op=NeighborOp.REQUEST):
                self._on_neighbor_request(peer, msg, now, out)
            case m.Neighbor(op=NeighborOp.ACCEPT):
                self._on_neighbor_accept(peer, msg, now, out)
            case m.Disconnect(alive=alive):
                self._on_disconnect(peer, alive, now, out)
            case m.Leave(peer=departed, ttl=ttl):
                self._on_leave(peer, departed, ttl, now, out)
            case m.Shuffle():
                if self.joined:
                    self.passive_view.on_shuffle(peer, msg, out)
            case m.ShuffleReply():
                self._expire_left(now)
                self.passive_view.on_shuffle_reply(peer, msg, out)
            case m.Ping(nonce=nonce, want_view=want_view):
                if self.joined and not self.active and peer not in self.left:
                    # A peer that probes us holds us in its passive view: a node with no
                    # neighbour left takes it as a way back in (after a crash of most of
                    # the overlay, the survivors that remember us may be all we have).
                    self.passive_view.add(peer)
                link = self.active.get(peer)
                if link is not None:
                    link.pinged_at = now
                view = tuple(self.active) if want_view else ()
                pong = m.Pong(
                    nonce=nonce,
                    subscribed=self.joined,
                    active_count=self.own_count(),
                    rand_count=self.rand_count(),
                    active=view,
                    not_neighbor=peer not in self.active,
                )
                out.append(Send(peer, self.topic, pong))
            case m.Pong():
                self._on_pong(peer, msg, now, out)
            case _:
                assert_never(msg)  # a membership message without a case: a bug of ours
        if self.config.settled_upkeep is not None:
            self._note_settled(now, out)

    def on_connection_lost(self, peer: PeerId, now: float, out: list[OutEvent]) -> None:
        """The peer is unreachable: it leaves every view and goes dormant."""
        if peer in self.active or peer in self.passive:
            self.passive_view.make_dormant(peer, now)
        request = self.pending.get(peer)
        if request is not None and request.join_ttl:
            # The draft's connection check: we took its JOIN but cannot reach the joiner
            # (behind NAT, say); the JOIN walks on one hop shorter, as if we had not.
            others = [p for p in self.active if p != peer]
            if others:
                walk = m.Join(peer=peer, ttl=request.join_ttl - 1)
                out.append(Send(choice(self.rng, others), self.topic, walk))
        # A dormant peer's backoff already grew when its probe was sent.
        self._forget(peer, out)
        self.passive_view.drop_pings(peer)
        if self.joined and not self.active:
            # With no neighbour, the next passive peer is asked at once, not at the next
            # stabilisation: after a crash of most nodes a passive view of the dead drains
            # in round trips, not in minutes.
            self._grow(now, out)
            self._check_isolated(now, out)
        if self.config.settled_upkeep is not None:
            self._note_settled(now, out)

    # -- recovery -----------------------------------------------------------------------

    def _check_isolated(self, now: float, out: list[OutEvent]) -> None:
        """No neighbour, no request in flight, no passive peer left: start recovering.
        Only a node that had links: a joiner's contacts are join_retry's business."""
        if (
            self.joined
            and self.recovery.wait is None
            and self.links_made > 0
            and not self.active
            and not self.pending
            and not self.passive
        ):
            self.recovery = Recovery(wait=self.config.recovery_retry)
            self._recover(out)

    def _recover(self, out: list[OutEvent]) -> None:
        """One attempt to get back in: GETNODES to every contact and every peer we still
        remember (dormant peers, near candidates, the peers pushed out of the passive view
        or the near candidates for room, a sample of the RTT table); the first answer
        leads to JOINs, as at a fresh join. Without this, two survivors of a 95% crash kept
        an empty active view for good; without the peers pushed out,
        one survivor of seed 4 knew no live peer, and no live peer knew it."""
        c = self.config
        self.recovery.attempts += 1
        self.counters.recoveries += 1
        asked = dict.fromkeys(
            (*self.bootstrap, *self.dormant, *self.near_candidates, *self.passive_view.forgotten)
        )
        remembered = [p for p in self.rtts.peers() if p not in asked]
        asked.update(dict.fromkeys(sample(self.rng, remembered, c.recovery_fanout)))
        for peer in asked:
            if peer != self.me and peer not in self.left:
                out.append(Send(peer, self.topic, m.GetNodes()))
        self.entry.sent = False
        out.append(Isolated(self.topic, self.recovery.attempts))
        assert self.recovery.wait is not None
        self._schedule(Timer.RECOVER, self.recovery.wait, out)

    def _on_recover_timer(self, now: float, out: list[OutEvent]) -> None:
        """Again, with the wait doubled, until a neighbour comes."""
        recovery = self.recovery
        if recovery.wait is None:
            return
        if self.active:
            recovery.wait = None
            return
        recovery.wait = min(recovery.wait * 2, self.config.recovery_max_retry)
        self._recover(out)

    def refresh_contacts(self, bootstrap: tuple[PeerId, ...], out: list[OutEvent]) -> None:
        """The ids our bootstrap addresses answer with now (RefreshContacts): they replace
        the contacts, and are asked for peers at once."""
        if not self.joined:
            return
        self.bootstrap = tuple(p for p in dict.fromkeys(bootstrap) if p != self.me)
        self.entry.sent = False
        self._ask_contacts(out)

    # -- joining ------------------------------------------------------------------------

    def _ask_contacts(self, out: list[OutEvent]) -> None:
        for contact in self.bootstrap:
            out.append(Send(contact, self.topic, m.GetNodes()))

    def _on_nodes(
        self, sender: PeerId, peers: tuple[PeerId, ...], now: float, out: list[OutEvent]
    ) -> None:
        if not self.joined:
            return
        fresh = [p for p in (sender, *peers) if p != self.me and p not in self.active]
        for p in fresh:
            self.passive_view.add(p)
        if self.entry.sent:
            return
        self.entry.sent = True
        others = [p for p in peers if p != sender and p != self.me]
        if self.config.hub_links and sender in self.bootstrap:
            # Our contact takes us in as a hub link (`_takes_in`); the other JOINs walk
            # to the links of our own.
            targets = [sender, *sample(self.rng, others, self.config.c_rand)]
        else:
            targets = sample(self.rng, [sender, *others], self.config.c_rand)
        # The draft's retries: each round one hop shorter, until a TTL of 0 has the
        # contact itself take us in, over the connection we opened (a node that others
        # cannot dial, behind NAT, still joins).
        ttl = max(self.config.join_ttl - self.entry.attempts, 0)
        self.entry.attempts += 1
        for target in targets:
            out.append(Send(target, self.topic, m.Join(peer=self.me, ttl=ttl)))
        self.passive_view.probe_initial(now, out)

    def _on_join(
        self, sender: PeerId, joiner: PeerId, ttl: int, now: float, out: list[OutEvent]
    ) -> None:
        if joiner == self.me or joiner in self.active or joiner in self.pending or not self.joined:
            return
        # A JOIN is news that the peer is joining now, later than any LEAVE of its we heard:
        # a node that left a topic and joined again 2 s later had its JOINs dropped for a
        # minute.
        self.left.pop(joiner, None)
        others = [p for p in self.active if p != sender and p != joiner]
        if self._takes_in(sender, joiner):
            self.counters.joins_accepted += 1
            self._request_link(joiner, LinkKind.NEAR, now, out, high_priority=True, join_ttl=ttl)
            if others:
                fwd = m.ForwardJoin(peer=joiner, ttl=self.config.forward_join_ttl)
                out.append(Send(choice(self.rng, others), self.topic, fwd))
            return
        if self.own_count() + len(self.pending) >= self.config.max_active:
            # No room, counting the links we have asked for: requests a JOIN makes count,
            # or a burst of JOINs for made-up peers would grow `pending` without bound.
            if ttl > 0 and others:
                out.append(
                    Send(choice(self.rng, others), self.topic, m.Join(peer=joiner, ttl=ttl - 1))
                )
            return
        if ttl == 0 or self.link_count() < self.active_size or not others:
            self.counters.joins_accepted += 1
            self._request_link(joiner, LinkKind.RAND, now, out, high_priority=True, join_ttl=ttl)
            if others:
                fwd = m.ForwardJoin(peer=joiner, ttl=self.config.forward_join_ttl)
                out.append(Send(choice(self.rng, others), self.topic, fwd))
        else:
            self.counters.joins_forwarded += 1
            out.append(Send(choice(self.rng, others), self.topic, m.Join(peer=joiner, ttl=ttl - 1)))

    def _note_joiner(self, peer: PeerId) -> None:
        """`peer` asked us for peers: it joins (or rejoins) through us. Bounded: the
        oldest askers go first."""
        joiners = self.joiners
        joiners.pop(peer, None)
        joiners[peer] = None
        if len(joiners) > 2 * self.config.hub_links:
            del joiners[next(iter(joiners))]

    def _takes_in(self, sender: PeerId, joiner: PeerId) -> bool:
        """Is a JOIN taken in as a hub link? It comes from the joiner itself, which asked
        us for peers (we are its contact), while we hold fewer than hub_links."""
        limit = self.config.hub_links
        if not limit or sender != joiner or joiner not in self.joiners:
            return False
        asked = sum(1 for p in self.pending if p in self.joiners)
        return self.hub_count() + asked < limit

    def _is_hub(self, peer: PeerId, asked: LinkKind) -> bool:
        """Is a link `peer` asks for (`asked`: the kind it asks) a hub link? The contact
        decides: a joiner that asked us for peers, while we hold fewer than hub_links; its
        joiner takes the kind its contact asks for."""
        limit = self.config.hub_links
        if not limit:
            return False
        if peer in self.joiners and self.hub_count() < limit:
            return True
        return asked is LinkKind.NEAR and peer in self.bootstrap

    def _on_forward_join(
        self, sender: PeerId, joiner: PeerId, ttl: int, out: list[OutEvent]
    ) -> None:
        if joiner == self.me or not self.joined:
            return
        if joiner not in self.active and joiner not in self.left:
            self.passive_view.add(joiner)
        if ttl > 0:
            others = [p for p in self.active if p != sender and p != joiner]
            if others:
                fwd = m.ForwardJoin(peer=joiner, ttl=ttl - 1)
                out.append(Send(choice(self.rng, others), self.topic, fwd))

    # -- links --------------------------------------------------------------------------

    def _request_link(
        self,
        peer: PeerId,
        kind: LinkKind,
        now: float,
        out: list[OutEvent],
        *,
        high_priority: bool = False,
        replaces: PeerId | None = None,
        join_ttl: int | None = None,
    ) -> None:
        if peer in self.pending:
            return  # one request per peer at a time: a second one would overwrite the first
        self.pending[peer] = PendingRequest(
            kind=kind, sent_at=now, replaces=replaces, join_ttl=join_ttl
        )
        request = m.Neighbor(
            op=NeighborOp.REQUEST,
            kind=kind,
            high_priority=high_priority,
            rtt=self.rtts.get(peer),
            active_count=self.own_count(),
            rand_count=self.rand_count(),
        )
        out.append(Send(peer, self.topic, request))

    def _accept_message(self, kind: LinkKind) -> m.Neighbor:
        return m.Neighbor(
            op=NeighborOp.ACCEPT,
            kind=kind,
            active_count=self.own_count(),
            rand_count=self.rand_count(),
        )

    def _on_neighbor_request(
        self, peer: PeerId, req: m.Neighbor, now: float, out: list[OutEvent]
    ) -> None:
        if not self.joined:
            out.append(Send(peer, self.topic, m.Disconnect(alive=False)))
            return
        self.left.pop(peer, None)  # it asks for itself: it is back, whatever we heard
        if peer in self.active:  # the link stands: a request to relabel it, or a repeat
            link = self.active[peer]
            link.peer_active, link.peer_rand = req.active_count, req.rand_count
            if req.kind is not link.kind:
                self.proximity.judge_relabel(peer, link, req, now, out)
            out.append(Send(peer, self.topic, self._accept_message(link.kind)))
            return
        if req.rtt is not None:
            # The peer's word, until we measure it ourselves (RttTable.claim): refused or
            # not, it must not stick as a measurement.
            self.rtts.claim(peer, req.rtt)
        crossed = self.pending.pop(peer, None)  # we asked each other at once: one link
        kind = self._judge_request(peer, req, crossed is not None)
        if (
            kind is not None
            and crossed is not None
            and not self._proposal_wins(peer)
            and not self.config.hub_links  # each end judges the same: hub link or not
        ):
            # Both ends accept the other's proposal; the lower id's kind wins on both.
            kind = crossed.kind
        if kind is None:
            self.counters.neighbor_refused += 1
            out.append(Send(peer, self.topic, m.Disconnect(alive=True)))
            return
        self.counters.neighbor_accepted += 1
        if req.high_priority:
            self.entry.confirmed = True
        # Our own choice only if we asked for a near link too (the requests crossed).
        chosen = kind is LinkKind.NEAR and crossed is not None and crossed.kind is LinkKind.NEAR
        self._add_active(peer, kind, now, out, req.active_count, req.rand_count, chosen)
        out.append(Send(peer, self.topic, self._accept_message(kind)))

    def _judge_request(self, peer: PeerId, req: m.Neighbor, crossed: bool) -> LinkKind | None:
        """The draft's acceptance rules; returns the link's kind, or None to refuse. With
        hub_links, a link between a contact and its joiner is NEAR (a hub link), any
        other RAND."""
        c = self.config
        if self._is_hub(peer, req.kind):
            return LinkKind.NEAR
        if self.own_count() >= c.max_active:
            return None
        if req.high_priority or crossed or self.link_count() < self.active_size:
            return LinkKind.RAND if c.hub_links else req.kind
        if req.active_count < c.c_rand:
            return LinkKind.RAND
        if (
            c.proximity
            and req.kind is LinkKind.NEAR
            and self.held_for_others() < c.max_active - self.active_size
        ):
            # A near link is its requester's choice and does not count against ours:
            # held while there is room beside our own A (proximity.py).
            return LinkKind.NEAR
        return None

    def _proposal_wins(self, peer: PeerId) -> bool:
        """Does `peer`'s proposal beat ours when requests cross? The lower id wins."""
        try:
            return bool(peer < self.me)  # type: ignore[operator]
        except TypeError:
            return repr(peer) < repr(self.me)

    def _on_neighbor_accept(
        self, peer: PeerId, acc: m.Neighbor, now: float, out: list[OutEvent]
    ) -> None:
        request = self.pending.pop(peer, None)
        if peer in self.active:
            link = self.active[peer]
            link.peer_active, link.peer_rand = acc.active_count, acc.rand_count
            if link.relabel is not None:
                # The answer to our relabel request: the peer's kind is the link's.
                if acc.kind is not link.relabel:
                    self.refused_by[peer] = now + self.config.recent_reject_memory
                self.proximity.relabel(peer, link, acc.kind, now, out, chosen=True)
            elif link.kind is not acc.kind and self._proposal_wins(peer):
                link.kind = acc.kind
                link.hub = bool(self.config.hub_links) and acc.kind is LinkKind.NEAR
            return
        late = request is None and peer in self.refused_by  # our request timed out
        if (
            (request is None and not late)
            or (
                self.own_count() >= self.config.max_active
                and not (self.config.hub_links and acc.kind is LinkKind.NEAR)
            )
            or not self.joined
        ):
            # Unasked, or no room left: undo the link at its other end.
            out.append(Send(peer, self.topic, m.Disconnect(alive=self.joined)))
            return
        self.refused_by.pop(peer, None)
        # An ACCEPT of a new link answers our request: a NEAR one is a near link we chose.
        chosen = acc.kind is LinkKind.NEAR
        self._add_active(peer, acc.kind, now, out, acc.active_count, acc.rand_count, chosen)
        if request is not None and request.replaces is not None:
            old = self.active.get(request.replaces)
            if old is not None and old.peer_active > self.config.c_rand:
                self.counters.optimize_swaps += 1
                self._drop_link(request.replaces, out)

    def _on_disconnect(self, peer: PeerId, alive: bool, now: float, out: list[OutEvent]) -> None:
        if self.pending.pop(peer, None) is not None:
            self.refused_by[peer] = now + self.config.recent_reject_memory
        if peer in self.active:
            self._remove_active(peer, out)
        if alive and self.joined and peer not in self.left:
            self.passive_view.add(peer)
        else:
            self.passive_view.remove(peer)

    def _add_active(
        self,
        peer: PeerId,
        kind: LinkKind,
        now: float,
        out: list[OutEvent],
        peer_active: int,
        peer_rand: int,
        chosen: bool = False,
    ) -> None:
        self.passive_view.discard(peer)
        self.links_made += 1
        self.active[peer] = Link(
            kind=kind,
            since=now,
            peer_active=peer_active,
            peer_rand=peer_rand,
            serial=self.links_made,
            chosen=chosen,
            hub=bool(self.config.hub_links) and kind is LinkKind.NEAR,
        )
        out.append(NeighborUp(self.topic, peer, kind))

    def _remove_active(self, peer: PeerId, out: list[OutEvent]) -> None:
        del self.active[peer]
        out.append(NeighborDown(self.topic, peer))

    def _forget(self, peer: PeerId, out: list[OutEvent]) -> bool:
        """Take `peer` out of every view; True if it was in the active or passive view or
        had a request pending."""
        known = peer in self.active or peer in self.passive or peer in self.pending
        if peer in self.active:
            self._remove_active(peer, out)
        self.pending.pop(peer, None)
        self.passive_view.discard(peer)
        return known

    def _drop_link(self, peer: PeerId, out: list[OutEvent]) -> None:
        """We end a link on our initiative: tell the peer, keep it as a passive peer."""
        out.append(Send(peer, self.topic, m.Disconnect(alive=True)))
        self._remove_active(peer, out)
        self.passive_view.add(peer)

    # -- leaving ------------------------------------------------------------------------

    def _on_leave(
        self, sender: PeerId, departed: PeerId, ttl: int, now: float, out: list[OutEvent]
    ) -> None:
        if departed == self.me:
            return
        if departed in self.active and sender != departed:
            # A neighbour that leaves tells us itself, before its other neighbours can pass
            # it on: anyone else's word that it left is not taken (a key holder could cut
            # a node off from all its neighbours with forged LEAVEs).
            return
        self._expire_left(now)
        removed = self._forget(departed, out)
        first_time = departed not in self.left
        if first_time and len(self.left) >= self.config.max_left_memory:
            # Full: the departure remembered longest goes. A LEAVE not remembered was
            # forwarded again on every copy: with max_left_memory LEAVEs of strangers
            # first, one LEAVE of ttl 64 flooded the overlay exponentially (the
            # adversarial model: 200,000 messages within a simulated second, then OOM).
            del self.left[min(self.left, key=self.left.__getitem__)]
        self.left[departed] = now + self.config.left_memory
        if first_time and (removed or ttl > 0):
            fwd = m.Leave(peer=departed, ttl=max(ttl - 1, 0))
            for peer in self.active:
                if peer != sender:
                    out.append(Send(peer, self.topic, fwd))

    def _expire_left(self, now: float) -> None:
        for peer in [p for p, until in self.left.items() if until <= now]:
            del self.left[peer]

    # -- pings ------------------------------------------------------------------------

    def _ping_active(self, now: float, out: list[OutEvent]) -> None:
        self.passive_view.expire_pings(now)
        oversubscribed = self.link_count() > self.active_size
        # Settled, a link the peer pinged within a settled ping period is not pinged back:
        # one end's pings keep both ends' liveness (the runtime's silence check), and
        # the kernel gives the RTT. Unsettled, both ends ping: views flow both ways.
        quiet_since: float | None = None
        factor = self.config.settled_upkeep
        if factor is not None and factor > 1.0 and self.settled():
            quiet_since = now - self.config.ping_interval * factor
        for peer, link in self.active.items():
            if quiet_since is not None and link.pinged_at > quiet_since:
                continue
            # Views of near neighbours are where nearer peers are found (GoCast); views of
            # all neighbours tell an oversubscribed node which links close triangles.
            want_view = oversubscribed or self.config.proximity
            self.passive_view.send_ping(peer, want_view=want_view, now=now, out=out)

    def _on_pong(self, peer: PeerId, pong: m.Pong, now: float, out: list[OutEvent]) -> None:
        match = self.passive_view.on_pong(peer, pong, now, out)
        if match is None:
            return
        if not pong.subscribed:
            self._forget(peer, out)
            return
        if match.revived and peer not in self.active and peer not in self.pending:
            # Reachable again after a failure: link to it at once (high priority), since
            # this may be the one path between two halves of a healed partition.
            self.counters.revived += 1
            self._request_link(peer, LinkKind.RAND, now, out, high_priority=True)
            return
        link = self.active.get(peer)
        if link is not None and pong.not_neighbor and match.link_serial == link.serial:
            # The peer answered a ping sent over this very link, saying we are
            # not its neighbour: a NEIGHBOR accept or a DISCONNECT was lost on the way (the
            # runtime's TCP loses none, but a connection can be replaced under it; the
            # simulator's loss does). A one-sided link carries no broadcast one way, so end
            # it; stabilisation grows the view again from the passive view.
            self.counters.one_sided_dropped += 1
            self._drop_link(peer, out)
            return
        if link is not None:
            link.peer_active, link.peer_rand = pong.active_count, pong.rand_count
            if pong.active:
                link.peer_view = pong.active
                # Neighbours' neighbours are where nearer peers turn up (GoCast). Views of
                # random neighbours help too: the simulator found learning only from near
                # neighbours' views converged slower (docs/simulation.md).
                if self.config.proximity:
                    self.passive_view.learn_near_candidates(pong.active)

    # -- stabilisation and optimisation ------------------------------------------------

    def _stabilize(self, now: float, out: list[OutEvent]) -> None:
        c = self.config
        self._expire_left(now)
        for peer in [
            p for p, r in self.pending.items() if r.sent_at + c.neighbor_request_timeout <= now
        ]:
            del self.pending[peer]
            self.refused_by[peer] = now + c.recent_reject_memory
        for peer in [p for p, until in self.refused_by.items() if until <= now]:
            del self.refused_by[peer]
        for link in self.active.values():
            if link.relabel is not None and link.relabel_at + c.neighbor_request_timeout <= now:
                link.relabel = None  # unanswered: the kind we hold stands
        if self.link_count() > self.active_size:
            self._shrink(out)
        elif self.link_count() + len(self.pending) < self.active_size:
            self._grow(now, out)
        if not self.passive and self.link_count() < self.active_size and self.bootstrap:
            # Nothing left to grow from: ask the contacts again. This also rescues a node
            # whose first GETNODES (or its answer) was lost and that now sits in a small
            # island with the few nodes that joined through it.
            self._ask_contacts(out)
        self._check_isolated(now, out)

    def _shrink(self, out: list[OutEvent]) -> None:
        """Drop links only where it is safe (draft): first to neighbours that stay at A or
        more without us, then links that close a triangle (both ends keep a path)."""
        c = self.config
        excess = self.link_count() - self.active_size
        for _ in range(excess):
            rand_excess = self.rand_count() > c.c_rand
            # Only links that count against A: a near link a peer chose is its to drop.
            ours = [(p, link) for p, link in self.active.items() if self._counts(link)]
            safe = [
                (p, link)
                for p, link in ours
                if link.peer_active > self.active_size
                and (link.kind is LinkKind.RAND) == rand_excess
            ] or [(p, link) for p, link in ours if link.peer_active > self.active_size]
            if not safe:
                safe = [
                    (p, link)
                    for p, link in ours
                    if link.peer_active >= self.active_size and self._closes_triangle(p)
                ]
            if not safe:
                return
            # The neighbour with most links loses least; ties go to the older link.
            peer = max(safe, key=lambda item: (item[1].peer_active, -item[1].since))[0]
            self.counters.stabilize_drops += 1
            self._drop_link(peer, out)

    def _closes_triangle(self, peer: PeerId) -> bool:
        return any(peer in link.peer_view for p, link in self.active.items() if p != peer)

    def _grow(self, now: float, out: list[OutEvent]) -> None:
        c = self.config
        wanted = self.active_size - self.link_count() - len(self.pending)
        wanted = min(wanted, c.max_pending_requests - len(self.pending))
        pool = [p for p in self.passive if p not in self.refused_by and p not in self.pending]
        for _ in range(max(wanted, 0)):
            if not pool:
                return
            needs_rand = self.rand_count() + self._pending_count(LinkKind.RAND) < c.c_rand
            # With hub links a link of our own is RAND: NEAR labels hub links.
            kind = LinkKind.RAND if needs_rand or c.hub_links else LinkKind.NEAR
            if needs_rand or not c.proximity:
                # Without proximity the near slots are filled like random ones: plain HyParView.
                peer = choice(self.rng, pool)
            else:
                peer = min(pool, key=lambda p: (self.proximity.rtt_or_inf(p), self.rng.random()))
            pool.remove(peer)
            self._request_link(peer, kind, now, out)

    def _optimize(self, now: float, out: list[OutEvent]) -> None:
        """GoCast's optimisation round: proximity.py chooses among the peers we know, and we
        ask for the near link it names (a swap drops the displaced link once the new one
        is made, if its peer keeps C_rand links without it)."""
        c = self.config
        if not c.proximity:
            return
        get_rtt = self.rtts.get
        known = [
            (get_rtt(p), p)
            for p in dict.fromkeys((*self.near_candidates, *self.passive))
            if p not in self.refused_by and p not in self.active and p not in self.pending
        ]
        if self.link_count() < self.active_size:
            # Growth (stabilisation) fills a thin view, but a near link we hold for a
            # peer can count as ours at once (in a small overlay every peer may be linked
            # already, and nothing would be left to grow from).
            self.improving = self.proximity.adopt_held_near(known, now, out)
            return
        if any(r.kind is LinkKind.NEAR for r in self.pending.values()) or any(
            link.relabel is not None for link in self.active.values()
        ):
            return  # one near request at a time (and the next round soon, if improving)
        sent, adopted = len(out), self.counters.near_adopted
        wanted = self.proximity.optimize(known, now, out)
        if wanted is not None:
            peer, replaces = wanted
            self._request_link(peer, LinkKind.NEAR, now, out, replaces=replaces)
        # Asked for a link or a relabel, or adopted one: the next round comes sooner.
        self.improving = len(out) > sent or self.counters.near_adopted > adopted
