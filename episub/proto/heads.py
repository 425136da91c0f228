"""Stream heads: what a node tells its neighbours once a stream goes quiet (HEADS).

Plumtree announces a message once (IHAVE, on the next flush), and a per-publisher gap shows
only when a later message of the stream arrives. A stream's last message whose eager copy
and announcement were both lost is revealed by neither: nothing comes after it. So each
node remembers, per publisher, the last seq it took in (its head, with the hops it came
at), and once no newer one has come for `heads_quiet`, names it once in a HEADS to every
neighbour not known to hold it. A neighbour behind that head GRAFTs what it lacks, as it
would after an IHAVE (broadcast.py `_on_heads`).

Rules this machine keeps:
- A head is sent once per neighbour, once nothing newer of its stream has come for
  `heads_quiet` (a stream that keeps arriving shows its own gaps, and sends none), in
  batches: one timer fires when the oldest pending head is due, takes every head due by
  then, and fires again no sooner than half a period later, so a link gets at most two
  HEADS per `heads_quiet` whatever the number of streams.
- Not to a neighbour known to hold the head: the one that sent it to us, and those whose
  own HEADS named it (or a later seq) first. Not to a neighbour whose link came up after
  the head's message arrived: it joined after it and would take an old message for news.
- Bounded: pending heads at most `max_publishers` (the oldest is dropped to make room),
  holders per head at most MAX_HEAD_HOLDERS, link times one per active neighbour.
- An idle node sends nothing: the timer runs only while a head is pending.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from episub.proto import messages as m
from episub.proto.config import BroadcastConfig
from episub.proto.messages import PeerId

# A head due this close after the timer fires goes with its batch: float sums of due
# times and timer delays differ in the last bits.
DUE_SLACK = 1e-6

# Neighbours noted as holding one head: an active view is 7 by default (2A = 14 at most
# while oversubscribed); beyond this a few more HEADS go out, which costs a range each.
MAX_HEAD_HOLDERS = 16


@dataclass(slots=True)
class Head:
    """The newest place of one publisher's stream that we took in, and who holds it."""

    seq: int
    hops: int
    at: float  # when it came: it is sent once nothing newer has come for heads_quiet
    holders: list[PeerId] = field(default_factory=list)


class StreamHeads:
    """The heads waiting to be sent, least recently moved first, and when each link came up."""

    def __init__(self, config: BroadcastConfig) -> None:
        self.config = config
        self.pending: OrderedDict[PeerId, Head] = OrderedDict()
        # The publisher `note` last moved to the end of `pending` (None: none yet): a
        # stream's messages come in runs, and its head needs no moving within one.
        self._latest: PeerId | None = None
        # neighbour -> when its link came up (a head older than that is not sent to it).
        self.linked_at: dict[PeerId, float] = {}

    def link_up(self, peer: PeerId, now: float) -> None:
        self.linked_at[peer] = now

    def link_down(self, peer: PeerId) -> None:
        self.linked_at.pop(peer, None)

    def note(
        self, publisher: PeerId, seq: int, hops: int, sender: PeerId | None, now: float
    ) -> None:
        """We took in `publisher`'s `seq` (from `sender`; None: our own publish). Called for
        every message taken in: a pending head is updated in place (it is `pending`'s
        alone until `take_due` hands it out), not made anew."""
        pending = self.pending
        head = pending.get(publisher)
        if head is None:
            pending[publisher] = head = Head(seq=seq, hops=hops, at=now)
            self._latest = publisher
            if sender is not None:
                head.holders.append(sender)
            if len(pending) > self.config.max_publishers:
                pending.popitem(last=False)
            return
        if publisher != self._latest:
            pending.move_to_end(publisher)
            self._latest = publisher
        head.at = now  # a newer place, or an older one filled in: not quiet yet
        if seq > head.seq:
            head.seq = seq
            head.hops = hops
            holders = head.holders
            if sender is None:
                holders.clear()
            elif len(holders) != 1 or holders[0] != sender:
                holders[:] = (sender,)

    def held_by(self, publisher: PeerId, seq: int, peer: PeerId) -> None:
        """`peer` holds `publisher` up to `seq`: our head, unless newer, is no news to it."""
        head = self.pending.get(publisher)
        if (
            head is not None
            and seq >= head.seq
            and peer not in head.holders
            and len(head.holders) < MAX_HEAD_HOLDERS
        ):
            head.holders.append(peer)

    def take_due(self, now: float) -> list[tuple[PeerId, Head]]:
        """The heads whose stream has had nothing newer for heads_quiet."""
        until = now - self.config.heads_quiet + DUE_SLACK
        pending = self.pending
        due = []
        while pending:
            publisher, head = next(iter(pending.items()))
            if head.at > until:
                break
            del pending[publisher]
            due.append((publisher, head))
        return due

    def next_due(self, now: float) -> float | None:
        """Seconds until the oldest pending head is due; None when none is pending."""
        for head in self.pending.values():
            return max(head.at + self.config.heads_quiet - now, 0.0)
        return None

    def ranges_for(self, peer: PeerId, due: list[tuple[PeerId, Head]]) -> list[m.StreamRange]:
        """The due heads `peer` is told of: those it is not known to hold and whose message
        came after its link did."""
        linked = self.linked_at.get(peer)
        if linked is None:
            return []
        return [
            (publisher, head.seq, head.seq, head.hops)
            for publisher, head in due
            if head.at >= linked and peer not in head.holders
        ]
