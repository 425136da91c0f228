"""Every example in examples/ runs to the end (smoke runs), so the docs quoting them stay
true. Each runs as its own OS process with its own Spark (local[2])."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="the examples need the spark extra")
pytestmark = [pytest.mark.timeout(400), pytest.mark.spark]

EXAMPLES = Path(__file__).parent.parent / "examples"


def run_example(name: str) -> str:
    run = subprocess.run(
        [sys.executable, str(EXAMPLES / name)], capture_output=True, text=True, timeout=360
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout


def test_the_quickstart_reads_all_ten_messages() -> None:
    assert "read 10 messages from topic 'events'" in run_example("quickstart.py")


def test_the_live_config_example_sees_every_change_in_the_running_query() -> None:
    out = run_example("live_config.py")
    assert "tasks saw threshold [50]" in out and "tasks saw threshold [10]" in out
    assert "every change reached the running query" in out


def test_the_signed_publishing_example_delivers_and_keeps_an_unsigned_node_out() -> None:
    out = run_example("signed_publishing.py")
    assert "b got b'pay 10'" in out and "signed=1, bad_signatures=0" in out
    assert "a node that does not sign cannot join: peer signs its messages" in out


def test_the_kafka_users_example_reads_the_outside_service_and_shows_lag_and_metrics() -> None:
    out = run_example("from_kafka.py")
    assert "first micro-batch: 50 rows, 150 behind" in out
    assert "read 200 orders from outside" in out
    assert "wrote 100 refunds with acks=all; seqs 10..19 of one stream: 10 rows" in out
    assert "driver node at" in out and "executor node at" in out
    assert "metrics at http://127.0.0.1:" in out


def test_the_publish_many_example_delivers_a_thousand_records_in_order() -> None:
    out = run_example("publish_many.py")
    assert "published 1000 records: seqs 0..999" in out
    assert "b received 1000 records, in order: True" in out
    assert "refused where it was made: value must be bytes, not str" in out


def test_every_example_has_a_smoke_test() -> None:
    tested = {
        "quickstart.py",
        "live_config.py",
        "signed_publishing.py",
        "from_kafka.py",
        "publish_many.py",
    }
    assert {p.name for p in EXAMPLES.glob("*.py")} == tested
