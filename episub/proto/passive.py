"""The passive view's upkeep for one topic: the peers we know but hold no link to, kept
bounded, fresh and measured.

Membership (membership.py) keeps the active view and makes and ends every link; this
machine keeps the peers outside it: the passive view, GoCast's near candidates and the
dormant peers, and the table of PINGs in flight (PINGs over active links go through it
too, because one PONG answers both). It reads membership's `active` and `left` tables and
changes neither. When a PONG arrives it says what it found (the peer was dormant, the
link the PING went over) and membership decides what that means for links.

Rules this machine keeps:
- The passive view never holds ourselves, an active neighbour or a departed peer, and
  never more than `passive_size` peers: a newcomer from a shuffle evicts first a peer we
  sent in that exchange (HyParView), any other newcomer a random peer. At most
  `max_shuffle_intake` peers are taken from one SHUFFLE or SHUFFLEREPLY.
- An active or passive peer that becomes unreachable goes dormant unless it left (at most
  `dormant_size`, the earliest dropped first); a dormant peer is re-probed after
  `dormant_retry` seconds, the wait doubling up to `dormant_max_retry` with each probe.
  After a partition heals these probes are the only way the two halves meet again.
- A PING unanswered after `ping_timeout` takes its peer out of the passive view (the
  draft's cleanup: presumed gone) into the dormant peers, and out of the near candidates.
- A reply that comes after we gave up on its request (a PONG to a PING that expired or
  whose link was lost, a SHUFFLEREPLY to a SHUFFLE a newer one replaced: after a stall of
  either node, say) is late, not misbehaviour: it is counted (`late_pongs`,
  `late_shuffle_replies`) and otherwise ignored. What was given up on is remembered for
  the last LATE_REPLY_MEMORY PINGs and LATE_SHUFFLE_MEMORY SHUFFLEs; a reply to nothing
  we sent, or to a request already answered, is reported (PeerMisbehaved) and ignored.
- Near candidates (peers in our neighbours' views, learned from their PONGs) are at most
  `near_candidates`, the oldest dropped first.
- A near candidate or passive peer pushed out to make room is kept in `forgotten` (at
  most FORGOTTEN_SIZE, the oldest dropped first), for recovery only: after a crash of
  most of the overlay the survivors a node once heard of may be all it has to ask.

Rules from the draft and HyParView:
- SHUFFLE: every shuffle_interval, ourselves plus k_a active and k_p passive peers go on
  a random walk of shuffle_ttl hops over active links; where it ends (ttl spent, or no
  neighbour to walk on to) the node answers with as many of its passive peers
  (SHUFFLEREPLY) and adds the walk's peers to its passive view.
- passive probing: every passive_probe_interval one due dormant peer, and
  passive_probes_per_tick known peers (passive_probes_per_tick_unmeasured while a near
  candidate has no RTT yet), are pinged for liveness, membership and RTT:
  unmeasured near candidates first, then unmeasured passive peers, then any. A joiner
  sending its JOINs pings initial_probes of its passive peers (fresh contacts) at once,
  so its first near links can be near.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, TypeVar

from episub.proto import messages as m
from episub.proto.config import MembershipConfig
from episub.proto.events import OutEvent, PeerMisbehaved, Send
from episub.proto.messages import PeerId
from episub.proto.peers import Rng, RttTable, choice, sample
from episub.proto.tables import Link, MembershipCounters


@dataclass(slots=True)
class PendingPing:
    peer: PeerId
    sent_at: float
    link_serial: int | None = None  # the active link the ping went over, if any


# Peers pushed out of the passive view or the near candidates, remembered for recovery
# (membership.py asks them when isolated). A guess: a node hears of a hundred or so peers
# while it settles; 64 kept one of 3 survivors known to the isolated node of seed 4's 95%
# crash (docs/reliability.md).
FORGOTTEN_SIZE = 64
K = TypeVar("K")
V = TypeVar("V")
# PINGs given up on, remembered so that their late PONGs are told from unsolicited ones: a
# node pings a few peers a second (passive_probes_per_tick), so this covers a stall of a
# minute or so. A guess.
LATE_REPLY_MEMORY = 256
# SHUFFLEs replaced by a newer one before their reply came: one per shuffle_interval, so
# 8 cover a stall of a minute at a few seconds' interval. A guess.
LATE_SHUFFLE_MEMORY = 8


class PongMatch(NamedTuple):
    """What an expected PONG told us, beyond the RTT already sampled."""

    revived: bool  # the peer was dormant: reachable again
    link_serial: int | None  # the active link the PING went over, if any


class PassiveView:
    """Peers outside the active view. It shares membership's `active` and `left` tables
    (read here, changed there) and counts into its counters."""

    def __init__(
        self,
        *,
        me: PeerId,
        topic: str,
        config: MembershipConfig,
        rng: Rng,
        rtts: RttTable,
        active: dict[PeerId, Link],
        left: dict[PeerId, float],
        counters: MembershipCounters,
    ) -> None:
        self.me = me
        self.topic = topic
        self.config = config
        self.rng = rng
        self.rtts = rtts
        self.active = active
        self.left = left
        self.counters = counters
        self.passive: dict[PeerId, None] = {}  # an ordered set
        self.near_candidates: dict[PeerId, None] = {}
        self.forgotten: dict[PeerId, None] = {}  # pushed out for room: recovery asks them
        # Peers that became unreachable: re-probed with backoff, because after a partition
        # heals they are the only way the two halves find each other again.
        self.dormant: dict[PeerId, tuple[float, float]] = {}  # peer -> (next probe, backoff)
        self.pings: dict[int, PendingPing] = {}
        self.given_up_pings: dict[int, PeerId] = {}  # nonce -> peer, the oldest dropped first
        self.last_shuffle_sent: tuple[PeerId, ...] = ()
        # The nonce of our last SHUFFLE while its reply has not come (None: no reply taken).
        self.shuffle_nonce: int | None = None
        self.given_up_shuffles: dict[int, None] = {}  # nonces replaced before their reply

    # -- the passive set ----------------------------------------------------------------

    def add(self, peer: PeerId, prefer_evicting: tuple[PeerId, ...] = ()) -> None:
        if peer == self.me or peer in self.active or peer in self.passive or peer in self.left:
            return
        if len(self.passive) >= self.config.passive_size:
            victims = [p for p in prefer_evicting if p in self.passive]
            victim = victims[0] if victims else choice(self.rng, list(self.passive))
            del self.passive[victim]
            self._remember(victim)
        self.passive[peer] = None

    def remove(self, peer: PeerId) -> None:
        self.passive.pop(peer, None)

    def discard(self, peer: PeerId) -> None:
        """The peer is linked now, or gone: neither a passive peer nor a near candidate."""
        self.passive.pop(peer, None)
        self.near_candidates.pop(peer, None)

    def clear(self) -> None:
        """We left the topic: no passive peers, no PONG awaited."""
        self.passive.clear()
        self.pings.clear()

    def learn_near_candidates(self, peers: tuple[PeerId, ...]) -> None:
        for p in peers:
            if p == self.me or p in self.active or p in self.left or p in self.near_candidates:
                continue
            if len(self.near_candidates) >= self.config.near_candidates:
                oldest = next(iter(self.near_candidates))
                del self.near_candidates[oldest]
                self._remember(oldest)
            self.near_candidates[p] = None

    def _remember(self, peer: PeerId) -> None:
        """`peer` was pushed out to make room, not found gone: keep it for recovery."""
        self.forgotten.pop(peer, None)
        if len(self.forgotten) >= FORGOTTEN_SIZE:
            del self.forgotten[next(iter(self.forgotten))]
        self.forgotten[peer] = None

    # -- SHUFFLE ------------------------------------------------------------------------

    def start_shuffle(self, now: float, out: list[OutEvent]) -> None:
        if not self.active:
            return
        c = self.config
        exchange = (
            self.me,
            *sample(self.rng, list(self.active), c.shuffle_active),
            *sample(self.rng, list(self.passive), c.shuffle_passive),
        )
        self.last_shuffle_sent = exchange[1:]
        self.counters.shuffles += 1
        target = choice(self.rng, list(self.active))
        if self.shuffle_nonce is not None:  # its reply has not come: given up on
            _remember_bounded(self.given_up_shuffles, self.shuffle_nonce, None,
                              LATE_SHUFFLE_MEMORY)  # fmt: skip
        self.shuffle_nonce = nonce = self.rng.getrandbits(64)
        shuffle = m.Shuffle(origin=self.me, ttl=c.shuffle_ttl, peers=exchange, nonce=nonce)
        out.append(Send(target, self.topic, shuffle))

    def on_shuffle(self, sender: PeerId, shuffle: m.Shuffle, out: list[OutEvent]) -> None:
        origin, ttl, peers = shuffle.origin, shuffle.ttl, shuffle.peers
        if origin == self.me:
            return
        others = [p for p in self.active if p != sender and p != origin]
        if ttl > 0 and others:
            fwd = m.Shuffle(origin=origin, ttl=ttl - 1, peers=peers, nonce=shuffle.nonce)
            out.append(Send(choice(self.rng, others), self.topic, fwd))
            return
        reply = tuple(sample(self.rng, list(self.passive), len(peers)))
        answer = m.ShuffleReply(peers=reply, nonce=shuffle.nonce)
        out.append(Send(origin, self.topic, answer))
        for peer in peers[: self.config.max_shuffle_intake]:
            self.add(peer, reply)

    def on_shuffle_reply(self, peer: PeerId, reply: m.ShuffleReply, out: list[OutEvent]) -> None:
        """The answer to our last SHUFFLE, once: room is made with the peers we sent in it.
        A reply that echoes no SHUFFLE of ours is dropped: unmatched, any peer could push
        a passive view's worth of entries at will."""
        if self.shuffle_nonce is None or reply.nonce != self.shuffle_nonce:
            if reply.nonce in self.given_up_shuffles:  # a SHUFFLE of ours, replaced
                del self.given_up_shuffles[reply.nonce]
                self.counters.late_shuffle_replies += 1
            else:
                out.append(PeerMisbehaved(peer, "SHUFFLEREPLY answers no SHUFFLE of ours"))
            return
        self.shuffle_nonce = None
        for p in reply.peers[: self.config.max_shuffle_intake]:
            self.add(p, self.last_shuffle_sent)

    # -- dormant peers and probing ------------------------------------------------------

    def make_dormant(self, peer: PeerId, now: float) -> None:
        if peer in self.left or peer in self.dormant:
            return
        if len(self.dormant) >= self.config.dormant_size:
            del self.dormant[next(iter(self.dormant))]
        retry = self.config.dormant_retry
        self.dormant[peer] = (now + retry, retry)

    def probe_initial(self, now: float, out: list[OutEvent]) -> None:
        """RTTs to fresh contacts let the first near links be near."""
        for p in sample(self.rng, list(self.passive), self.config.initial_probes):
            self.send_ping(p, want_view=False, now=now, out=out)

    def has_unmeasured(self) -> bool:
        """Is there a passive peer or near candidate with no RTT yet? (A query.)"""
        get_rtt = self.rtts.get
        return any(get_rtt(p) is None for p in (*self.near_candidates, *self.passive))

    def probe(self, now: float, out: list[OutEvent]) -> None:
        """Liveness, membership and RTT of known but unconnected peers (draft: passive view
        management). Peers with no RTT yet go first: proximity needs them measured."""
        self.expire_pings(now)
        pinged = {p.peer for p in self.pings.values()}
        due = [p for p, (when, _) in self.dormant.items() if when <= now and p not in pinged]
        if due:
            peer = due[0]
            _, backoff = self.dormant[peer]
            backoff = min(backoff * 2, self.config.dormant_max_retry)
            self.dormant[peer] = (now + backoff, backoff)
            self.send_ping(peer, want_view=False, now=now, out=out)
        get_rtt = self.rtts.get
        pool = [p for p in dict.fromkeys((*self.near_candidates, *self.passive)) if p not in pinged]
        # Unmeasured near candidates first, then unmeasured passive peers: proximity
        # needs RTTs, and candidates are where the near peers are.
        fresh = [p for p in self.near_candidates if p not in pinged and get_rtt(p) is None]
        c = self.config
        k = c.passive_probes_per_tick_unmeasured if fresh else c.passive_probes_per_tick
        targets = sample(self.rng, fresh, k)
        if len(targets) < k:
            unmeasured = [p for p in pool if get_rtt(p) is None and p not in targets]
            rest = [p for p in pool if p not in targets]
            targets += sample(self.rng, unmeasured or rest, k - len(targets))
        for peer in targets:
            self.send_ping(peer, want_view=False, now=now, out=out)

    # -- PINGs in flight ----------------------------------------------------------------

    def send_ping(self, peer: PeerId, *, want_view: bool, now: float, out: list[OutEvent]) -> None:
        nonce = self.rng.getrandbits(64)
        link = self.active.get(peer)
        serial = link.serial if link is not None else None
        self.pings[nonce] = PendingPing(peer=peer, sent_at=now, link_serial=serial)
        out.append(Send(peer, self.topic, m.Ping(nonce=nonce, want_view=want_view)))

    def expire_pings(self, now: float) -> None:
        deadline = now - self.config.ping_timeout
        for nonce in [n for n, p in self.pings.items() if p.sent_at <= deadline]:
            peer = self.pings.pop(nonce).peer
            _remember_bounded(self.given_up_pings, nonce, peer, LATE_REPLY_MEMORY)
            if peer in self.passive:
                # The draft's cleanup: an unanswered passive peer is presumed gone.
                self.counters.passive_expired += 1
                del self.passive[peer]
                self.make_dormant(peer, now)
            self.near_candidates.pop(peer, None)

    def drop_pings(self, peer: PeerId) -> None:
        """The connection to `peer` is lost: no PONG from it will come."""
        for nonce in [n for n, p in self.pings.items() if p.peer == peer]:
            del self.pings[nonce]
            _remember_bounded(self.given_up_pings, nonce, peer, LATE_REPLY_MEMORY)

    def on_pong(
        self, peer: PeerId, pong: m.Pong, now: float, out: list[OutEvent]
    ) -> PongMatch | None:
        """Match a PONG to our PING, sample the RTT and wake the peer if dormant. None
        (counted) when it answers a PING we gave up on, None (reported as misbehaviour)
        when it answers no PING we sent that peer."""
        ping = self.pings.get(pong.nonce)
        if ping is None or ping.peer != peer:
            if ping is None and self.given_up_pings.get(pong.nonce) == peer:
                del self.given_up_pings[pong.nonce]
                self.counters.late_pongs += 1
            else:
                out.append(PeerMisbehaved(peer, "PONG answers no PING we sent it"))
            return None
        del self.pings[pong.nonce]
        if self.config.pong_rtt is not False:  # else the transport's RTT (RttMeasured)
            self.rtts.sample(peer, max(now - ping.sent_at, 0.0))
        revived = self.dormant.pop(peer, None) is not None
        return PongMatch(revived=revived, link_serial=ping.link_serial)


def _remember_bounded(table: dict[K, V], key: K, value: V, bound: int) -> None:
    """Put key -> value in `table`, dropping its oldest entries past `bound`."""
    table[key] = value
    while len(table) > bound:
        del table[next(iter(table))]
