"""The `episub` command as a user runs it: real processes, exit statuses, stdout/stderr.

An error is one line on stderr and status 2 (bad arguments, key, config) or 1 (nothing
answers), never a traceback; publish and subscribe round-trip through agents and through
temporary nodes.
"""

from __future__ import annotations

import base64
import json
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import episub
from episub.agent import AgentClient
from tests.proc_helpers import (
    TOPIC,
    WAIT,
    Processes,
    env,
    node_ready,
    start_node,
    wait_for_neighbour,
    wait_until,
)

pytestmark = pytest.mark.timeout(90)


def run_episub(*args: str, environ: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "episub.cli", *args],
        capture_output=True,
        text=True,
        timeout=WAIT,
        env=environ or env(),
        stdin=subprocess.DEVNULL,
    )


def assert_one_line_error(result: subprocess.CompletedProcess, status: int, *words: str) -> None:
    assert result.returncode == status, (result.returncode, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for word in words:
        assert word in lines[0], lines[0]


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["node", "--bogus"], ["unrecognized arguments: --bogus"]),
        (["node", "--listen", "nonsense"], ["--listen", "'nonsense'"]),
        (["node", "--bootstrap", "10.0.0.1"], ["--bootstrap", "'10.0.0.1'"]),
        (["agent", "--idle-timeout", "-1", "--socket", "/tmp/x"], ["must be > 0", "-1"]),
        (["publish", "--topic", TOPIC, "x"], ["--agent PATH or --bootstrap ADDR"]),
        (["publish", "--agent", "/tmp/x.sock"], ["--topic"]),
        (["subscribe", "--topic", TOPIC, "--count", "0", "--agent", "/x"], ["--count", "0"]),
        (["inspect"], ["--agent"]),
        (["publish", "--agent", "/x", "--topic", "", "v"], ["--topic", "topic name"]),
        (["node", "--topic", ""], ["--topic", "topic name"]),
        (["publish", "--agent", "/x", "--topic", TOPIC, "--lines", "v"], ["give one of"]),
    ],
    ids=[
        "unknown option",
        "bad listen address",
        "bootstrap without port",
        "negative idle timeout",
        "publish without target",
        "publish without topic",
        "zero count",
        "inspect without agent",
        "empty topic to publish",
        "empty topic to join",
        "values and --lines",
    ],
)
def test_bad_arguments_give_one_line_and_status_2(args: list[str], words: list[str]) -> None:
    assert_one_line_error(run_episub(*args), 2, *words)


def test_a_missing_or_malformed_key_gives_one_line(tmp_path: Path) -> None:
    no_key = {k: v for k, v in env().items() if k != "EPISUB_KEY"}
    assert_one_line_error(run_episub("node", environ=no_key), 2, "EPISUB_KEY", "--key-file")
    short = {**env(), "EPISUB_KEY": "abcd"}
    assert_one_line_error(run_episub("node", environ=short), 2, "64 hex characters", "got 4")
    key_file = tmp_path / "key"
    key_file.write_bytes(b"\x00" * 31)
    result = run_episub("node", "--key-file", str(key_file))
    assert_one_line_error(result, 2, str(key_file), "31 bytes")
    result = run_episub("node", "--key-file", str(tmp_path / "absent"))
    assert_one_line_error(result, 2, "cannot read key file", "absent")


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ('{"membership": {"c_randd": 1}}', ["unknown setting 'c_randd'"]),
        ('{"broadcast": {"ihave_interval": 0}}', ["ihave_interval must be > 0, not 0"]),
        ('{"retention": {"max_agee": 60}}', ["retention: unknown setting 'max_agee'"]),
        ('{"retention": {"max_age": 0}}', ["max_age must be > 0 seconds, not 0"]),
        ('{"retention": {"max_messages": 0}}', ["max_messages must be an int >= 1, not 0"]),
        (
            '{"broadcast": {"cache_ttl": 60}}',
            ["'cache_ttl' is now the 'retention' section's 'max_age'"],
        ),
        ('{"retention": {"max_messages": "many"}}', ["max_messages must be a number"]),
    ],
)
def test_a_bad_config_file_gives_one_line(tmp_path: Path, content: str, words: list[str]) -> None:
    config = tmp_path / "config.json"
    config.write_text(content)
    assert_one_line_error(run_episub("node", "--config", str(config)), 2, *words)


def test_an_unreachable_bootstrap_gives_one_line_and_status_1() -> None:
    # Port 1 on loopback: nothing listens there, the dial is refused at once.
    result = run_episub("publish", "--bootstrap", "127.0.0.1:1", "--topic", TOPIC, "x")
    assert_one_line_error(result, 1, "could not reach any bootstrap address", "127.0.0.1:1")
    result = run_episub(
        "node", "--bootstrap", "127.0.0.1:1", "--topic", TOPIC, "--bootstrap-timeout", "0"
    )
    assert_one_line_error(result, 1, "127.0.0.1:1")


