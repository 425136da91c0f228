"""benchmarks/message_path.py: each step must do the work it is named for, or its figures
would time something else."""

from __future__ import annotations

import argparse

import message_path  # benchmarks/ (conftest.py)
import trio


def test_every_step_is_timed_and_counted() -> None:
    args = argparse.Namespace(size=64, repeat=1, number=8)
    # Each step asserts it did its work: every Send queued, every id matching its bytes,
    # every event delivered.
    results = trio.run(message_path.run, args)
    assert list(results) == [
        "send (per message and neighbour)",
        "encode (per message)",
        "decode (per message)",
        "deliver (per message)",
    ]
    assert all(f["ns"] > 0 and f["calls"] > 0 for f in results.values())
