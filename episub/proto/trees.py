"""Plumtree's eager and lazy sets, one pair per publisher stream: a delivery tree each.

Plumtree keeps one eager set per node for every source; with several publishers on a
topic, each one's messages then follow a tree shaped by the others' duplicates and
optimisations (docs/protocol.md, "Delivery trees"). Here each stream a node has seen has
a `Tree` of its own: a duplicate prunes a link for that stream only, and GRAFT, PRUNE and
the optimisation rules act on the tree of the stream they name.

Rules this table keeps:
- In every tree, `eager` and `lazy` are disjoint and their union is the active view:
  a link coming up or going down is added to or removed from every tree (O(trees)).
- `shared` is the tree a stream starts from: the links as they came up (eager, except
  what the hub rule made lazy), never pruned for a duplicate. A new stream's tree is a
  copy of its sets, with no parent yet.
- At most `cap` streams have a tree of their own. Asking for the tree of another makes
  one and drops the least recently used; a stream whose tree was dropped starts again
  from `shared` when next seen. With cap 0 every stream uses `shared`, which then is
  Plumtree's one tree per topic (pruned for duplicates like any other).
- `peek` never makes nor reorders a tree: a query (the IHAVE flush) costs no state.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterator

from episub.proto.messages import PeerId

__all__ = ["Tree", "Trees"]


class Tree:
    """One stream's eager and lazy neighbours, and the times its own rules look at.

    The timing tables hold at most one entry per active neighbour each, dropped when the
    neighbour goes down (`drop`), and are made when first written: most trees of a
    many-publisher topic never graft or prune, and an empty slot costs 8 bytes where an
    empty dict costs 64."""

    __slots__ = (
        "eager",
        "first_from",
        "graft_sent_at",
        "grafted_at",
        "lazy",
        "pruned_at",
        "swapped_at",
    )

    def __init__(self, eager: dict[PeerId, None], lazy: dict[PeerId, None]) -> None:
        self.eager = eager
        self.lazy = lazy
        # neighbour -> when it last sent us a message of this stream first: the tree's
        # parents, most recent last.
        self.first_from: dict[PeerId, float] = {}
        # neighbour -> when it last sent us an empty GRAFT for this stream (it lost its parent).
        self.grafted_at: dict[PeerId, float] | None = None
        # neighbour -> when we last sent it a GRAFT for this stream (a PRUNE may cross it).
        self.graft_sent_at: dict[PeerId, float] | None = None
        # neighbour -> when we last sent it a PRUNE for this stream.
        self.pruned_at: dict[PeerId, float] | None = None
        # When we last swapped a far parent for a near one or raced a lazy announcer (the
        # near parent rule's and the lazy race's rate limit).
        self.swapped_at = -math.inf

    def copy_sets(self) -> Tree:
        """A new tree with these eager and lazy sets and nothing else."""
        return Tree(dict(self.eager), dict(self.lazy))

    def pruned_since(self, peer: PeerId) -> float:
        pruned = self.pruned_at
        return -math.inf if pruned is None else pruned.get(peer, -math.inf)

    def note_pruned(self, peer: PeerId, now: float) -> None:
        if self.pruned_at is None:
            self.pruned_at = {}
        self.pruned_at[peer] = now

    def grafted_since(self, peer: PeerId) -> float | None:
        grafted = self.grafted_at
        return None if grafted is None else grafted.get(peer)

    def note_grafted(self, peer: PeerId, now: float) -> None:
        if self.grafted_at is None:
            self.grafted_at = {}
        self.grafted_at[peer] = now

    def note_graft_sent(self, peer: PeerId, now: float) -> None:
        if self.graft_sent_at is None:
            self.graft_sent_at = {}
        self.graft_sent_at[peer] = now

    def take_graft_sent(self, peer: PeerId) -> float | None:
        sent = self.graft_sent_at
        return None if sent is None else sent.pop(peer, None)

    def make_eager(self, peer: PeerId) -> bool:
        """Lazy -> eager; False when the peer was not lazy here."""
        if peer not in self.lazy:
            return False
        del self.lazy[peer]
        self.eager[peer] = None
        return True

    def make_lazy(self, peer: PeerId) -> bool:
        """Eager -> lazy; False when the peer was not eager here."""
        if peer not in self.eager:
            return False
        del self.eager[peer]
        self.lazy[peer] = None
        return True

    def drop(self, peer: PeerId) -> tuple[bool, float | None]:
        """The link went down: (was it eager, when it last fed us first)."""
        was_eager = peer in self.eager
        self.eager.pop(peer, None)
        self.lazy.pop(peer, None)
        for table in (self.grafted_at, self.graft_sent_at, self.pruned_at):
            if table is not None:
                table.pop(peer, None)
        return was_eager, self.first_from.pop(peer, None)

    def has_parent(self) -> bool:
        """Does an eager neighbour send us this stream first (has it ever)?"""
        first_from = self.first_from
        return any(p in first_from for p in self.eager)

    def only_parent(self, peer: PeerId) -> bool:
        """Has `peer` sent us this stream first, and no other eager neighbour ever?"""
        first_from = self.first_from
        return peer in first_from and not any(p != peer and p in first_from for p in self.eager)

    def still_fed(self, lost_at: float | None) -> bool:
        """Does a remaining eager peer send us this stream first, at least as lately as a
        lost neighbour did (`lost_at`: when it last did; None: never)?"""
        first_from = self.first_from
        return any(
            (t := first_from.get(p)) is not None and (lost_at is None or t >= lost_at)
            for p in self.eager
        )

    def fed_first(self, peer: PeerId, now: float) -> None:
        """`peer` sent us a message of this stream first: our latest parent, kept last."""
        first_from = self.first_from
        first_from.pop(peer, None)
        first_from[peer] = now


class Trees:
    """The delivery trees of one topic: `shared` and at most `cap` streams' own."""

    __slots__ = ("_latest", "by_stream", "cap", "shared")

    def __init__(self, cap: int) -> None:
        if cap < 0:
            raise ValueError(f"max_stream_trees must be >= 0, not {cap!r}")
        self.cap = cap
        self.shared = Tree({}, {})
        # publisher -> its tree, least recently used first.
        self.by_stream: OrderedDict[PeerId, Tree] = OrderedDict()
        # The last key of `by_stream` when it was last ordered here (None: none yet): a
        # stream's messages come in runs, and the run's tree needs no reordering.
        self._latest: PeerId | None = None

    def get(self, publisher: PeerId) -> Tree:
        """`publisher`'s tree, made from `shared` if it has none (dropping the least
        recently used past the cap); it becomes the most recently used."""
        if not self.cap:
            return self.shared
        by_stream = self.by_stream
        tree = by_stream.get(publisher)
        if tree is None:
            tree = by_stream[publisher] = self.shared.copy_sets()
            if len(by_stream) > self.cap:
                by_stream.popitem(last=False)
            self._latest = publisher
        elif publisher != self._latest:
            by_stream.move_to_end(publisher)
            self._latest = publisher
        return tree

    def peek(self, publisher: PeerId) -> Tree:
        """`publisher`'s tree if it has one, else `shared`; changes nothing."""
        return self.by_stream.get(publisher, self.shared)

    def __iter__(self) -> Iterator[tuple[PeerId | None, Tree]]:
        """(publisher, tree) for every tree, `shared` first with publisher None."""
        yield None, self.shared
        yield from self.by_stream.items()

    def __len__(self) -> int:
        """Streams with a tree of their own."""
        return len(self.by_stream)
