"""Scenarios: what happens to a simulated overlay, phase by phase, and the report of it.

Every scenario uses one topic (`TOPIC`) and starts the same way:

1. Join: node 0 starts the overlay; node i joins at i / join_rate through a node drawn
   uniformly from 0..i-1 (all already joined and alive). join_rate defaults to N / 20
   per simulated second, kept within 100..500: 10,000 nodes join in 20 s, 1,000 in
   10 s, 200 in 2 s (guess: fast enough to keep big runs short, slow enough that a
   contact has usually finished its own JOIN walk before others arrive through it).
2. Settle: `settle` seconds of nothing but the protocol's own stabilisation, shuffles
   and proximity optimisation.
3. Warm-up: `warmup` messages, one every `interval`, that build the Plumtree tree and
   are not measured.

Then, per scenario:

- steady: one sender (drawn from the seed) publishes `messages` counted messages.
- multi-sender: `senders` senders publish them round-robin.
- crash: a `fraction` of the nodes (never the sender) crash at once; probes every
  `probe_interval` for `settle_after` seconds measure heal_seconds; then the counted
  messages. Reliability is over the survivors.
- churn: for `duration` seconds, rate * N nodes per second depart (alternately a
  graceful LeaveTopic, the node removed `LEAVE_LINGER` later, and a crash), each
  replaced by a fresh node joining through a random live node. Counted messages are
  published every `interval` from the start of the churn; a (message, node) pair counts
  only if the node had joined before the publish and stayed until publish + `lifetime`.
- partition: two random halves are cut apart for `partition_seconds`, then healed;
  probes measure heal_seconds from the heal; then the counted messages.
- proximity: steady twice on the same network and seed, with GoCast's proximity links
  on and off (default latency model `coords`; `zones` when `--zones` is given).

Finally a drain: the simulation runs until every live node holds every counted message,
or broadcast traffic (GOSSIP, IHAVE, GRAFT, PULL) has stood still for `QUIET_SECONDS`,
or `max_drain` seconds have passed since the last publish.
"""

from __future__ import annotations

import dataclasses
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from episub.proto.config import BroadcastConfig, MembershipConfig, NodeConfig
from episub.proto.events import JoinTopic, LeaveTopic, Publish
from episub.sim.engine import Simulator
from episub.sim.latency import MODELS, LatencyModel, make_latency
from episub.sim.metrics import COUNTED, PROBE, WARMUP, payload_for, summarize
from episub.sim.seeds import STREAM_SCENARIO, derive

TOPIC = "t"
SCENARIOS = ("steady", "multi-sender", "crash", "churn", "partition", "proximity")

JOIN_RATE_PER_NODE = 1 / 20  # joins per second per node of the target size (see above)
JOIN_RATE_MIN = 100.0
JOIN_RATE_MAX = 500.0
LEAVE_LINGER = 1.0  # guess: a leaver lingers 1 s after LeaveTopic, time to flush its LEAVEs
DEFAULT_ZONES = 4  # guess: a handful of regions, as in a multi-region deployment
STEP = 1.0  # simulated seconds between progress updates
DRAIN_STEP = 0.5  # simulated seconds between drain checks
_broadcast = BroadcastConfig()
# Twice the longest wait the broadcast layer takes before acting on a gap or an IHAVE:
# if nothing moved for that long, nothing will.
QUIET_SECONDS = 2 * max(
    _broadcast.gap_timeout, _broadcast.ihave_interval + _broadcast.missing_check_interval
)


