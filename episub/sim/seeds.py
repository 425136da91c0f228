"""Seed derivation: every random choice in a simulation is a pure function of `--seed`.

The simulator keeps several independent streams (link latencies, node RNGs, message
loss, scenario choices) so that a change in one does not shift the others: the latency
of a link must be the same whether or not proximity is on, and drawing a loss decision
must not change which node crashes. Each stream is named by a small integer tag mixed
into the seed with SplitMix64's finaliser (Steele et al., OOPSLA 2014), which is fast in
Python and passes BigCrush as a hash of consecutive integers.
"""

from __future__ import annotations

_MASK = (1 << 64) - 1
_TWO_TO_64 = float(1 << 64)

# Stream tags: arbitrary distinct integers, fixed forever so that results stay comparable.
STREAM_LATENCY = 1
STREAM_NODE = 2
STREAM_LOSS = 3
STREAM_SCENARIO = 4
STREAM_COORDS = 5
STREAM_FAULT = 6  # fault injection's drop decisions (episub.sim.faults)


def mix64(x: int) -> int:
    """SplitMix64's output function: a bijection on 64-bit integers with good avalanche."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def derive(seed: int, *parts: int) -> int:
    """A 64-bit value determined by `seed` and `parts` (order matters)."""
    h = mix64(seed & _MASK)
    for part in parts:
        h = mix64(h ^ (part & _MASK))
    return h


def unit(seed: int, *parts: int) -> float:
    """A float uniform in [0, 1), determined by `seed` and `parts`."""
    return derive(seed, *parts) / _TWO_TO_64
