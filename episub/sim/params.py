"""What determines a simulation run: the scenario's parameters and their defaults.

The command line takes its defaults from `SimParams`, so each default is written, and
explained, once. Two runs with equal `SimParams` produce equal reports.
"""

from __future__ import annotations

from dataclasses import dataclass

from episub.proto.config import BroadcastConfig, MembershipConfig
from episub.sim.faults import MESSAGE_KINDS, OneWayPartition, parse_delay, parse_drop
from episub.sim.latency import MODELS

SCENARIOS = ("steady", "multi-sender", "crash", "churn", "partition", "proximity")

# The join phase admits N / 20 nodes per simulated second, kept within 100..500: 10,000
# nodes join in 20 s, 1,000 in 10 s, 200 in 2 s. Guess: fast enough to keep big runs
# short, slow enough that a contact has mostly finished its own JOIN walk (6 hops of at
# most 100 ms) before many others arrive through it.
JOIN_RATE_PER_NODE = 1 / 20
JOIN_RATE_MIN = 100.0
JOIN_RATE_MAX = 500.0
DEFAULT_SENDERS = 4  # multi-sender's publishers; see SimParams.senders
DEFAULT_ZONES = 4  # guess: a handful of regions, as in a multi-region deployment
DEFAULT_SETTLE = 30.0  # seconds; see SimParams.settle
PROXIMITY_SETTLE = 90.0  # seconds; see SimParams.settle