@dataclass(frozen=True, kw_only=True)
class SimParams:
    """Everything that determines a run; the CLI's defaults are these."""

    scenario: str = "steady"
    nodes: int = 1000  # guess: big enough for log(N)-deep trees, a few seconds to run
    messages: int = 100  # guess: enough for stable percentiles (p99 of ~100 x N deliveries)
    warmup: int = 10  # guess: a handful of messages are enough for Plumtree's tree to form
    seed: int = 1
    interval: float = 0.2  # brief: one message every 0.2 s
    settle: float = 30.0  # guess: ~15 stabilisation and 6 optimisation rounds of the defaults
    latency: str | None = None  # None: uniform (coords for proximity; zones if zones given)
    latency_ms: float = 50.0  # constant model: the mean of the uniform default's 10-100 ms
    zones: int | None = None  # None: DEFAULT_ZONES when the zones model is used
    loss: float = 0.0
    hop_cost_ms: float = 0.0  # per-hop processing time added to every delivery
    join_rate: float | None = None  # None: N / 20 within 100..500 joins per second
    senders: int = 4  # multi-sender; guess: a few producers, as in a Spark job's executors
    fraction: float = 0.2  # crash; guess: HyParView's experiments range from 10% to 95%
    settle_after: float = 10.0  # crash/partition: probing time before the counted messages
    rate: float = 0.01  # churn: 1% of the nodes replaced per second (guess)
    duration: float = 20.0  # churn: = messages * interval of the defaults
    lifetime: float = 10.0  # churn: how long a node must stay to be held to a message
    partition_seconds: float = 10.0  # partition: how long the cut lasts
    probe_interval: float = 0.5  # brief: a probe every 0.5 s
    probe_deadline: float = 2.0  # guess: a few tree depths, IHAVE/GRAFT repair included
    max_drain: float = 30.0  # brief: drain bounded by 30 s

    def __post_init__(self) -> None:
        if self.scenario not in SCENARIOS:
            raise ValueError(
                f"scenario must be one of {', '.join(SCENARIOS)}, not {self.scenario!r}"
            )
        if self.latency is not None and self.latency not in MODELS:
            raise ValueError(f"latency must be one of {', '.join(MODELS)}, not {self.latency!r}")
        if self.nodes < 2:
            raise ValueError(f"nodes must be >= 2, not {self.nodes}")
        if self.messages < 1 or self.warmup < 0:
            raise ValueError("messages must be >= 1 and warmup >= 0")
        if not 1 <= self.senders <= self.nodes:
            raise ValueError(f"senders must be in 1..nodes, not {self.senders}")
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
        for name in (
            "settle",
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

    @property
    def latency_model(self) -> str:
        if self.latency is not None:
            return self.latency
        if self.zones is not None:
            return "zones"
        return "coords" if self.scenario == "proximity" else "uniform"

    @property
    def effective_join_rate(self) -> float:
        if self.join_rate is not None:
            return self.join_rate
        return min(JOIN_RATE_MAX, max(JOIN_RATE_MIN, self.nodes * JOIN_RATE_PER_NODE))


def membership_config(proximity: bool) -> MembershipConfig:
    """MembershipConfig with GoCast's proximity links on or off.

    Uses the config's `proximity` field when it has one; without it, "off" is
    approximated by making every link random (c_near = 0, same active view size).
    """
    fields = {f.name for f in dataclasses.fields(MembershipConfig)}
    if "proximity" in fields:
        return MembershipConfig(proximity=proximity)  # type: ignore[call-arg]
    if proximity:
        return MembershipConfig()
    base = MembershipConfig()
    return MembershipConfig(c_rand=base.c_rand + base.c_near, c_near=0)


class Progress:
    """A tqdm bar over simulated seconds, or nothing."""

    def __init__(self, enabled: bool, total: float, desc: str) -> None:
        self._bar = None
        self._shown = 0.0
        if enabled:
            from tqdm import tqdm

            self._bar = tqdm(total=round(total, 1), unit="sim s", desc=desc, leave=False)

    def show(self, now: float) -> None:
        if self._bar is not None and now > self._shown:
            step = round(now - self._shown, 1)
            if step > 0:
                self._bar.update(step)
                self._shown += step

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


class ScenarioRun:
    """One simulation: builds the network, drives the phases, reports the metrics."""

    def __init__(
        self,
        params: SimParams,
        *,
        proximity: bool = True,
        node_factory: Callable[[int, random.Random], Any] | None = None,
    ) -> None:
        self.p = params
        self.latency: LatencyModel = make_latency(
            params.latency_model,
            params.seed,
            latency_ms=params.latency_ms,
            zones=params.zones or DEFAULT_ZONES,
        )
        if node_factory is None:
            from episub.proto.node import NodeState

            config = NodeConfig(membership=membership_config(proximity))

            def node_factory(peer: int, rng: random.Random) -> Any:
                return NodeState(peer, config, rng)

        self.sim = Simulator(
            latency=self.latency,
            seed=params.seed,
            node_factory=node_factory,
            loss=params.loss,
            hop_cost=params.hop_cost_ms / 1000.0,
            probe_deadline=params.probe_deadline,
        )
        self.rng = random.Random(derive(params.seed, STREAM_SCENARIO))
        self.members: list[int] = []  # alive and not leaving: contacts and victims
        self._slot: dict[int, int] = {}
        self.next_id = 0
        self.senders: list[int] = []
        self.heal_since: float | None = None
        self._progress: Progress | None = None

    # -- membership bookkeeping (a list with O(1) removal, so choices stay reproducible) ----

    def _add_member(self, node: int) -> None:
        self._slot[node] = len(self.members)
        self.members.append(node)

    def _remove_member(self, node: int) -> None:
        i = self._slot.pop(node)
        last = self.members.pop()
        if last != node:
            self.members[i] = last
            self._slot[last] = i

    def live(self) -> list[int]:
        """Nodes alive and subscribed, by id."""
        departed = self.sim.departed
        return sorted(node for node in self.sim.nodes if node not in departed)

    # -- phases ----------------------------------------------------------------------------

    def advance(self, until: float) -> None:
        sim = self.sim
        while sim.now < until:
            sim.run(min(until, sim.now + STEP))
            if self._progress is not None:
                self._progress.show(sim.now)

    def bootstrap(self) -> float:
        """Join every initial node, let the overlay settle; returns the time it is done."""
        p, sim, rng = self.p, self.sim, self.rng
        rate = p.effective_join_rate
        for node in range(p.nodes):
            sim.add_node(node)
            contacts = (rng.randrange(node),) if node else ()
            sim.input(node, JoinTopic(TOPIC, contacts), at=node / rate)
            self._add_member(node)
        self.next_id = p.nodes
        done = (p.nodes - 1) / rate + p.settle
        self.advance(done)
        return done

    def pick_senders(self, count: int) -> list[int]:
        self.senders = sorted(self.rng.sample(range(self.p.nodes), count))
        return self.senders

    def publish_series(self, kind: str, count: int, start: float, every: float) -> float:
        """Queue `count` publishes round-robin over the senders; returns the time after."""
        senders = self.senders
        for i in range(count):
            payload = payload_for(kind, i)
            self.sim.input(senders[i % len(senders)], Publish(TOPIC, payload), at=start + i * every)
        return start + count * every

    def warmup(self, start: float) -> float:
        return self.publish_series(WARMUP, self.p.warmup, start, self.p.interval)

    def counted(self, start: float) -> float:
        return self.publish_series(COUNTED, self.p.messages, start, self.p.interval)

    def probes(self, start: float) -> float:
        p = self.p
        count = max(1, math.ceil(p.settle_after / p.probe_interval))
        self.publish_series(PROBE, count, start, p.probe_interval)
        return start + p.settle_after

    def drain(self, last_publish: float) -> None:
        """Run on until the counted messages are everywhere or traffic stood still."""
        sim, metrics = self.sim, self.sim.metrics
        self.advance(last_publish)
        deadline = last_publish + self.p.max_drain
        sends = metrics.broadcast_sends()
        quiet_since = sim.now
        while sim.now < deadline:
            sim.run(min(deadline, sim.now + DRAIN_STEP))
            if self._progress is not None:
                self._progress.show(sim.now)
            if metrics.counted_complete(self.live()):
                return
            now_sends = metrics.broadcast_sends()
            if now_sends != sends:
                sends, quiet_since = now_sends, sim.now
            elif sim.now - quiet_since >= QUIET_SECONDS:
                return

    def crash_now(self, victims: list[int]) -> None:
        for node in victims:
            self._remove_member(node)
            self.sim.crash(node)

    def churn_step(self, graceful: bool) -> None:
        sim, rng = self.sim, self.rng
        senders = self.senders
        victim = self.members[rng.randrange(len(self.members))]
        while victim in senders:
            victim = self.members[rng.randrange(len(self.members))]
        self._remove_member(victim)
        if graceful:
            sim.departed[victim] = sim.now
            sim.input(victim, LeaveTopic(TOPIC))
            sim.call_at(sim.now + LEAVE_LINGER, lambda: sim.crash(victim))
        else:
            sim.crash(victim)
        newcomer = self.next_id
        self.next_id += 1
        sim.add_node(newcomer)
        contact = self.members[rng.randrange(len(self.members))]
        sim.input(newcomer, JoinTopic(TOPIC, (contact,)))
        self._add_member(newcomer)

    # -- the scenarios ---------------------------------------------------------------------

    def planned_end(self) -> float:
        """Roughly when the counted messages end, for the progress bar."""
        p = self.p
        end = (p.nodes - 1) / p.effective_join_rate + p.settle
        end += (p.warmup + p.messages) * p.interval
        if p.scenario == "crash":
            end += p.settle_after
        elif p.scenario == "partition":
            end += p.partition_seconds + p.settle_after
        elif p.scenario == "churn":
            end = max(end, end - p.messages * p.interval + p.duration)
        return end + 2 * QUIET_SECONDS

    def execute(self, progress: bool = False, desc: str | None = None) -> dict[str, Any]:
        """Run the scenario to its end and return its metrics."""
        p = self.p
        self._progress = Progress(progress, self.planned_end(), desc or p.scenario)
        try:
            getattr(self, "_" + p.scenario.replace("-", "_"))()
        finally:
            self._progress.close()
        return self.report()

    def _steady(self) -> None:
        start = self.bootstrap()
        self.pick_senders(1)
        self.drain(self.counted(self.warmup(start)) - self.p.interval)

    _proximity = _steady

    def _multi_sender(self) -> None:
        start = self.bootstrap()
        self.pick_senders(self.p.senders)
        self.drain(self.counted(self.warmup(start)) - self.p.interval)

    def _crash(self) -> None:
        p = self.p
        start = self.bootstrap()
        self.pick_senders(1)
        at = self.warmup(start)
        candidates = [node for node in range(p.nodes) if node not in self.senders]
        victims = sorted(self.rng.sample(candidates, round(p.fraction * p.nodes)))
        self.sim.call_at(at, lambda: self.crash_now(victims))
        self.heal_since = at
        self.drain(self.counted(self.probes(at)) - p.interval)

    def _partition(self) -> None:
        p, sim = self.p, self.sim
        start = self.bootstrap()
        self.pick_senders(1)
        at = self.warmup(start)
        sides = bytearray(p.nodes)
        for node in self.rng.sample(range(p.nodes), p.nodes // 2):
            sides[node] = 1
        sim.call_at(at, lambda: sim.partition(sides))
        healed = at + p.partition_seconds
        sim.call_at(healed, sim.heal)
        self.heal_since = healed
        self.drain(self.counted(self.probes(healed)) - p.interval)

    def _churn(self) -> None:
        p, sim = self.p, self.sim
        start = self.bootstrap()
        self.pick_senders(1)
        at = self.warmup(start)
        steps = round(p.rate * p.nodes * p.duration)
        for k in range(steps):
            graceful = k % 2 == 0
            sim.call_at(at + k * p.duration / steps, lambda g=graceful: self.churn_step(g))
        last = self.counted(at) - p.interval
        self.drain(max(last, at + p.duration))

    # -- the report ------------------------------------------------------------------------

    def report(self) -> dict[str, Any]:
        sim, p = self.sim, self.p
        live = self.live()
        views = {}
        passive = {}
        for node in live:
            state: Any = sim.nodes[node]
            views[node] = list(state.active_view(TOPIC))
            passive[node] = len(state.passive_view(TOPIC))
        metrics = summarize(
            sim.metrics,
            live=live,
            departed=sim.departed,
            lifetime=p.lifetime if p.scenario == "churn" else math.inf,
            active_views=views,
            passive_sizes=passive,
            heal_since=self.heal_since,
        )
        metrics["events"] = sim.events
        metrics["sim_seconds"] = round(sim.now, 6)
        metrics["senders"] = list(self.senders)
        return metrics


def run(params: SimParams, *, progress: bool = False, timing: bool = True) -> dict[str, Any]:
    """Run `params.scenario` and return the report (one JSON-ready dict)."""
    header: dict[str, Any] = {
        "scenario": params.scenario,
        "seed": params.seed,
        "nodes": params.nodes,
        "messages": params.messages,
        "warmup": params.warmup,
        "latency": params.latency_model,
        "zones": (params.zones or DEFAULT_ZONES) if params.latency_model == "zones" else None,
        "loss": params.loss,
        "hop_cost_ms": params.hop_cost_ms,
        "interval": params.interval,
        "join_rate": params.effective_join_rate,
    }
    if params.scenario == "proximity":
        total_start = time.perf_counter()
        for key, on in (("proximity_on", True), ("proximity_off", False)):
            header[key] = _timed(ScenarioRun(params, proximity=on), progress, key, timing)
        if timing:
            header["wall_seconds"] = round(time.perf_counter() - total_start, 3)
        return header
    header.update(_timed(ScenarioRun(params), progress, params.scenario, timing))
    return header


def _timed(scenario: ScenarioRun, progress: bool, desc: str, timing: bool) -> dict[str, Any]:
    started = time.perf_counter()
    report = scenario.execute(progress, desc)
    wall = time.perf_counter() - started
    if timing:
        report["wall_seconds"] = round(wall, 3)
        report["events_per_second"] = round(scenario.sim.events / wall) if wall > 0 else None
    return report