def test_a_node_started_before_its_bootstrap_node_waits_for_it_and_joins(
    processes: Processes,
) -> None:
    # A free port, closed again: the bootstrap node listens there once the joiner has
    # been refused (as with nodes started together with `&`).
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{probe.getsockname()[1]}"
    joiner = start_node(processes, "b", bootstrap=[address], config=processes.config_file())
    wait_until(lambda: "trying again" in joiner.stderr_text(), what="the joiner's retry notice")
    notice = joiner.stderr_text()
    assert "could not reach any bootstrap address" in notice and address in notice, notice
    assert joiner.popen.poll() is None, "the joiner gave up at the first refusal"
    first = start_node(processes, "a", listen=address, config=processes.config_file())
    node_ready(first)
    node_ready(joiner)
    wait_for_neighbour(str(processes.dir / "b.sock"))
    with AgentClient(str(processes.dir / "b.sock")) as client:
        assert [n.address for n in client.inspect().topics[TOPIC]] == [address]


def test_an_absent_agent_gives_one_line_and_status_1(tmp_path: Path) -> None:
    missing = str(tmp_path / "none.sock")
    for command in (["inspect"], ["publish", "--topic", TOPIC, "x"], ["subscribe", "--topic", "t"]):
        result = run_episub(*command, "--agent", missing)
        assert_one_line_error(result, 1, "no agent answers at", "none.sock")


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    result = run_episub("--debug", "inspect", "--agent", str(tmp_path / "none.sock"))
    assert result.returncode == 1
    assert "Traceback" in result.stderr


def test_publish_and_subscribe_round_trip_through_agents_and_a_temporary_node(
    processes: Processes,
) -> None:
    first = start_node(processes, "a", config=processes.config_file())
    id_a, address = node_ready(first)
    second = start_node(processes, "b", bootstrap=[address], config=processes.config_file())
    node_ready(second)
    socket_a, socket_b = (str(processes.dir / f"{n}.sock") for n in "ab")
    wait_for_neighbour(socket_b)
    subscriber = processes.episub(
        "subscribe", "--agent", socket_b, "--topic", TOPIC, "--json", "--count", "4",
        merge_stderr=True,
    )  # fmt: skip
    assert subscriber.read_line() == f"subscribed to {TOPIC!r}"
    published = run_episub(
        "publish", "--agent", socket_a, "--topic", TOPIC, "--key", "k", "--header", "h=v",
        "one", "two", "three",
    )  # fmt: skip
    assert published.returncode == 0, published.stderr
    ids = [line.split() for line in published.stdout.splitlines()]
    assert [seq for seq, _ in ids] == ["0", "1", "2"]
    # A temporary node joins through `a`, publishes stdin (not UTF-8), and leaves.
    alone = subprocess.run(
        [sys.executable, "-m", "episub.cli", "publish", "--bootstrap", address, "--topic", TOPIC],
        input=b"\xff\xfe\n",
        capture_output=True,
        timeout=WAIT,
        env=env(),
    )
    assert alone.returncode == 0, alone.stderr
    lines = [json.loads(subscriber.read_line()) for _ in range(4)]
    assert subscriber.wait() == 0
    assert [(m["value"], m["seq"], m["id"]) for m in lines[:3]] == [
        ("one", 0, ids[0][1]),
        ("two", 1, ids[1][1]),
        ("three", 2, ids[2][1]),
    ]
    assert lines[0]["key"] == "k" and lines[0]["headers"] == [{"name": "h", "value": "v"}]
    # stdin without --lines is one value, its newline and all
    assert (lines[3]["value"], lines[3]["value_encoding"]) == ("//4K", "base64")
    assert lines[3]["publisher"] != lines[0]["publisher"]
    # One spelling of a publisher id: the banner's peer id is subscribe --json's publisher.
    assert lines[0]["publisher"] == id_a
    assert episub.parse_publisher(id_a) == episub.format_publisher(id_a.encode()).encode()
    inspected = run_episub("inspect", "--agent", socket_b, "--json")
    status = json.loads(inspected.stdout)
    assert status["stats"]["delivered"] == 4
    assert {n["address"] for n in status["topics"][TOPIC]} >= {address}


