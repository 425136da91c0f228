"""An outsider without the key cannot starve honest joiners of handshake slots.

Issue 13, item 4: ~11 connections a second that never finished the handshake kept all 64
slots full, every honest joiner was refused, and each failure logged ~200 bytes.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

import pytest

from episub.agent import AgentClient
from episub.net.admission import HandshakeSlots, source_of
from episub.net.handshake import FAILURE_REASONS
from episub.net.log_limit import LogLimiter
from tests.proc_helpers import TOPIC, Processes, node_ready, start_node, wait_for_neighbour

pytestmark = pytest.mark.timeout(180)

OUTSIDER = Path(__file__).resolve().parent / "outsider_client.py"
ATTACK_SECONDS = 90  # the attacker's own bound; the test ends it sooner (stdin closed)
# Paced so that each of the attacker's connections (it holds its newest 800) stays open
# longer than a handshake may take under pressure: flat out, the target can lag 800
# connections behind and find each one closed already, and no slot is ever cut.
ATTACK_RATE = 400
MESSAGES = 30


def test_an_honest_node_joins_and_receives_while_an_outsider_floods_slow_handshakes(
    processes: Processes,
) -> None:
    target = start_node(processes, "target")
    _, target_address = node_ready(target)
    attacker = processes.start(
        [sys.executable, str(OUTSIDER), "--mode", "slow", "--target", target_address,
         "--source", "127.0.0.2", "--seconds", str(ATTACK_SECONDS),
         "--rate", str(ATTACK_RATE)],
        name="attacker",
        stdin=True,
    )  # fmt: skip
    # Well past the 64 slots before the honest node dials: the attack is in full swing.
    while attacker.read_line() != "OPENED 300":
        pass
    honest = start_node(processes, "honest", bootstrap=[target_address])
    node_ready(honest)  # `episub node` exits with an error if the join failed
    honest_socket = str(processes.dir / "honest.sock")
    wait_for_neighbour(honest_socket)
    with AgentClient(honest_socket) as reader, AgentClient(str(processes.dir / "target.sock")) as w:
        subscription = reader.subscribe(TOPIC)
        for i in range(MESSAGES):
            w.publish(TOPIC, b"m%d" % i)
        got = []
        while len(got) < MESSAGES:
            item = subscription.receive(timeout=60)
            assert item is not None, f"got {got} only"
            got.append(item.value)
        assert got == [b"m%d" % i for i in range(MESSAGES)]
        # The attack was real: slots were taken from it (evicted, or cut by the deadline).
        # Under load the target may still be draining its accept queue when the honest
        # messages are in, so wait (bounded) for its counters while the attack goes on.
        deadline = time.monotonic() + 60
        done = ""
        while True:
            stats = w.inspect().stats
            taken = stats["handshake_failed_evicted"] + stats["handshake_failed_timeout"]
            enough = taken > 0 and stats["handshake_failures"] > 100
            if enough or done or time.monotonic() > deadline:
                break
            line = attacker.read_line()  # the attacker reports each batch it opens
            done = line if line.startswith("DONE") else ""
    attacker.popen.stdin.close()  # type: ignore[union-attr]
    while not done.startswith("DONE"):
        done = attacker.read_line()
    words = done.split()
    assert int(words[1]) > 300, words
    shown = {k: v for k, v in stats.items() if k.startswith(("handshake", "connection"))}
    assert stats["handshake_failed_evicted"] + stats["handshake_failed_timeout"] > 0, shown
    # Hundreds of failures, logged at most once a minute per reason: a few lines.
    failures = stats["handshake_failures"]
    lines = [line for line in target.stderr_text().splitlines() if "handshake with" in line]
    assert failures > 100 and len(lines) <= 2 * len(FAILURE_REASONS), (failures, lines)


# -- the slots' rules, with explicit times --------------------------------------------


def test_a_full_house_evicts_the_oldest_handshake_of_the_source_holding_the_most() -> None:
    slots = HandshakeSlots(timeout=5.0, capacity=4)
    a1 = slots.open("10.0.0.1", 0.0)
    b1 = slots.open("10.0.0.2", 1.0)
    a2 = slots.open("10.0.0.1", 2.0)
    b2 = slots.open("10.0.0.2", 3.0)
    # Full; both sources hold two: the oldest of them goes, whatever its source.
    c1 = slots.open("10.0.0.3", 4.0)
    assert a1.evicted and a1.scope.cancel_called
    # Now 10.0.0.2 holds the most (two): its oldest goes, never the newcomers' one slot.
    slots.open("10.0.0.1", 5.0)
    assert b1.evicted and not (a2.evicted or b2.evicted or c1.evicted)
    assert len(slots) == 4


def test_a_flooding_source_only_ever_evicts_its_own_handshakes() -> None:
    slots = HandshakeSlots(timeout=5.0, capacity=8)
    honest = slots.open("127.0.0.1", 0.0)
    flood = [slots.open("127.0.0.2", 0.001 * i) for i in range(1, 1000)]
    assert not honest.evicted and len(slots) == 8
    assert sum(not p.evicted for p in flood) == 7  # the newest seven


def test_under_pressure_every_handshake_must_finish_within_the_short_deadline() -> None:
    slots = HandshakeSlots(timeout=5.0, capacity=4, pressure_timeout=1.0)
    first = slots.open("10.0.0.1", 10.0)
    assert first.scope.deadline == 15.0 and not slots.under_pressure
    second = slots.open("10.0.0.2", 10.5)  # half the slots: pressure
    assert slots.under_pressure
    assert (first.scope.deadline, second.scope.deadline) == (11.0, 11.5)
    slots.close(first)
    slots.close(first)  # closing twice is harmless
    third = slots.open("10.0.0.3", 12.0)
    assert third.scope.deadline == 13.0 and len(slots) == 2
    slots.close(second)
    slots.close(third)
    assert slots.open("10.0.0.3", 20.0).scope.deadline == 25.0  # pressure is over


@pytest.mark.parametrize(
    ("host", "source"),
    [
        ("127.0.0.2", "127.0.0.2"),
        ("::ffff:10.1.2.3", "10.1.2.3"),
        ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"),
        ("2001:db8:1:2:bbbb::9", "2001:db8:1:2::/64"),
        ("fe80::1%eth0", "fe80::/64"),
        ("", ""),
    ],
)
def test_a_source_is_an_ipv4_address_or_an_ipv6_slash_64(host: str, source: str) -> None:
    assert source_of(host) == source


def test_the_log_limiter_lets_one_line_per_kind_through_per_interval_and_counts_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    logger = logging.getLogger("tests.log_limit")
    limiter = LogLimiter(logger, interval=60.0)
    with caplog.at_level(logging.WARNING, logger="tests.log_limit"):
        assert limiter.log("timeout", 0.0, logging.WARNING, "failed %s", "a")
        assert limiter.log("closed", 1.0, logging.WARNING, "failed %s", "b")  # another kind
        for i in range(500):
            assert not limiter.log("timeout", 1.0 + i / 10, logging.WARNING, "failed %s", i)
        assert limiter.log("timeout", 70.0, logging.WARNING, "failed %s", "c")
        assert not limiter.log("timeout", 71.0, logging.WARNING, "failed %s", "d")
    assert [r.getMessage() for r in caplog.records] == [
        "failed a",
        "failed b",
        "failed c (and 500 more like it in the last 70 s, not logged)",
    ]
