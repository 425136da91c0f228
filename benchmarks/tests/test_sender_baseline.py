"""benchmarks/sender_baseline.py: each sender alone must be the very sender of the
multi-sender run, or the comparison sets the run against other trees."""

from __future__ import annotations

import sender_baseline  # benchmarks/ (conftest.py)

SMALL = ["--nodes", "60", "--senders", "3", "--messages", "6", "--warmup", "2", "--settle", "5"]


def test_each_sender_alone_is_one_of_the_multi_sender_runs_senders() -> None:
    result = sender_baseline.main(SMALL)
    assert set(result["per_sender"]) == {str(s) for s in result["senders"]}
    assert len(result["senders"]) == 3
    alone = [figures["alone"] for figures in result["per_sender"].values()]
    assert result["alone_pooled"]["ldh"] == max(a["ldh"] for a in alone)
    assert result["together"]["reliability"] == 1.0
    assert result["alone_pooled"]["reliability"] == 1.0
