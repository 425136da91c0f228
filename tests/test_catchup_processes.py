"""Catch-up that finishes, on real processes: node x publishes 1,000,000 rows of 100 bytes
as 245 record batches (~100 MB) while its neighbour y is stopped (SIGSTOP), then y is
resumed (SIGCONT) and must end holding every batch; and a node z that joins beside x
after the rows were published (stamped a minute before) must end holding them too.

Before answers were streamed as the link drains, y held none of them 90 s later: x's
answer to y's catch-up overflowed its send queue, the link was dropped as too slow, came
back, and the catch-up started again from the beginning (a livelock: 490 overflows).

Before a joining node caught up its neighbours' retained history, the late joiner held
nothing 90 s later: its catch-up asked only for what was stamped since it joined.

The million rows on demand (about a minute each, ~100 MB per node): EPISUB_ONDEMAND=1.
They print the catch-up's duration and each node's peak RSS, the figures of
docs/reliability.md. The late joiner with 20,000 rows runs in the suite.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

import pytest

from episub.agent import AgentClient
from tests.proc_helpers import TOPIC, Processes, wait_until
from tests.test_bounded_answers_processes import rss_bytes
from tests.test_multiprocess import Overlay

pytestmark = pytest.mark.timeout(400)
on_demand = pytest.mark.skipif(
    os.environ.get("EPISUB_ONDEMAND") != "1", reason="on demand: EPISUB_ONDEMAND=1"
)

ROWS = 1_000_000
ROW_BYTES = 100
BATCH_ROWS = 4096
BATCHES = -(-ROWS // BATCH_ROWS)  # 245
STREAM = b"rows"
CATCH_UP_WAIT = 180.0  # s; a bound on a failing build, not a figure
# The retention: room for the rows (the default keeps 64 MiB).
RETENTION = {"max_messages": 2_000_000, "max_bytes": 1 << 30}
# How long before the late joiner's join the rows are stamped: past the catch-up's clock
# slack (2 s), inside retention's age (600 s).
STAMPED_AGO_MS = 60_000


def held(overlay: Overlay, name: str) -> int:
    with AgentClient(overlay.socket(name)) as client:
        span = client.offsets(TOPIC).get(STREAM)
    return 0 if span is None else span.count


def rows_of(count: int, stamp_ms: int) -> list[tuple[int, None, bytes, tuple[()]]]:
    return [(stamp_ms, None, b"v" * ROW_BYTES, ())] * count  # one row object, many times


@on_demand
def test_a_resumed_node_catches_up_on_a_million_rows_held_as_record_batches(
    processes: Processes,
) -> None:
    overlay = Overlay(processes)
    config = processes.config_file({"retention": RETENTION})
    overlay.start(["x"], config=config)
    overlay.start(["y"], config=config, bootstrap=[overlay.address["x"]])
    overlay.wait_connected(["x", "y"])
    y = overlay.procs["y"].popen  # type: ignore[attr-defined]
    now = int(time.time() * 1000)
    rows = [(now, None, b"v" * ROW_BYTES, ())] * ROWS  # one row object, a million times
    os.kill(y.pid, signal.SIGSTOP)
    try:
        with AgentClient(overlay.socket("x")) as client:
            client.publish_rows(TOPIC, STREAM, rows, batch_rows=BATCH_ROWS)
        assert held(overlay, "x") == BATCHES
    finally:
        os.kill(y.pid, signal.SIGCONT)
    resumed = time.monotonic()
    wait_until(
        lambda: held(overlay, "y") == BATCHES, timeout=CATCH_UP_WAIT, what="y to hold every batch"
    )
    took = time.monotonic() - resumed
    peaks = {n: rss_bytes(overlay.procs[n].popen.pid, "VmHWM") // 10**6 for n in ("x", "y")}  # type: ignore[attr-defined]
    with AgentClient(overlay.socket("x")) as client:
        x = client.inspect().stats
    print(f"y held all {BATCHES} batches {took:.1f} s after SIGCONT; peak RSS MB {peaks}")
    print({k: x.get(k) for k in ("queue_overflows", "peers_lost", "answers_sent")})
    assert x["core_errors"] == 0


def late_joiner(processes: Processes, rows: int) -> tuple[int, int, dict[str, int]]:
    """x publishes `rows` as record batches, stamped a minute ago; then z joins through x.
    Returns the batches published, the batches z holds once it holds them all (or the wait
    gave up) and z's counters (history: retention, not z's subscribers)."""
    batches = -(-rows // BATCH_ROWS)
    overlay = Overlay(processes)
    config = processes.config_file({"retention": RETENTION})
    overlay.start(["x"], config=config)
    stamp = int(time.time() * 1000) - STAMPED_AGO_MS
    with AgentClient(overlay.socket("x")) as client:
        client.publish_rows(TOPIC, STREAM, rows_of(rows, stamp), batch_rows=BATCH_ROWS)
    assert held(overlay, "x") == batches
    joined = time.monotonic()
    overlay.start(["z"], config=config, bootstrap=[overlay.address["x"]])
    with contextlib.suppress(AssertionError):  # the tests compare what z ends up holding
        wait_until(
            lambda: held(overlay, "z") == batches,
            timeout=CATCH_UP_WAIT,
            what="z to hold every batch",
        )
    took = time.monotonic() - joined
    peaks = {n: rss_bytes(overlay.procs[n].popen.pid, "VmHWM") // 10**6 for n in ("x", "z")}  # type: ignore[attr-defined]
    with AgentClient(overlay.socket("z")) as client:
        z = client.inspect().stats
    print(f"z held all {batches} batches {took:.1f} s after it started; peak RSS MB {peaks}")
    print({k: z.get(k) for k in ("catch_ups", "caught_up", "peers_lost", "core_errors")})
    return batches, held(overlay, "z"), z


def test_a_late_joiner_catches_up_on_the_history_its_neighbour_retains(
    processes: Processes,
) -> None:
    batches, z_held, z = late_joiner(processes, 20_000)
    assert z_held == batches
    assert z["core_errors"] == 0 and z["caught_up"] >= batches


@on_demand
def test_a_late_joiner_catches_up_on_a_million_rows_held_as_record_batches(
    processes: Processes,
) -> None:
    batches, z_held, z = late_joiner(processes, ROWS)
    assert z_held == batches
    assert z["core_errors"] == 0 and z["caught_up"] >= batches
