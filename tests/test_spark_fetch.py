"""A reader's rows come from whichever reachable node holds them: after the Spark session
is stopped mid-stream and started again in the same process, and when a node outside
Spark alone holds many one-row messages. Each Spark application is an OS process of its
own (tests/spark_apps).

The session restart ten times in a row (about a minute each on a 2-core machine):

    EPISUB_ONDEMAND=1 .venv/bin/python -m pytest -q -s tests/test_spark_fetch.py -k again
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="the Spark connector needs the spark extra")

pytestmark = [pytest.mark.timeout(600), pytest.mark.spark]

ROOT = Path(__file__).parent.parent
RESTART_APP = ROOT / "tests" / "spark_apps" / "session_restart.py"
OUTSIDE = ROOT / "tests" / "spark_apps" / "outside_messages.py"
KEY_HEX = bytes(range(32)).hex()
RESTART_ROWS = 6000  # the rate source's rows: 6 s of them, the stop after a third is read
LIMIT = 500  # s: one application on a loaded 2-core machine


def session_restart(work: Path) -> dict[str, object]:
    run = subprocess.run(
        [sys.executable, str(RESTART_APP), KEY_HEX, str(work), str(RESTART_ROWS)],
        capture_output=True, text=True, timeout=LIMIT, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def check_every_row_once(result: dict[str, object]) -> None:
    assert result["error"] is None, result["error"]  # a query's exception, with its message
    assert result["rows"] == result["distinct"] == result["values"] == RESTART_ROWS, result
    assert result["in_range"]


# On demand: Spark may still run the stopped session's query on the checkpoint.
@pytest.mark.skipif(
    os.environ.get("EPISUB_ONDEMAND") != "1",
    reason="on demand (EPISUB_ONDEMAND=1)",
)
def test_a_session_stopped_mid_stream_and_started_again_in_the_process_reads_each_row_once(
    tmp_path: Path,
) -> None:
    """A `rate` source writes to a topic while an episub reader writes it to parquet;
    `spark.stop()` while both run, a new session, `register` with the same key, both
    restarted from their checkpoints: no DataLossError, each row once."""
    check_every_row_once(session_restart(tmp_path))


@pytest.mark.skipif(os.environ.get("EPISUB_ONDEMAND") != "1", reason="on demand: EPISUB_ONDEMAND=1")
@pytest.mark.parametrize("run", range(10))
def test_the_session_restart_reads_each_row_once_again(tmp_path: Path, run: int) -> None:
    """The test above, ten times (one application each: `-k again`)."""
    result = session_restart(tmp_path)
    print(f"run {run}: {json.dumps(result)}", flush=True)
    check_every_row_once(result)


def test_many_one_row_messages_held_only_by_a_node_outside_spark_are_read_once(
    tmp_path: Path,
) -> None:
    """30,000 messages of one row each, published into an `episub node` before Spark
    starts: a batch read and an availableNow stream read each seq exactly once."""
    run = subprocess.run(
        [sys.executable, str(OUTSIDE), "--rows", "30000", "--master", "local[2]",
         "--out", str(tmp_path / "result.json")],
        capture_output=True, text=True, timeout=LIMIT, check=False, cwd=ROOT,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    result = json.loads((tmp_path / "result.json").read_text())
    for read in ("batch", "stream"):
        assert result[read]["exact"] and result[read]["distinct"] == 30000, result[read]


def test_a_data_loss_message_lists_each_node_asked_with_what_it_holds_or_no_answer() -> None:
    from episub.agent.client import NodeHoldings
    from episub.proto.messages import HeldSpan
    from spark_connector.planner import Range
    from spark_connector.source import _holders_now

    class Agent:  # the executor's agent, answering Holdings as it would
        def holdings(self, topic: str, **asked: object) -> list[NodeHoldings]:
            self.asked = (topic, asked)
            span = HeldSpan(publisher=b"p", first_seq=0, last_seq=49, count=50)
            return [
                NodeHoldings(node_id=b"me", address="10.0.0.1:7000", answered=True, spans=[]),
                NodeHoldings(b"h1", "10.0.0.2:7000", answered=True, spans=[span]),
                NodeHoldings(b"h2", "10.0.0.3:7000", answered=False, spans=[]),
            ]

    agent = Agent()
    text = _holders_now(agent, Range("t", "p", 0, 99, holders=(b"h1", b"h2")), 0, 99)
    assert text == (
        "this executor's node: holds none; 10.0.0.2:7000: holds 0..49 (50 seqs); "
        "10.0.0.3:7000: no answer"
    )
    topic, asked = agent.asked
    assert topic == "t" and asked["neighbors"] is True and list(asked["peers"]) == [b"h1", b"h2"]
