"""Fault injection in the simulator: chosen message kinds dropped, a one-way partition
that heals. Delivery must still complete, through GRAFT retries, IHAVE-free trees and
gap pulls (docs/reliability.md has the 1,000-node runs)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from episub.sim.params import SimParams
from episub.sim.scenarios import run

pytestmark = pytest.mark.slow


def small(**fields: object) -> dict:
    params = SimParams(scenario="steady", nodes=100, messages=20, seed=3, **fields)  # type: ignore[arg-type]
    return run(params, progress=False, timing=False)


IHAVE_GAP = (
    "open (hardening issue): with every IHAVE lost, a node left without an eager parent "
    "misses messages and, receiving nothing later, never sees the gap; seed 3 at 100 nodes "
    "delivers 0.9939"
)


@pytest.mark.parametrize(
    "drop",
    [
        (("graft", 0.5),),
        pytest.param((("ihave", 1.0),), marks=pytest.mark.xfail(strict=True, reason=IHAVE_GAP)),
        (("prune", 1.0),),
        (("pull", 0.5),),
    ],
)
def test_dropping_a_message_kind_still_delivers_everything(drop: tuple) -> None:
    report = small(drop=drop)
    assert report["reliability"] == 1.0
    assert report["drop"] == dict(drop)


def test_half_of_all_grafts_lost_really_drops_sends() -> None:
    assert small(drop=(("graft", 0.5),))["dropped_by_loss"] > 0


def test_a_one_way_partition_that_heals_still_delivers_everything() -> None:
    report = small(one_way_seconds=3.0)
    assert report["reliability"] == 1.0
    assert report["dropped_by_loss"] > 0  # the cut did drop sends
    assert report["latency_p99_ms"] > 1000  # and some messages waited for the heal


@pytest.mark.parametrize(
    ("value", "said"),
    [("graft", "give KIND=SHARE"), ("nope=0.5", "give KIND=SHARE"), ("graft=2", "in 0..1")],
)
def test_a_bad_drop_rule_is_one_clear_line(value: str, said: str) -> None:
    run_ = subprocess.run(
        [sys.executable, "-m", "episub.cli", "sim", "steady", "--drop", value],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run_.returncode == 2
    lines = run_.stderr.strip().splitlines()
    assert said in lines[-1] and "Traceback" not in run_.stderr


def test_the_cli_reports_the_faults_it_injected() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "episub.cli", "sim", "steady", "--nodes", "50", "--messages",
         "5", "--drop", "graft=0.5", "--json", "--quiet", "--no-timing"],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    report = json.loads(out)
    assert report["drop"] == {"graft": 0.5} and report["reliability"] == 1.0
