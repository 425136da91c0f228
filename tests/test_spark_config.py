"""Live configuration on a real two-executor Spark cluster (local-cluster[2,1,1024]), run
as its own OS process (tests/spark_apps/config_cluster.py), which reports what it saw; and
the overlay of that cluster: one node per executor plus the driver's, linked with measured
RTTs, and no agent left once the application has ended."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="the Spark connector needs the spark extra")
pytestmark = [pytest.mark.timeout(900), pytest.mark.spark]

APP = Path(__file__).parent / "spark_apps" / "config_cluster.py"
EXIT_LIMIT = 30.0  # s: agents notice their owner's end within a second (WATCH_INTERVAL)


@pytest.fixture(scope="module")
def report() -> dict:
    run = subprocess.run(
        [sys.executable, str(APP)], capture_output=True, text=True, timeout=840, check=False
    )
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_each_executor_sees_the_final_of_100_versions_and_never_goes_back(report: dict) -> None:
    followed = report["followed"]
    assert len({f["owner"] for f in followed}) == 2, "the UDF did not run on both executors"
    for f in followed:
        assert f["seen"][-1] == 100 and f["values"] == {"n": 100}, f
        assert f["seen"] == sorted(f["seen"]), f"versions went backwards: {f['seen']}"


def test_a_killed_executor_agent_comes_back_with_one_snapshot_and_no_write_resent(
    report: dict,
) -> None:
    restart = report["restart"]
    before = {v["owner"]: v for v in restart["before"]}
    after = {v["owner"]: v for v in restart["after"]}
    [owner] = [o for o, v in before.items() if v["agent"] == restart["killed"]]
    assert after[owner]["agent"] != restart["killed"], "no new agent was started"
    assert (after[owner]["version"], after[owner]["values"]) == (100, {"n": 100})
    # A fresh replica asks the driver's node, which holds every write, first (an executor
    # may have nothing yet): at most one snapshot from it, and no write published again.
    sent = restart["driver_snapshots_sent"]
    published = restart["driver_published"]
    assert sent[1] - sent[0] <= 1 and published[1] - published[0] == sent[1] - sent[0], restart
    assert all(f["lag"] == 0 for f in report["followed"]) and report["driver_lag"] == 0


def test_two_racing_writers_leave_every_node_with_one_value(report: dict) -> None:
    race = report["race"]
    driver = race["driver"]
    assert driver["race"] in ("driver", "external")
    assert len(race["executors"]) == 2
    assert all(e == driver for e in race["executors"]), race


def test_config_get_per_row_is_served_by_the_workers_copy_not_the_agent(report: dict) -> None:
    race = report["race"]["driver"]["race"]
    for reads in report["reads"]:
        assert reads["values"] == [race], reads  # the converged value, every time
        # The second inspect call itself and a re-poll of the copy's thread, at most a few;
        # one request a call would be over 1,000.
        assert reads["requests"] <= 10, reads


def test_register_gives_its_retention_to_the_driver_and_every_executor_agent(
    report: dict,
) -> None:
    assert report["driver_retention"] == [1234, 4321]
    assert [r["retention"] for r in report["reads"]] == [[1234, 4321]] * 2


def test_register_signed_makes_every_agent_sign_and_verify(report: dict) -> None:
    """register(signed=True) reaches the driver's and every executor's agent through the
    Deployment; sections 1-3 ran signed (the external `episub config set --signed` too)."""
    assert report["driver_signed"] == 1
    assert [r["signed"] for r in report["reads"]] == [1, 1]
    assert report["driver_bad_signatures"] == 0


def test_the_key_cluster_config_gives_tasks_is_redacted_from_the_event_log(report: dict) -> None:
    """cluster_config puts the deployment in the job's properties, which Spark writes to its
    event log: only under a name Spark redacts there."""
    assert report["event_log_bytes"] > 0
    assert report["key_in_event_log"] is False


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat", "rb") as f:
        return f.read().split(b") ")[1][:1] not in (b"Z", b"X")


def test_every_executor_runs_one_node_in_the_overlay_and_none_outlives_the_application(
    report: dict,
) -> None:
    views = report["overlay"]
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
