"""Scenarios: what happens to a simulated overlay, phase by phase, and the report of it.

Every scenario uses one topic (`TOPIC`) and starts the same way:

1. Join: node 0 starts the overlay; node i joins at i / join_rate through a node drawn
   uniformly from 0..i-1 (all already joined and alive); see `params` for the rate.
2. Settle: `settle` seconds of nothing but the protocol's own stabilisation, shuffles
   and proximity optimisation.
3. Warm-up: `warmup` messages, one every `interval`, that build the Plumtree tree and
   are not measured.

Then, per scenario:

- steady: one sender (drawn from the seed) publishes `messages` counted messages.
- multi-sender: `senders` senders publish them round-robin (crash, churn, partition and
  proximity take `senders` too; steady is one sender).
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
or broadcast traffic (GOSSIP, IHAVE, GRAFT, PULL, HEADS) has stood still for `QUIET_SECONDS`,
or `max_drain` seconds have passed since the last publish; then `SYMMETRY_RECHECK`
seconds more, so that view symmetry can be judged apart from exchanges in flight.
"""

from __future__ import annotations

import functools
import math
import random
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from episub.proto.config import BroadcastConfig, MembershipConfig, NodeConfig
from episub.proto.events import JoinTopic, LeaveTopic, Publish
from episub.proto.store import RetentionConfig
from episub.sim.engine import Simulator
from episub.sim.latency import LatencyModel, make_latency
from episub.sim.metrics import COUNTED, PROBE, WARMUP, asymmetric_pairs, payload_for, summarize
from episub.sim.params import DEFAULT_ZONES, SimParams, membership_config
from episub.sim.seeds import STREAM_SCENARIO, derive
from episub.sim.series import overlay_of, series_of

# The simulated nodes' message stores keep a message's bytes two minutes, for GRAFT and
# PULL answers (nothing reads history by range there), so a thousand nodes' memory stays
# within what a run needs.
SIM_STORE = RetentionConfig(max_age=120.0)

TOPIC = "t"
LEAVE_LINGER = 1.0  # guess: a leaver lingers 1 s after LeaveTopic, time to flush its LEAVEs
STEP = 1.0  # simulated seconds between progress updates
DRAIN_STEP = 0.5  # simulated seconds between drain checks
_broadcast = BroadcastConfig()
_membership = MembershipConfig()
# How long after the drain the run goes on before views are judged: one ping round (a
# PONG saying "not a neighbour" is how a link left one-sided by a lost message is found
# and ended), plus a NEIGHBOR request's timeout and a round trip, so nothing is still in
# flight.
_membership = MembershipConfig()
SYMMETRY_RECHECK = _membership.ping_interval + _membership.neighbor_request_timeout + 1.0
# Twice the longest wait the broadcast layer takes before acting on a gap or an IHAVE:
# if nothing moved for that long, nothing will.
QUIET_SECONDS = 2 * max(
    _broadcast.gap_timeout,
    _broadcast.ihave_interval + _broadcast.missing_check_interval,
    _broadcast.heads_quiet,
)