def test_generated_payloads_from_a_temporary_node_reach_an_agent_subscriber(
    processes: Processes,
) -> None:
    node = start_node(processes, "a", config=processes.config_file())
    _, address = node_ready(node)
    socket_a = str(processes.dir / "a.sock")
    subscriber = processes.episub(
        "subscribe", "--agent", socket_a, "--topic", TOPIC, "--count", "50", merge_stderr=True
    )
    assert subscriber.read_line() == f"subscribed to {TOPIC!r}"
    result = run_episub(
        "publish", "--bootstrap", address, "--topic", TOPIC, "--count", "50", "--size", "20"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"published 50 messages to {TOPIC!r} as 127.0.0.1:")
    values = [subscriber.read_line() for _ in range(50)]
    assert subscriber.wait() == 0
    assert values[0] == "0 " + "x" * 18 and values[49].startswith("49 ")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_node_exits_cleanly_on_a_signal_and_its_neighbour_sees_it_leave(
    processes: Processes, signum: int
) -> None:
    first = start_node(processes, "a", config=processes.config_file())
    _, address = node_ready(first)
    second = start_node(processes, "b", bootstrap=[address], config=processes.config_file())
    node_ready(second)
    socket_a, socket_b = (str(processes.dir / f"{n}.sock") for n in "ab")
    wait_for_neighbour(socket_a)
    second.popen.send_signal(signum)
    assert second.wait() == 0, second.stderr_text()
    assert "Traceback" not in second.stderr_text()
    assert not Path(socket_b).exists(), "the node left its socket file behind"
    with AgentClient(socket_a) as client:
        # LEAVE, not a lost connection: the departure is announced, so the view empties.
        wait_until(lambda: not client.inspect().topics[TOPIC], what="the neighbour gone")
        assert client.inspect().stats["peers_lost"] == 0


def test_publish_takes_a_file_or_stdin_as_one_value_and_lines_only_when_asked(
    processes: Processes, tmp_path: Path
) -> None:
    node = start_node(processes, "a", config=processes.config_file())
    node_ready(node)
    socket_a = str(processes.dir / "a.sock")
    subscriber = processes.episub(
        "subscribe", "--agent", socket_a, "--topic", TOPIC, "--json", "--count", "5",
        merge_stderr=True,
    )  # fmt: skip
    assert subscriber.read_line() == f"subscribed to {TOPIC!r}"
    blob = bytes(range(256)) * 8 + b"\n\n" + bytes(range(255, -1, -1))  # newlines inside
    (tmp_path / "blob.bin").write_bytes(blob)
    target = ("--agent", socket_a, "--topic", TOPIC)
    by_file = run_episub("publish", *target, "--file", str(tmp_path / "blob.bin"))
    assert by_file.returncode == 0 and len(by_file.stdout.splitlines()) == 1, by_file
    by_stdin = subprocess.run(
        [sys.executable, "-m", "episub.cli", "publish", *target],
        input=blob, capture_output=True, timeout=WAIT, env=env(),
    )  # fmt: skip
    assert by_stdin.returncode == 0 and len(by_stdin.stdout.splitlines()) == 1, by_stdin
    by_lines = subprocess.run(
        [sys.executable, "-m", "episub.cli", "publish", *target, "--lines"],
        input=b"one\ntwo\nthree\n", capture_output=True, timeout=WAIT, env=env(),
    )  # fmt: skip
    assert by_lines.returncode == 0 and len(by_lines.stdout.splitlines()) == 3, by_lines
    values = [json.loads(subscriber.read_line()) for _ in range(5)]
    assert [base64.b64decode(v["value"]) for v in values[:2]] == [blob, blob]
    assert [v["value"] for v in values[2:]] == ["one", "two", "three"]


def test_each_size_limit_error_names_the_limit_and_what_raises_it(
    processes: Processes, tmp_path: Path
) -> None:
    node = start_node(processes, "a", config=processes.config_file())
    node_ready(node)
    socket_a = str(processes.dir / "a.sock")
    big = tmp_path / "big.bin"
    big.write_bytes(b"x" * (1024 * 1024 + 1))  # one byte over max_message_size's default
    result = run_episub("publish", "--agent", socket_a, "--topic", TOPIC, "--file", str(big))
    assert_one_line_error(result, 1, "max_message_size (1048576 bytes)", "--config", "BYTES")
    huge = tmp_path / "huge.bin"
    huge.write_bytes(b"x" * (33 * 1024 * 1024))  # over an agent request's fixed 32 MiB
    result = run_episub("publish", "--agent", socket_a, "--topic", TOPIC, "--file", str(huge))
    assert_one_line_error(result, 1, "agent request", "no option raises", "episub.Node")


def test_inspect_shows_the_counters_above_zero_and_all_of_them_with_all(
    processes: Processes,
) -> None:
    node = start_node(processes, "a", config=processes.config_file())
    node_ready(node)
    socket_a = str(processes.dir / "a.sock")
    published = run_episub("publish", "--agent", socket_a, "--topic", TOPIC, "hello")
    assert published.returncode == 0, published.stderr
    every = json.loads(run_episub("inspect", "--agent", socket_a, "--json").stdout)["stats"]
    zero = sorted(name for name, value in every.items() if value == 0)
    assert zero and every["published"] == 1

    def counters(*extra: str) -> dict[str, str]:
        text = run_episub("inspect", "--agent", socket_a, *extra).stdout
        block = text.split("counters", 1)[1].splitlines()[1:]
        return dict(line.split() for line in block)

    shown = counters()
    # Only counters above zero are shown; one at zero in the JSON may have moved since
    # (the agent's uptime passes a second between the two calls), never the other way.
    assert shown["published"] == "1" and "0" not in shown.values()
    assert set(counters("--all")) == set(every)
    assert set(zero) & set(shown) <= {"agent_uptime_s"}
