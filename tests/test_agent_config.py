"""Live configuration through agents (real processes, real sockets): reads, writes, a
restarted agent catching up from its neighbour, and bad writes refused."""

from __future__ import annotations

import json
import os
import signal

import pytest

from episub.agent import AgentClient, AgentError, AgentTooLarge, AgentWaitExpired, ensure_agent
from tests.proc_helpers import KEY, WAIT, Processes, wait_process_gone

pytestmark = pytest.mark.timeout(120)


def start_agent(
    processes: Processes, name: str, bootstrap: tuple[str, ...] = ()
) -> tuple[str, str, int]:
    path = str(processes.dir / f"{name}.sock")
    info = ensure_agent(
        path, key=KEY, bootstrap=bootstrap, owner_pid=os.getpid(), idle_timeout=60.0
    )
    processes.pids.append(info.pid)
    return path, info.address, info.pid


def test_a_write_reaches_the_other_agent_and_a_restarted_agent_catches_up(
    processes: Processes,
) -> None:
    first, address, _ = start_agent(processes, "first")
    second, _, second_pid = start_agent(processes, "second", (address,))
    with AgentClient(first) as a, AgentClient(second) as b:
        # The first agent's replica starts the topic; the second joins it through that agent
        # (a topic is joined through a node already in it).
        assert a.config_read("flags").version == 0
        assert b.config_read("flags").version == 0
        for n in range(1, 11):
            view = a.config_write("flags", {"threshold": n / 10, "model": b"\x00\x01"})
            assert view.version == n
        view = a.config_write("flags", delete=["model"])
        seen = b.config_read("flags", min_version=11, timeout=WAIT)
        assert (seen.version, seen.values) == (11, {"threshold": 1.0})
    os.kill(second_pid, signal.SIGKILL)
    wait_process_gone(second_pid)
    second, _, _ = start_agent(processes, "second", (address,))
    with AgentClient(second) as b:
        view = b.config_read("flags")  # the new replica asked its neighbour on start
        assert (view.version, view.values) == (11, {"threshold": 1.0})


def test_bad_writes_are_refused_with_a_clear_error_and_change_nothing(
    processes: Processes,
) -> None:
    path, _, _ = start_agent(processes, "only")
    with AgentClient(path) as client:
        client.config_write("c", {"kept": 1})
        with pytest.raises(AgentError, match="more than its limit of 524288") as info:
            client.config_write("c", {"huge": b"x" * 600_000, "kept": 2})
        assert isinstance(info.value, AgentTooLarge)
        with pytest.raises(TypeError, match="bytes or JSON-serialisable"):
            client.config_write("c", {"bad": object()})
        with pytest.raises(AgentError, match="a config key must be"):
            client.config_write("c", {"": 1})
        with pytest.raises(AgentError, match="not yet 5") as info:
            client.config_read("c", min_version=5, timeout=0.2)
        assert isinstance(info.value, AgentWaitExpired)
        view = client.config_read("c")
        assert (view.version, view.values) == (1, {"kept": 1})


def test_the_config_command_writes_through_a_temporary_node_and_reads_through_an_agent(
    processes: Processes,
) -> None:
    path, address, _ = start_agent(processes, "agent")
    with AgentClient(path) as client:
        client.config_read("default")  # the agent's replica is in the topic first
    wrote = processes.episub(
        "config", "set", "--bootstrap", address, "threshold=0.7", "mode=fast", "--repeat", "2"
    )
    assert json.loads(wrote.read_line())["version"] == 2
    assert wrote.wait() == 0, wrote.stderr_text()
    read = processes.episub("config", "get", "--agent", path, "mode")
    assert json.loads(read.read_line()) == "fast"
    bad = processes.episub("config", "set", "--agent", path, "novalue")
    assert bad.wait() == 2
    assert bad.stderr_text().strip().splitlines() == [
        "episub config: error: give KEY=VALUE, not 'novalue'"
    ]


def test_an_agent_keeps_what_its_config_file_retention_allows(processes: Processes) -> None:
    config = processes.dir / "node.json"
    config.write_text(json.dumps({"retention": {"max_messages": 3}}))
    path = str(processes.dir / "small.sock")
    info = ensure_agent(path, key=KEY, owner_pid=os.getpid(), config_file=str(config))
    processes.pids.append(info.pid)
    with AgentClient(path) as client:
        client.join("events")
        client.publish_batch("events", [b"%d" % i for i in range(5)])
        stats = client.inspect().stats
    # Its own publishes are retained (docs/spark.md): the oldest two made room.
    assert (stats["published"], stats["retained_messages"]) == (5, 3)
