"""Issue 15's acceptance 3 on real Spark: over a sink-to-source pipeline of 200
micro-batches (tests/spark_apps/pipeline_offsets.py), the reading query's offsets stop
growing once retention forgets old streams, as tests/test_spark_planner.py's 10,000
planned batches show without Spark.

On demand (about 7 minutes on a 2-core machine, too slow for CI):

    EPISUB_ONDEMAND=1 flock /tmp/episub-heavy.lock .venv/bin/python -m pytest -q \\
        tests/test_spark_pipeline_offsets.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="the Spark connector needs the spark extra")
pytestmark = [
    pytest.mark.spark,
    pytest.mark.timeout(1800),
    pytest.mark.skipif(
        os.environ.get("EPISUB_ONDEMAND") != "1", reason="on demand: EPISUB_ONDEMAND=1"
    ),
]

APP = Path(__file__).parent / "spark_apps" / "pipeline_offsets.py"


def test_two_hundred_micro_batches_keep_the_offsets_bounded(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, str(APP), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=1700,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    batches = json.loads(run.stdout.strip().splitlines()[-1])["batches"]
    publishers = [b["publishers"] for b in batches]
    sizes = [b["json"] for b in batches]
    assert len(batches) == 200
    # Two sink queries of two partitions each: one stream per partition, not per batch.
    assert max(publishers) == 4
    # The short-lived query's streams aged out of retention and left the offsets.
    assert publishers[-1] == 2 and sizes[-1] < max(sizes)
    assert max(sizes[100:]) <= max(sizes[:100])
