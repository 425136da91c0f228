"""Properties of the sans-IO core under random runs (hypothesis over the simulator).

Each example is a small overlay driven by one scenario (joins, then steady publishing,
crashes, churn with leaves and crashes, or a partition that heals), with random message
loss and random drops of chosen kinds. Every node is the real NodeState wrapped in a
checker that, after every event it handles, asserts the invariants the core promises:

- the active view is within its hard cap (the draft's oversubscription included) and the
  passive view within its size;
- eager and lazy are disjoint and inside the active view;
- the missing-message table and the payload cache are within their bounds;
- no message is delivered twice to the application.

After the run, without random loss: every live node received every counted message
(reliability 1.0, churn apart), and no active-view asymmetry persisted after quiescence.
"""

from __future__ import annotations

import os
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from episub.proto.config import BroadcastConfig, NodeConfig
from episub.proto.events import Deliver
from episub.proto.node import NodeState
from episub.sim.params import SimParams, membership_config
from episub.sim.scenarios import ScenarioRun

TOPIC = "t"  # the simulator's topic
# Bounded in the suite, and always the same examples (derandomized), so CI is reproducible.
# EPISUB_PROPERTY_SEARCH=500 runs a random search of that many examples instead.
SEARCH = os.environ.get("EPISUB_PROPERTY_SEARCH")
EXAMPLES = int(SEARCH) if SEARCH else 25


class CheckedNode:
    """NodeState, with the invariants checked after every handled event."""

    def __init__(self, peer: int, config: NodeConfig, rng: random.Random) -> None:
        self.inner = NodeState(peer, config, rng)
        self.config = config
        self.delivered: set[bytes] = set()

    def __getattr__(self, name: str) -> Any:  # the scenario's view queries
        return getattr(self.inner, name)

    def handle(self, event: Any, now: float) -> list[Any]:
        out = self.inner.handle(event, now)
        for o in out:
            if o.__class__ is Deliver:
                assert o.id not in self.delivered, f"delivered twice: {o.id.hex()}"
                self.delivered.add(o.id)
        self.check()
        return out

    def check(self) -> None:
        topic = self.inner._topics.get(TOPIC)
        if topic is None:
            return
        membership, broadcast = topic.membership, topic.broadcast
        m, b = self.config.membership, self.config.broadcast
        active = set(membership.active)
        assert len(active) <= m.max_active, f"active view {len(active)} > {m.max_active}"
        assert len(membership.passive) <= m.passive_size
        eager, lazy = set(broadcast.eager), set(broadcast.lazy)
        assert not eager & lazy, f"eager and lazy share {eager & lazy}"
        assert eager | lazy <= active, (
            f"eager/lazy outside the active view: {(eager | lazy) - active}"
        )
        assert len(broadcast.missing) <= b.max_missing
        assert len(broadcast.cache) <= b.cache_max_messages


runs = st.fixed_dictionaries(
    {
        "scenario": st.sampled_from(["steady", "crash", "churn", "partition", "multi-sender"]),
        "nodes": st.integers(8, 30),
        "seed": st.integers(0, 2**32 - 1),
        "loss": st.sampled_from([0.0, 0.0, 0.02, 0.1]),
        "drop": st.sampled_from([(), (), (("graft", 0.5),), (("prune", 1.0),), (("pull", 0.5),)]),
    }
)


def run_checked(fields: dict[str, Any]) -> dict[str, Any]:
    params = SimParams(
        messages=10,
        warmup=3,
        settle=10.0,
        settle_after=3.0,
        duration=3.0,
        lifetime=3.0,
        partition_seconds=3.0,
        senders=min(3, fields["nodes"]),
        max_drain=20.0,
        **fields,
    )
    config = NodeConfig(membership=membership_config(True), broadcast=BroadcastConfig())

    def factory(peer: int, rng: random.Random) -> CheckedNode:
        return CheckedNode(peer, config, rng)

    return ScenarioRun(params, node_factory=factory).execute()


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=not SEARCH,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(runs)
def test_invariants_hold_in_every_step_of_random_runs(fields: dict[str, Any]) -> None:
    report = run_checked(fields)
    if fields["loss"] == 0.0:
        # With random loss (which TCP never does to single messages) a lost ACCEPT or
        # DISCONNECT can leave a one-sided link past the recheck: seed 0, 8 nodes, loss 0.1
        # shows one. Open in the hardening issue; lossless runs must settle symmetric.
        assert report["symmetry_violations_persistent"] == 0
    if fields["loss"] == 0.0 and fields["scenario"] != "churn":
        # Loss or dropped kinds may legitimately exhaust the repair budget; churn counts
        # only nodes that lived through a message's lifetime, also without loss.
        assert report["reliability"] == 1.0, report


@pytest.mark.parametrize("scenario", ["steady", "crash"])
def test_a_lossless_run_delivers_every_counted_message(scenario: str) -> None:
    report = run_checked({"scenario": scenario, "nodes": 20, "seed": 7, "loss": 0.0, "drop": ()})
    assert report["reliability"] == 1.0


@pytest.mark.xfail(
    strict=True,
    reason="open (hardening issue): found by the random search in CI: after a healed "
    "partition with half the PULLs dropped, one active link stays one-sided past the recheck",
)
def test_found_a_one_sided_link_after_a_partition_with_pulls_dropped() -> None:
    report = run_checked(
        {
            "scenario": "partition",
            "nodes": 13,
            "seed": 578941881,
            "loss": 0.0,
            "drop": (("pull", 0.5),),
        }
    )
    assert report["symmetry_violations_persistent"] == 0
