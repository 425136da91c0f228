"""Processes SIGKILLed under the connector on local-cluster[2,1,1024] (issue 15's acceptance
1, 2 and 5). Each Spark application is an OS process of its own (tests/spark_apps), so the
test can kill it; every process a test starts is ended by its pid, and no agent may outlive
its application."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="the Spark connector needs the spark extra")

from episub.agent import AgentClient
from tests.connect_server import agent_processes
from tests.proc_helpers import (
    KEY,
    Processes,
    is_alive,
    node_ready,
    start_node,
    wait_process_gone,
    wait_until,
)

pytestmark = [pytest.mark.timeout(900), pytest.mark.spark]

APPS = Path(__file__).parent / "spark_apps"
LIMIT = 300.0  # s: a Spark application's run on a loaded 2-core machine
TOTAL = 3000  # rows the outside publisher publishes, paced across the driver's restart


def descendants(pid: int) -> list[int]:
    """Every process under `pid` (its JVM, the executors, their workers)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    ppid = int(f.read().rsplit(b") ", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, frontier = [], [pid]
    while frontier:
        for child in children.get(frontier.pop(), []):
            out.append(child)
            frontier.append(child)
    return out


def start_app(processes: Processes, script: str, *args: str, name: str):  # type: ignore[no-untyped-def]
    return processes.start([sys.executable, str(APPS / script), *args], name=name)


def test_a_driver_sigkilled_mid_stream_and_started_again_reads_each_published_seq_once(
    processes: Processes, tmp_path: Path
) -> None:
    """Acceptance 1: an `episub node` outside Spark publishes steadily into `t`; an app
    that uses only documented options reads from seq 0; its driver is SIGKILLed mid-stream
    and the app started again with the same key and checkpoint (default failOnDataLoss)."""
    outside = start_node(processes, "outside")  # topic "t", key KEY
    _, address = node_ready(outside)
    socket_path = str(processes.dir / "outside.sock")
    done, killed = threading.Event(), threading.Event()

    def publish() -> None:
        with AgentClient(socket_path) as client:
            for start in range(0, TOTAL, 20):
                if start == TOTAL // 2:
                    # The second half goes out across the restart whatever the first run's
                    # speed: on a loaded machine it once read 200 rows only after the whole
                    # paced stream (15 s) had been published, so nothing was mid-stream.
                    killed.wait(LIMIT)
                client.publish_batch("t", [b"%d" % i for i in range(start, start + 20)])
                time.sleep(0.1)  # paced: publishing goes on across the restart
        done.set()

    args = (KEY.hex(), address, str(tmp_path / "out"), str(tmp_path / "checkpoint"), str(TOTAL))
    first = start_app(processes, "outside_reader.py", *args, name="first-run")
    first.read_line(timeout=LIMIT)  # its query runs
    publisher = threading.Thread(target=publish, daemon=True)
    publisher.start()
    while True:  # until the first run has read part of the stream
        line = first.read_line(timeout=LIMIT)
        if line.startswith("read ") and int(line.split()[1]) >= 200:
            break
    assert not done.is_set(), "the publisher finished before the kill: not mid-stream"
    below = descendants(first.pid)
    os.kill(first.pid, signal.SIGKILL)
    killed.set()
    first.wait()
    for pid in below:  # its JVM, executors and agents go with it
        wait_process_gone(pid, timeout=60)
    second = start_app(processes, "outside_reader.py", *args, name="second-run")
    while not (line := second.read_line(timeout=LIMIT)).startswith("{"):
        pass
    assert second.wait(timeout=LIMIT) == 0, second.stderr_text()[-3000:]
    publisher.join(LIMIT)
    found = json.loads(line)
    assert found == {"rows": TOTAL, "distinct": TOTAL, "seqs": [0, TOTAL - 1], "publishers": 1}


def test_executors_sigkilled_mid_sink_task_and_right_after_a_commit(
    processes: Processes, tmp_path: Path
) -> None:
    """Acceptance 2: an executor SIGKILLed mid-sink-task; afterwards every node that holds
    a place holds the same message for it, and the source reads exactly the rows, each once.
    Acceptance 5: with acks=1, an executor SIGKILLed right after its task's commit loses no
    row."""
    before = set(agent_processes())
    app = start_app(processes, "sink_kills.py", str(tmp_path), name="sink-kills")
    assert app.wait(timeout=LIMIT * 2) == 0, app.stderr_text()[-3000:]
    found = json.loads(app.read_line().strip().splitlines()[-1])
    mid = found["mid_task"]
    assert mid["killed"], "the first attempt did not kill its executor"
    assert (mid["rows_read"], mid["distinct_read"], mid["exact"]) == (20_000, 20_000, True)
    # Places are record batches of batchSize (100) rows: every row at one place.
    assert mid["nodes"] >= 2 and mid["rows_at_places"] == 20_000 and mid["places"] >= 200
    assert mid["places_with_two_messages"] == 0
    # The first attempt's places were held by another node when its executor was killed,
    # so the retry met them: each kept the first attempt's message on every node.
    assert mid["first_attempt_places"] > 0
    assert mid["first_attempt_places_kept"] == mid["first_attempt_places"]
    after = found["after_commit"]
    assert after["victim"], "no executor was killed after the commit"
    assert after["partition_0_rows"] > 0
    assert after["driver_held_before_kill"] == after["partition_0_places"]  # acks=1 waited
    assert (after["rows_read"], after["exact"]) == (10_000, True)
    wait_until(lambda: not (set(agent_processes()) - before), timeout=60, what="agents gone")
    assert not [pid for pid in set(agent_processes()) - before if is_alive(pid)]