class Progress:
    """A tqdm bar over simulated seconds, or nothing."""

    def __init__(self, enabled: bool, total: float, desc: str, position: int = 0) -> None:
        self._bar = None
        self._shown = 0.0
        if enabled:
            from tqdm import tqdm

            self._bar = tqdm(
                total=round(total, 1), unit="sim s", desc=desc, leave=False, position=position
            )

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

            config = NodeConfig(
                membership=membership_config(proximity, params.swap_factor_growth),
                broadcast=BroadcastConfig(
                    near_parent_factor=params.near_parent_factor,
                    max_stream_trees=params.stream_trees,
                    race_lazy_hops=params.race_lazy_hops,
                ),
            )

            def node_factory(peer: int, rng: random.Random) -> Any:
                return NodeState(peer, config, rng, retention=SIM_STORE)

        self.sim = Simulator(
            latency=self.latency,
            seed=params.seed,
            node_factory=node_factory,
            loss=params.loss,
            hop_cost=params.hop_cost_ms / 1000.0,
            probe_deadline=params.probe_deadline,
            drop=params.drop_by_class(),
            delay=params.delay_by_class(),
        )
        self.rng = random.Random(derive(params.seed, STREAM_SCENARIO))
        self.members: list[int] = []  # alive and not leaving: contacts and victims
        self._slot: dict[int, int] = {}
        self.next_id = 0
        self.senders: list[int] = []
        self.heal_since: float | None = None
        self.earlier_asymmetric: set[tuple[int, int]] = set()
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
        done = (p.nodes - 1) / rate + p.effective_settle
        self.advance(done)
        return done

    def pick_senders(self, count: int) -> list[int]:
        drawn = sorted(self.rng.sample(range(self.p.nodes), count))
        # The draw is made either way, so that naming the sender changes nothing else.
        self.senders = drawn if self.p.sender is None else [self.p.sender]
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
        self.schedule_one_way_partition(start)
        return self.publish_series(COUNTED, self.p.messages, start, self.p.interval)

    def schedule_one_way_partition(self, start: float) -> None:
        """With `one_way_partition`, cut a random fraction of the nodes (the senders among
        them) off from sending to the rest, `start` + START to `start` + END."""
        cut, p, sim = self.p.one_way_partition, self.p, self.sim
        if cut is None:
            return
        # Room for every node id a run may create; newcomers of churn are on the far side.
        sides = bytearray(p.nodes + round(p.rate * p.nodes * p.duration) + 1)
        others = [node for node in range(p.nodes) if node not in self.senders]
        count = max(0, round(cut.fraction * p.nodes) - len(self.senders))
        for node in [*self.senders, *self.rng.sample(others, min(count, len(others)))]:
            sides[node] = 1
        sim.call_at(start + cut.start, lambda: sim.cut_one_way(sides))
        sim.call_at(start + cut.end, lambda: sim.cut_one_way(None))

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
        end = (p.nodes - 1) / p.effective_join_rate + p.effective_settle
        end += (p.warmup + p.messages) * p.interval
        if p.scenario == "crash":
            end += p.settle_after
        elif p.scenario == "partition":
            end += p.partition_seconds + p.settle_after
        elif p.scenario == "churn":
            end = max(end, end - p.messages * p.interval + p.duration)
        return end + 2 * QUIET_SECONDS

    def execute(
        self, progress: bool = False, desc: str | None = None, position: int = 0
    ) -> dict[str, Any]:
        """Run the scenario to its end and return its metrics."""
        p = self.p
        self._progress = Progress(progress, self.planned_end(), desc or p.scenario, position)
        try:
            getattr(self, "_" + p.scenario.replace("-", "_"))()
            self.recheck_symmetry()
        finally:
            self._progress.close()
        return self.report()

    def _steady(self) -> None:
        start = self.bootstrap()
        self.pick_senders(1)
        self.drain(self.counted(self.warmup(start)) - self.p.interval)

    def _proximity(self) -> None:
        start = self.bootstrap()
        self.pick_senders(self.p.sender_count)
        self.drain(self.counted(self.warmup(start)) - self.p.interval)

    def _multi_sender(self) -> None:
        start = self.bootstrap()
        self.pick_senders(self.p.sender_count)
        self.drain(self.counted(self.warmup(start)) - self.p.interval)

    def _crash(self) -> None:
        p = self.p
        start = self.bootstrap()
        self.pick_senders(p.sender_count)
        at = self.warmup(start)
        candidates = [node for node in range(p.nodes) if node not in self.senders]
        victims = sorted(self.rng.sample(candidates, round(p.fraction * p.nodes)))
        self.sim.call_at(at, lambda: self.crash_now(victims))
        self.heal_since = at
        self.drain(self.counted(self.probes(at)) - p.interval)

    def _partition(self) -> None:
        p, sim = self.p, self.sim
        start = self.bootstrap()
        self.pick_senders(p.sender_count)
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
        self.pick_senders(p.sender_count)
        at = self.warmup(start)
        steps = round(p.rate * p.nodes * p.duration)
        for k in range(steps):
            graceful = k % 2 == 0
            sim.call_at(at + k * p.duration / steps, functools.partial(self.churn_step, graceful))
        last = self.counted(at) - p.interval
        self.drain(max(last, at + p.duration))

    # -- the report ------------------------------------------------------------------------

    def active_views(self, live: list[int]) -> dict[int, list[int]]:
        nodes: Any = self.sim.nodes  # the real core: NodeState has the view queries
        return {node: list(nodes[node].active_view(TOPIC)) for node in live}

    def recheck_symmetry(self) -> None:
        """Note the asymmetric pairs now, then run on so that exchanges in flight finish."""
        live = self.live()
        self.earlier_asymmetric = asymmetric_pairs(live, self.active_views(live))
        self.advance(self.sim.now + SYMMETRY_RECHECK)

    def report(self) -> dict[str, Any]:
        sim, p = self.sim, self.p
        live = self.live()
        views = self.active_views(live)
        nodes: Any = sim.nodes
        passive = {node: len(nodes[node].passive_view(TOPIC)) for node in live}
        metrics = summarize(
            sim.metrics,
            live=live,
            departed=sim.departed,
            lifetime=p.lifetime if p.scenario == "churn" else math.inf,
            active_views=views,
            passive_sizes=passive,
            heal_since=self.heal_since,
            earlier_asymmetric=self.earlier_asymmetric,
        )
        metrics["events"] = sim.events
        metrics["sim_seconds"] = round(sim.now, 6)
        metrics["senders"] = list(self.senders)
        return metrics


