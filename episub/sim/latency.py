"""Latency models: the one-way delay of every link in a simulated network.

A link's latency is a pure function of (seed, min(a, b), max(a, b)): it is symmetric, it
is the same on every call, and it does not depend on what the protocol did before. Two
runs with the same seed therefore see the same network even when the protocol behaves
differently, which is what the proximity on/off comparison needs. Nothing here draws
from a stateful RNG; uniform values come from `seeds.unit`, a hash of the link.

Models (all delays in seconds):

- `constant`: every link has the same latency.
- `uniform`: each link uniform in [low, high]; the default network, 10-100 ms, spans
  a LAN-to-intercontinental mix like the HyParView and Plumtree evaluations.
- `zones`: nodes in K zones (round-robin by id); intra-zone links 0.2-1 ms (a data
  centre), inter-zone links 20-40 ms (between regions). It has `zone_of`.
- `coords`: each node a uniform point in the unit square; latency proportional to
  distance, 100 ms across one side, plus a 0.1 ms floor (a switch hop).
"""

from __future__ import annotations

import math
from typing import Protocol

from episub.sim.seeds import STREAM_COORDS, STREAM_LATENCY, derive, unit

MODELS = ("constant", "uniform", "zones", "coords")


class LatencyModel(Protocol):
    """What the engine and the metrics need from a network model."""

    name: str
    has_zones: bool

    def one_way(self, a: int, b: int) -> float:
        """One-way latency of the link a-b in seconds; one_way(a, b) == one_way(b, a)."""
        ...

    def zone_of(self, node: int) -> int | None:
        """The node's zone, or None when the model has no zones."""
        ...


class ConstantLatency:
    name = "constant"
    has_zones = False

    def __init__(self, latency: float) -> None:
        if not latency > 0:
            raise ValueError(f"latency must be > 0 seconds, not {latency!r}")
        self.latency = latency

    def one_way(self, a: int, b: int) -> float:
        return self.latency

    def zone_of(self, node: int) -> int | None:
        return None


class UniformLatency:
    name = "uniform"
    has_zones = False

    def __init__(self, seed: int, low: float = 0.010, high: float = 0.100) -> None:
        # 10-100 ms: the brief's default; close to PlanetLab-style wide-area spreads.
        if not 0 < low <= high:
            raise ValueError(f"need 0 < low <= high, not {low!r}, {high!r}")
        self._seed = derive(seed, STREAM_LATENCY)
        self.low = low
        self.span = high - low

    def one_way(self, a: int, b: int) -> float:
        if a > b:
            a, b = b, a
        return self.low + self.span * unit(self._seed, a, b)

    def zone_of(self, node: int) -> int | None:
        return None


class ZonesLatency:
    name = "zones"
    has_zones = True

    def __init__(
        self,
        seed: int,
        zones: int,
        intra: tuple[float, float] = (0.0002, 0.001),  # 0.2-1 ms: within a data centre
        inter: tuple[float, float] = (0.020, 0.040),  # 20-40 ms: between regions
    ) -> None:
        if zones < 1:
            raise ValueError(f"zones must be >= 1, not {zones!r}")
        self._seed = derive(seed, STREAM_LATENCY)
        self.zones = zones
        self.intra = intra
        self.inter = inter

    def zone_of(self, node: int) -> int | None:
        # Round-robin by id: every zone gets the same share of the initial nodes, and
        # churn replacements (fresh consecutive ids) keep the shares balanced.
        return node % self.zones

    def one_way(self, a: int, b: int) -> float:
        if a > b:
            a, b = b, a
        low, high = self.intra if a % self.zones == b % self.zones else self.inter
        return low + (high - low) * unit(self._seed, a, b)


class CoordsLatency:
    name = "coords"
    has_zones = False

    def __init__(self, seed: int, side: float = 0.100, floor: float = 0.0001) -> None:
        # side: 100 ms across the square, a continent; floor: 0.1 ms, one switch hop.
        self._seed = derive(seed, STREAM_COORDS)
        self.side = side
        self.floor = floor
        self._points: dict[int, tuple[float, float]] = {}

    def point(self, node: int) -> tuple[float, float]:
        """The node's position: a pure function of the seed, cached for speed."""
        p = self._points.get(node)
        if p is None:
            p = (unit(self._seed, node, 0), unit(self._seed, node, 1))
            self._points[node] = p
        return p

    def one_way(self, a: int, b: int) -> float:
        xa, ya = self.point(a)
        xb, yb = self.point(b)
        return self.floor + self.side * math.hypot(xa - xb, ya - yb)

    def zone_of(self, node: int) -> int | None:
        return None


def make_latency(name: str, seed: int, *, latency_ms: float = 50.0, zones: int = 4) -> LatencyModel:
    """Build a model by name (the `--latency` choices)."""
    if name == "constant":
        return ConstantLatency(latency_ms / 1000.0)
    if name == "uniform":
        return UniformLatency(seed)
    if name == "zones":
        return ZonesLatency(seed, zones)
    if name == "coords":
        return CoordsLatency(seed)
    raise ValueError(f"latency model must be one of {', '.join(MODELS)}, not {name!r}")
