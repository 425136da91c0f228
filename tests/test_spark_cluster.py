"""The connector on a real two-executor Spark cluster (local-cluster[2,1,1024]), run as its
own OS process: one node per executor plus the driver's, linked with measured RTTs, and no
agent left once the application has ended."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="the Spark connector needs the spark extra")
pytestmark = [pytest.mark.timeout(600), pytest.mark.spark]

APP = Path(__file__).parent / "spark_apps" / "cluster_overlay.py"
EXIT_LIMIT = 30.0  # s: agents notice their owner's end within a second (WATCH_INTERVAL)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat", "rb") as f:
        return f.read().split(b") ")[1][:1] not in (b"Z", b"X")


def test_every_executor_runs_one_node_in_the_overlay_and_none_outlives_the_application():
    run = subprocess.run(
        [sys.executable, str(APP)], capture_output=True, text=True, timeout=540, check=False
    )
    assert run.returncode == 0, run.stderr[-3000:]
    views = json.loads(run.stdout.strip().splitlines()[-1])
    roles = [v["role"] for v in views]
    assert roles == ["driver", "executor", "executor"], views
    pids = [v["pid"] for v in views]
    assert len(set(pids)) == 3, pids
    addresses = {v["address"] for v in views}
    for view in views:
        assert view["neighbors"], f"{view['role']} {view['pid']} has no neighbour"
        for neighbor in view["neighbors"]:
            assert neighbor["address"] in addresses - {view["address"]}
            assert neighbor["rtt_ms"] is not None and neighbor["rtt_ms"] > 0
    deadline = time.monotonic() + EXIT_LIMIT
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)  # polling the pids: an ended process sends no event
    left = [pid for pid in pids if alive(pid)]
    for pid in left:
        os.kill(pid, 9)
    assert not left, f"agents outlived the application: {left}"
