"""The figures of benchmarks/soak.py: delivery to live nodes, RSS growth and its bound."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_PATH = Path(__file__).resolve().parents[1] / "soak.py"
_SPEC = importlib.util.spec_from_file_location("soak", _PATH)
assert _SPEC is not None and _SPEC.loader is not None
soak = importlib.util.module_from_spec(_SPEC)
sys.modules["soak"] = soak  # its dataclasses look their module up while being defined
_SPEC.loader.exec_module(soak)

S = soak.NS  # one second in ns
GRACE = 5 * S


def test_a_message_counts_for_every_node_up_through_its_grace_but_not_for_its_publisher() -> None:
    lives = [soak.Life(0, 0, 0, 100 * S), soak.Life(1, 0, 0, 100 * S), soak.Life(2, 0, 0, 100 * S)]
    received = {(1, 0): {(0, 0)}, (2, 0): {(0, 0)}, (0, 0): {(0, 0)}}
    figures = soak.live_delivery([(0, 0, 10 * S)], lives, received, GRACE)
    assert (figures["counted"], figures["delivered"], figures["ratio"]) == (2, 2, 1.0)
    assert figures["misses"] == []


def test_a_node_killed_within_the_grace_or_up_after_the_publish_does_not_count() -> None:
    lives = [
        soak.Life(1, 0, 0, 14 * S),  # killed 4 s after the publish at 10 s: within the grace
        soak.Life(1, 1, 15 * S, 100 * S),  # its next incarnation, up after the publish
        soak.Life(2, 0, 11 * S, 100 * S),  # up 1 s after the publish
        soak.Life(3, 0, None, 100 * S),  # never got up
    ]
    figures = soak.live_delivery([(0, 0, 10 * S)], lives, {}, GRACE)
    assert (figures["counted"], figures["delivered"], figures["ratio"]) == (0, 0, None)


def test_a_killed_incarnation_counts_up_to_its_kill_and_its_misses_are_listed() -> None:
    lives = [soak.Life(1, 0, 0, 30 * S), soak.Life(1, 1, 31 * S, 100 * S)]
    published = [(0, 0, 10 * S), (0, 1, 25 * S), (0, 2, 40 * S), (0, 3, 50 * S)]
    # seq 0 reached the first incarnation before its kill; seq 1 was published 5 s before
    # the kill (exactly the grace: counted) and missed; seq 2 reached the second; seq 3 not.
    received = {(1, 0): {(0, 0)}, (1, 1): {(0, 2)}}
    figures = soak.live_delivery(published, lives, received, GRACE)
    assert (figures["counted"], figures["delivered"]) == (4, 2)
    assert figures["ratio"] == 0.5
    assert figures["misses"] == [soak.Miss(1, 0, 0, 1, 25 * S), soak.Miss(1, 1, 0, 3, 50 * S)]


def test_a_delivery_to_another_incarnation_of_the_node_does_not_cover_a_miss() -> None:
    lives = [soak.Life(1, 0, 0, 30 * S), soak.Life(1, 1, 31 * S, 100 * S)]
    received = {(1, 1): {(0, 0)}}  # e.g. fetched after the restart: not the live one's
    figures = soak.live_delivery([(0, 0, 10 * S)], lives, received, GRACE)
    assert figures["misses"] == [soak.Miss(1, 0, 0, 0, 10 * S)]


def test_rss_growth_is_measured_from_the_first_sample_after_the_warmup() -> None:
    samples = [(0, 30_000), (50 * S, 40_000), (60 * S, 41_000), (70 * S, 45_000), (80 * S, 43_000)]
    growth = soak.rss_growth(samples, since_ns=0, warmup_ns=60 * S)
    assert growth == {
        "after_warmup_kib": 41_000,
        "after_warmup_at_ns": 60 * S,
        "max_kib": 45_000,
        "growth_kib": 4_000,
        "last_kib": 43_000,
        "observed_s": 20.0,
    }
    assert soak.rss_growth(samples, since_ns=30 * S, warmup_ns=60 * S) is None


def test_the_rss_bound_holds_only_when_every_judged_incarnation_stays_within_it() -> None:
    flat = {"growth_kib": 1_000}
    grown = {"growth_kib": 30_000}
    held = soak.rss_bound({"n0.0": flat, "n1.0": None}, bound_kib=8 * 1024)
    assert held["held"] and held["judged"] == 1 and held["not_judged"] == ["n1.0"]
    broken = soak.rss_bound({"n0.0": flat, "n2.0": grown}, bound_kib=8 * 1024)
    assert not broken["held"] and broken["over"] == ["n2.0"]
    assert broken["max_growth_kib"] == 30_000
    assert not soak.rss_bound({"n1.0": None}, bound_kib=1)["held"]  # nothing judged


def test_counters_are_summed_by_name_and_non_counters_ignored() -> None:
    total = soak.sum_counters([{"grafts_sent": 2, "final": True}, {"grafts_sent": 3, "x": 1}])
    assert total == {"grafts_sent": 5, "x": 1}


def test_kills_go_round_robin_over_the_candidates_in_a_seeded_order() -> None:
    order = soak.kill_order(range(2, 6), 10, seed=1)
    assert sorted(order[:4]) == [2, 3, 4, 5]
    assert order[4:8] == order[:4] and order[8:] == order[:2]
    assert order == soak.kill_order(range(2, 6), 10, seed=1)
    assert soak.kill_order([], 3, seed=1) == []


def test_counter_increments_go_to_the_bucket_of_the_later_sample() -> None:
    first = [
        (5 * S, {"grafts_sent": 1}),
        (10 * S, {"grafts_sent": 4}),
        (16 * S, {"grafts_sent": 6}),
    ]
    second = [(12 * S, {"grafts_sent": 0}), (14 * S, {"grafts_sent": 5})]
    rates = soak.counter_rates([first, second, []], 0, 5 * S, ["grafts_sent"])
    assert rates == [{"t_s": 10.0, "grafts_sent": 3 + 5}, {"t_s": 15.0, "grafts_sent": 2}]
