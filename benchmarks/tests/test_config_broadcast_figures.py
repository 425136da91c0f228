"""The figures of benchmarks/config_broadcast.py: percentiles and per-update latencies."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "config_broadcast.py"
_SPEC = importlib.util.spec_from_file_location("config_broadcast", _PATH)
assert _SPEC is not None and _SPEC.loader is not None
bench = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(bench)


def test_percentile_is_nearest_rank_and_a_value_of_the_sample() -> None:
    values = list(range(1, 201))  # 200 samples, shuffled order must not matter
    assert bench.percentile(values[::-1], 50) == 100
    assert bench.percentile(values, 99) == 198
    assert bench.percentile(values, 100) == 200
    assert bench.percentile([7.5], 99) == 7.5
    with pytest.raises(ValueError):
        bench.percentile([], 50)


def test_a_reader_that_skipped_a_version_saw_it_when_it_saw_a_later_one() -> None:
    seen = [(1, 100), (3, 250), (4, 300)]
    assert bench.first_seen(seen, 1) == 100
    assert bench.first_seen(seen, 2) == 250
    assert bench.first_seen(seen, 4) == 300
    assert bench.first_seen(seen, 5) is None


def test_an_update_counts_when_its_slowest_reader_saw_it_and_none_when_one_never_did() -> None:
    sets = [(1, 90), (2, 200), (3, 240)]
    readers = [[(1, 100), (3, 250)], [(1, 120), (2, 230)]]
    assert bench.update_latencies(sets, readers) == [30, 50, None]
    figures = bench.summary([30_000_000, 50_000_000, None])
    assert figures["count"] == 3 and figures["seen_everywhere"] == 2
    assert figures["p50_ms"] == 30.0 and figures["max_ms"] == 50.0
