"""benchmarks/link_changes.py: counting the link changes must not change the run it
counts, and every link of the overlay is counted once."""

from __future__ import annotations

import link_changes  # benchmarks/ (conftest.py)

from episub.sim.cli import add_parser, params_from_args
from episub.sim.scenarios import run

SMALL = ["--nodes", "60", "--senders", "3", "--messages", "6", "--warmup", "2", "--settle", "5"]


def test_counting_link_changes_leaves_the_run_as_it_is() -> None:
    result = link_changes.main(["multi-sender", *SMALL])
    parser = link_changes.argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    plain = run(params_from_args(parser.parse_args(["sim", "multi-sender", *SMALL])))
    for key in ("reliability", "rmr", "ldh", "latency_p50_ms", "latency_p99_ms"):
        assert result[key] == plain[key]


def test_every_link_is_counted_once_at_one_end() -> None:
    phases = link_changes.main(["multi-sender", *SMALL])["phases"]
    assert list(phases) == ["join", "settle", "warm-up", "counted"]
    made = sum(phase["near_up"] + phase["rand_up"] for phase in phases.values())
    ended = sum(phase["down"] for phase in phases.values())
    # A connected overlay of 60 nodes has at least 59 links; each node holds at most
    # max_active (14), so at most 60 * 14 / 2 links stand at the end.
    assert 59 <= made - ended <= 60 * 14 // 2
    # Joins make RAND links, so the join phase makes some.
    assert phases["join"]["rand_up"] > 0
