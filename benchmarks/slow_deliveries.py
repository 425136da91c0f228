"""Where a simulator run's slowest deliveries come from: GRAFT answers or pushes, and how long
each waited between its IHAVE and its GRAFT.

    .venv/bin/python benchmarks/slow_deliveries.py crash --fraction 0.8 --seed 1
    .venv/bin/python benchmarks/slow_deliveries.py steady --messages 100 --warmup 50 --seed 3

It runs `episub sim SCENARIO ...` (1,000 nodes unless `--nodes` says otherwise) with every
node's core wrapped: the wrapper notes each node's first copy of every message (when,
from whom), its first IHAVE and first GRAFT of each place, and its deliveries. For the
slowest 2% of counted deliveries it prints how many came as the answer to a GRAFT, the
median wait from publish to IHAVE, IHAVE to GRAFT and GRAFT to answer, and the roots:
walking each slow delivery's first copies back towards the publisher, the hop that
waited longest beyond its link's latency (a subtree fed late hangs below one such node).
A diagnostic of the simulator: nothing here is in the core. Deterministic; it writes
nothing. docs/simulation.md ("Crash 80%: where its p99 comes from") quotes its output.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import Counter
from typing import Any

from episub.proto.events import Deliver, Published, Received, Send
from episub.proto.messages import Gossip, Graft, IHave
from episub.sim.cli import add_parser, params_from_args
from episub.sim.metrics import COUNTED
from episub.sim.scenarios import ScenarioRun

Place = tuple[Any, int]


class Log:
    """What the wrapped nodes did, keyed by (node, message id) or (node, place)."""

    def __init__(self) -> None:
        self.published: dict[bytes, tuple[str, int, float, Place]] = {}  # id -> kind, index, t
        self.first: dict[tuple[int, bytes], tuple[float, int]] = {}  # first copy: t, sender
        self.ihave: dict[tuple[int, Place], float] = {}
        self.graft: dict[tuple[int, Place], float] = {}
        self.delivered: dict[tuple[int, bytes], float] = {}


class Traced:
    """A node's core with its inputs and outputs noted in `log`; it behaves as the core."""

    def __init__(self, node: int, core: Any, log: Log) -> None:
        self._node = node
        self._core = core
        self._log = log

    def __getattr__(self, name: str) -> Any:
        return getattr(self._core, name)

    def handle(self, event: Any, now: float) -> list[Any]:
        node, log = self._node, self._log
        if isinstance(event, Received):
            msg = event.message
            if isinstance(msg, Gossip):
                log.first.setdefault((node, msg.id), (now, event.peer))
            elif isinstance(msg, IHave):
                for publisher, first, last, _ in msg.ranges:
                    for seq in range(first, last + 1):
                        log.ihave.setdefault((node, (publisher, seq)), now)
        outs = self._core.handle(event, now)
        for out in outs:
            if isinstance(out, Send) and isinstance(out.message, Graft):
                for publisher, first, last, _ in out.message.ranges:
                    for seq in range(first, last + 1):
                        log.graft.setdefault((node, (publisher, seq)), now)
            elif isinstance(out, Deliver):
                log.delivered[(node, out.id)] = now
            elif isinstance(out, Published):
                e = out.envelope
                text = e.payload.decode()
                log.published[out.id] = (text[0], int(text[1:]), now, (e.publisher, e.seq))
        return outs


def run(argv: list[str]) -> tuple[ScenarioRun, Log]:
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    params = params_from_args(parser.parse_args(["sim", *argv]))
    log = Log()
    scenario = ScenarioRun(params)
    make_core = scenario.sim._factory
    scenario.sim._factory = lambda node, rng: Traced(node, make_core(node, rng), log)
    scenario.execute()
    return scenario, log


def report(scenario: ScenarioRun, log: Log) -> None:
    latencies = sorted(
        (t - log.published[mid][2], node, mid)
        for (node, mid), t in log.delivered.items()
        if mid in log.published and log.published[mid][0] == COUNTED
    )
    slow = latencies[int(0.98 * len(latencies)) :]
    print(f"{len(latencies)} counted deliveries; slowest 2%: {len(slow)}, from {slow[0][0]:.3f} s")
    answers = 0
    waits: dict[str, list[float]] = {"publish to IHAVE": [], "IHAVE to GRAFT": [], "answer": []}
    roots: Counter[tuple[int, int]] = Counter()
    delay = scenario.sim.delay
    for _, node, mid in slow:
        _, index, published_at, place = log.published[mid]
        arrived, _ = log.first[(node, mid)]
        grafted = log.graft.get((node, place))
        announced = log.ihave.get((node, place))
        if grafted is not None and grafted <= arrived:
            answers += 1
            if announced is not None:
                waits["publish to IHAVE"].append(announced - published_at)
                waits["IHAVE to GRAFT"].append(grafted - announced)
            waits["answer"].append(arrived - grafted)
        roots[(longest_wait(node, mid, place[0], published_at, log, delay), index)] += 1
    print(f"GRAFT answers: {answers}; pushes: {len(slow) - answers}")
    for name, values in waits.items():
        if values:
            print(f"  {name}: median {1000 * statistics.median(values):.0f} ms")
    print("roots (node, message): slow deliveries below them")
    for (root, index), count in roots.most_common(10):
        print(f"  node {root}, message #{index}: {count}")


def longest_wait(
    node: int, mid: bytes, publisher: Any, published_at: float, log: Log, delay: Any
) -> int:
    """The node on `node`'s path of first copies whose copy waited longest beyond its link."""
    best, at = -1.0, node
    while (node, mid) in log.first:
        arrived, sender = log.first[(node, mid)]
        sent = published_at if sender == publisher else log.first.get((sender, mid), (arrived,))[0]
        wait = arrived - sent - delay(node, sender)
        if wait > best:
            best, at = wait, node
        if sender == publisher:
            break
        node = sender
    return at


def main() -> int:
    argv = sys.argv[1:]
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    scenario, log = run(argv)
    report(scenario, log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