@dataclass(frozen=True, kw_only=True)
class SimParams:
    """Everything that determines a run; the CLI's defaults are these."""

    scenario: str = "steady"
    nodes: int = 1000  # guess: big enough for log(N)-deep trees, a few seconds to run
    # guess: p99 over 50 x N deliveries is stable, and 10,000 nodes stay within minutes
    # (IHAVEs to the lazy peers make each message cost ~8 events per node)
    messages: int = 50
    warmup: int = 10  # guess: a handful of messages are enough for Plumtree's tree to form
    seed: int = 1
    interval: float = 0.2  # brief: one message every 0.2 s
    # None: 30 s (guess: ~15 stabilisation and 6 optimisation rounds), or 90 s for the
    # proximity scenario, whose near links converge over ~18 optimisation rounds
    # (docs/simulation.md shows 30 s leaves it half-way).
    settle: float | None = None
    latency: str | None = None  # None: uniform (coords for proximity; zones if zones given)
    latency_ms: float = 50.0  # constant model: the mean of the uniform default's 10-100 ms
    zones: int | None = None  # None: DEFAULT_ZONES when the zones model is used
    loss: float = 0.0
    hop_cost_ms: float = 0.0  # per-hop processing time added to every delivery
    join_rate: float | None = None  # None: N / 20 within 100..500 joins per second
    # Publishers, round-robin. None: 4 for multi-sender (guess: a few producers, as in a
    # Spark job's executors), 1 for every other scenario; steady is always one.
    senders: int | None = None
    # One sender's runs (steady, and the others with one sender): publish from this node
    # instead of the one the seed draws; every other draw stays the same, so the runs of
    # a multi-sender run's senders, each alone, see its overlay (benchmarks/sender_baseline.py).
    sender: int | None = None
    fraction: float = 0.2  # crash; guess: HyParView's experiments range from 10% to 95%
    settle_after: float = 10.0  # crash/partition: probing time before the counted messages
    rate: float = 0.01  # churn: 1% of the nodes replaced per second (guess)
    duration: float = 10.0  # churn: = messages * interval of the defaults
    lifetime: float = 10.0  # churn: how long a node must stay to be held to a message
    partition_seconds: float = 10.0  # partition: how long the cut lasts
    probe_interval: float = 0.5  # brief: a probe every 0.5 s
    probe_deadline: float = 2.0  # guess: a few tree depths, IHAVE/GRAFT repair included
    max_drain: float = 30.0  # brief: drain bounded by 30 s
    # Fault injection (episub.sim.faults); none by default.
    drop: tuple[tuple[str, float], ...] = ()  # (message kind, probability a send is dropped)
    delay: tuple[tuple[str, float], ...] = ()  # (message kind, seconds added to its delay)
    one_way_partition: OneWayPartition | None = None
    # broadcast.py's near parent rule (BroadcastConfig.near_parent_factor); 0: off, the
    # core's default. On only where proximity is (a near parent is a proximity rule).
    near_parent_factor: float = 0.0
    # BroadcastConfig.max_stream_trees: publisher streams with a delivery tree of their
    # own; 0: one tree for every stream (Plumtree's), to compare against.
    stream_trees: int = BroadcastConfig().max_stream_trees
    # broadcast.py's lazy race (BroadcastConfig.race_lazy_hops); 0: off, the core's default.
    race_lazy_hops: int = 0
    # proximity.py's dearer swaps (MembershipConfig.swap_factor_growth); 1: off.
    swap_factor_growth: float = MembershipConfig().swap_factor_growth

    def __post_init__(self) -> None:
        if self.scenario not in SCENARIOS:
            raise ValueError(
                f"scenario must be one of {', '.join(SCENARIOS)}, not {self.scenario!r}"
            )
        if self.latency is not None and self.latency not in MODELS:
            raise ValueError(f"latency must be one of {', '.join(MODELS)}, not {self.latency!r}")
        if not (self.near_parent_factor == 0 or self.near_parent_factor >= 1):
            raise ValueError(
                f"near_parent_factor must be 0 (off) or >= 1, not {self.near_parent_factor}"
            )
        if self.stream_trees < 0:
            raise ValueError(f"stream_trees must be >= 0, not {self.stream_trees}")
        if not self.swap_factor_growth >= 1.0:
            raise ValueError(f"swap_factor_growth must be >= 1, not {self.swap_factor_growth}")
        if self.race_lazy_hops < 0:
            raise ValueError(f"race_lazy_hops must be >= 0, not {self.race_lazy_hops}")
        if self.nodes < 2:
            raise ValueError(f"nodes must be >= 2, not {self.nodes}")
        if self.messages < 1 or self.warmup < 0:
            raise ValueError("messages must be >= 1 and warmup >= 0")
        if self.senders is not None and not 1 <= self.senders <= self.nodes:
            raise ValueError(f"senders must be in 1..nodes, not {self.senders}")
        if self.sender is not None and not 0 <= self.sender < self.nodes:
            raise ValueError(f"sender must be a node, in 0..nodes-1, not {self.sender}")
        if self.sender is not None and self.sender_count != 1:
            raise ValueError("sender names the one sender: give it without senders")
        if self.scenario == "steady" and self.senders not in (None, 1):
            raise ValueError("steady has one sender; multi-sender is steady with several")
        if not 0.0 <= self.fraction < 1.0:
            raise ValueError(f"fraction must be in [0, 1), not {self.fraction}")
        if not 0.0 <= self.loss < 1.0:
            raise ValueError(f"loss must be in [0, 1), not {self.loss}")
        if not 0.0 <= self.rate <= 1.0:
            raise ValueError(f"rate must be in [0, 1], not {self.rate}")
        if self.zones is not None and self.zones < 1:
            raise ValueError(f"zones must be >= 1, not {self.zones}")
        for name in ("interval", "latency_ms", "probe_interval", "probe_deadline"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, not {getattr(self, name)}")
        if self.settle is not None and self.settle < 0:
            raise ValueError(f"settle must be >= 0, not {self.settle}")
        for name in (
            "hop_cost_ms",
            "settle_after",
            "duration",
            "lifetime",
            "partition_seconds",
            "max_drain",
        ):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, not {getattr(self, name)}")
        if self.join_rate is not None and not self.join_rate > 0:
            raise ValueError(f"join_rate must be > 0, not {self.join_rate}")
        for kind, value in self.drop:
            if kind not in MESSAGE_KINDS:
                raise ValueError(f"unknown message kind {kind!r}")
            parse_drop(f"{kind}={value!r}")
        for kind, value in self.delay:
            if kind not in MESSAGE_KINDS:
                raise ValueError(f"unknown message kind {kind!r}")
            parse_delay(f"{kind}={value!r}")
        cut = self.one_way_partition
        last = (self.messages - 1) * self.interval
        if cut is not None and cut.end >= last:
            # Nothing announces a message again once its IHAVE round is over: the far side
            # learns what it missed only from a later message's sequence gap.
            raise ValueError(
                f"one-way partition must end before the last counted message "
                f"({last:g} s after the first), or nothing tells the far side what it "
                f"missed; got END {cut.end:g}"
            )

    def drop_by_class(self) -> dict[type, float]:
        """The engine's form of `drop`: message class -> probability (the last one wins)."""
        return {MESSAGE_KINDS[kind]: p for kind, p in self.drop}

    def delay_by_class(self) -> dict[type, float]:
        return {MESSAGE_KINDS[kind]: s for kind, s in self.delay}

    @property
    def sender_count(self) -> int:
        if self.senders is not None:
            return self.senders
        return DEFAULT_SENDERS if self.scenario == "multi-sender" else 1

    @property
    def latency_model(self) -> str:
        if self.latency is not None:
            return self.latency
        if self.zones is not None:
            return "zones"
        return "coords" if self.scenario == "proximity" else "uniform"

    @property
    def effective_settle(self) -> float:
        if self.settle is not None:
            return self.settle
        return PROXIMITY_SETTLE if self.scenario == "proximity" else DEFAULT_SETTLE

    @property
    def effective_join_rate(self) -> float:
        if self.join_rate is not None:
            return self.join_rate
        return min(JOIN_RATE_MAX, max(JOIN_RATE_MIN, self.nodes * JOIN_RATE_PER_NODE))


def membership_config(
    proximity: bool, swap_factor_growth: float = MembershipConfig().swap_factor_growth
) -> MembershipConfig:
    """The core's defaults with GoCast's proximity links on or off (plain HyParView), and
    each swap dearer by `swap_factor_growth` (1: off)."""
    return MembershipConfig(proximity=proximity, swap_factor_growth=swap_factor_growth)
