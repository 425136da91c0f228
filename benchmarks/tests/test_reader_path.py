"""benchmarks/reader_path.py: its reader must take in every update the writer makes, or
its per-stage figures would time something else."""

from __future__ import annotations

import reader_path  # benchmarks/ (conftest.py)


def test_every_stage_is_timed_over_updates_the_reader_applied() -> None:
    stages = reader_path.warm(200)  # raises SystemExit unless all 200 were applied
    assert set(stages) == {"open", "frame", "core", "apply", "total"}
    assert all(us > 0 for us in stages.values())
    assert stages["total"] >= stages["core"]


def test_the_cold_pass_applies_every_update_too() -> None:
    assert reader_path.cold(20, evict_mb=1)["total"] > 0
