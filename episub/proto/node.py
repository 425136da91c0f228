"""NodeState: the sans-IO core of one episub node, many topics over one peer table.

Being written; the interface below is fixed (the simulator and runtime code against it).
"""

from __future__ import annotations

from typing import Protocol

from episub.proto.config import NodeConfig
from episub.proto.events import InEvent, OutEvent
from episub.proto.messages import LinkKind, PeerId


class Rng(Protocol):
    """What the core needs of a random number generator (a `random.Random` fits)."""

    def random(self) -> float: ...
    def randrange(self, stop: int, /) -> int: ...
    def getrandbits(self, k: int, /) -> int: ...


class NodeState:
    def __init__(self, peer_id: PeerId, config: NodeConfig, rng: Rng) -> None:
        raise NotImplementedError

    def handle(self, event: InEvent, now: float) -> list[OutEvent]:
        """The one way in. Returns what the caller must carry out, in order."""
        raise NotImplementedError

    # queries: no side effects
    def topics(self) -> list[str]: ...
    def active_view(self, topic: str) -> dict[PeerId, LinkKind]: ...
    def passive_view(self, topic: str) -> list[PeerId]: ...
    def eager_peers(self, topic: str) -> list[PeerId]: ...
    def lazy_peers(self, topic: str) -> list[PeerId]: ...
    def rtt(self, peer: PeerId) -> float | None: ...
    def stats(self) -> dict[str, int]: ...