def run(
    params: SimParams,
    *,
    progress: bool = False,
    timing: bool = True,
    jobs: int = 1,
    extras: bool = False,
) -> dict[str, Any]:
    """Run `params.scenario` and return the report (one JSON-ready dict).

    `jobs` > 1 lets the proximity scenario run its two simulations in two processes at
    once; each is deterministic on its own, so the report does not depend on it.
    `extras` adds each run's "overlay" and "series" (series.py), for pictures.
    """
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
    if params.sender_count > 1:
        header["sender_count"] = params.sender_count
    if params.near_parent_factor:
        header["near_parent_factor"] = params.near_parent_factor
    if params.race_lazy_hops:
        header["race_lazy_hops"] = params.race_lazy_hops
    if params.swap_factor_growth != _membership.swap_factor_growth:
        header["swap_factor_growth"] = params.swap_factor_growth
    if params.stream_trees != _broadcast.max_stream_trees:
        header["stream_trees"] = params.stream_trees
    if params.drop or params.delay or params.one_way_partition is not None:
        header["faults"] = {
            "drop": {kind: p for kind, p in params.drop},
            "delay": {kind: s for kind, s in params.delay},
            "one_way_partition": None
            if params.one_way_partition is None
            else str(params.one_way_partition),
        }
    if params.scenario != "proximity":
        header.update(_run_one(params, True, progress, params.scenario, timing, 0, extras))
        return header
    started = time.perf_counter()
    variants = (("proximity_on", True), ("proximity_off", False))
    if jobs > 1:
        with ProcessPoolExecutor(max_workers=len(variants)) as pool:
            futures = [
                (
                    key,
                    pool.submit(_run_one, params, on, progress, key, timing, position, extras),
                )
                for position, (key, on) in enumerate(variants)
            ]
            for key, future in futures:
                header[key] = future.result()
    else:
        for key, on in variants:
            header[key] = _run_one(params, on, progress, key, timing, 0, extras)
    if timing:
        header["wall_seconds"] = round(time.perf_counter() - started, 3)
    return header


def _run_one(
    params: SimParams,
    proximity: bool,
    progress: bool,
    desc: str,
    timing: bool,
    position: int,
    extras: bool = False,
) -> dict[str, Any]:
    scenario = ScenarioRun(params, proximity=proximity)
    started = time.perf_counter()
    report = scenario.execute(progress, desc, position)
    wall = time.perf_counter() - started
    if timing:
        report["wall_seconds"] = round(wall, 3)
        report["events_per_second"] = round(scenario.sim.events / wall) if wall > 0 else None
    if extras:
        report["overlay"] = overlay_of(scenario, TOPIC)
        report["series"] = series_of(scenario, TOPIC)
    return report
