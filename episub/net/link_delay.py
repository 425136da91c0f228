"""Link-delay emulation, for tests and demos on one machine (there is no netem here).

A `LinkDelay` is `f(my_id, peer_id) -> seconds`: the runtime holds every frame it sends to
`peer_id` back by that long, in order, so RTTs between nodes on 127.0.0.1 look like the
network the function describes, and GoCast's near links have something to find.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from episub.net.peer_id import PeerIdError, parse_peer_id

__all__ = ["LinkDelay", "zones_link_delay"]

LinkDelay = Callable[[bytes, bytes], float]


def zones_link_delay(zone_of: Mapping[str, str], intra: float, inter: float) -> LinkDelay:
    """One-way delay `intra` seconds inside a zone and `inter` between zones.

    `zone_of` maps "host:port" (as in the peer id) to a zone name. It is read on every call,
    so it may be filled after the nodes are started and their ports known. An address
    missing from it counts as a zone of its own (so `inter` applies): an unknown peer is
    taken to be far rather than near.
    """
    for name, value in (("intra", intra), ("inter", inter)):
        if not value >= 0:
            raise ValueError(f"{name} must be >= 0 seconds, not {value!r}")

    def zone(peer_id: bytes) -> str | None:
        try:
            return zone_of.get(str(parse_peer_id(peer_id)))
        except PeerIdError:
            return None

    def delay(my_id: bytes, peer_id: bytes) -> float:
        mine, theirs = zone(my_id), zone(peer_id)
        return intra if mine is not None and mine == theirs else inter

    return delay
