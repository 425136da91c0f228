"""A process's copy of a configuration (spark_connector/config_follower.py) and a
`config.watch` watcher, against real agent processes: they follow writes, never go
backwards, and follow the next agent at the same socket when theirs is killed."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from episub.agent import AgentClient, ensure_agent
from tests.proc_helpers import KEY, WAIT, Processes, wait_process_gone, wait_until

pytest.importorskip("pyspark", reason="spark_connector needs the spark extra")
from spark_connector.config import Watch
from spark_connector.config_follower import Follower

pytestmark = pytest.mark.timeout(120)


def start_agent(processes: Processes, path: str) -> int:
    info = ensure_agent(path, key=KEY, owner_pid=os.getpid(), idle_timeout=60.0)
    processes.pids.append(info.pid)
    return info.pid


def test_the_copy_follows_writes_never_goes_back_and_steps_aside_without_its_agent(
    processes: Processes,
) -> None:
    path = str(processes.dir / "agent.sock")
    pid = start_agent(processes, path)
    follower = Follower("flags", lambda: AgentClient(path))
    try:
        with AgentClient(path) as client:
            first = client.config_write("flags", {"n": 1})
            assert follower.offer(first) == first
            for n in range(2, 6):
                client.config_write("flags", {"n": n})
        # The thread's long poll brings every later version, with no call of ours.
        wait_until(lambda: (v := follower.current()) is not None and v.version == 5,
                   what="the copy at version 5")  # fmt: skip
        assert follower.current().values == {"n": 5}  # type: ignore[union-attr]
        assert follower.offer(first).version == 5  # an older view never replaces it

        os.kill(pid, signal.SIGKILL)
        wait_process_gone(pid)
        # Without its agent the copy serves nothing: callers read the agent (and fail).
        wait_until(lambda: follower.current() is None, what="the copy to step aside")

        start_agent(processes, path)  # a new agent, empty, at the same socket
        with AgentClient(path) as client:
            for n in range(1, 7):
                client.config_write("flags", {"n": 100 + n})  # versions 1..6 there
        wait_until(lambda: (v := follower.current()) is not None and v.version == 6,
                   what="the copy following the new agent")  # fmt: skip
        assert follower.current().values == {"n": 106}  # type: ignore[union-attr]
    finally:
        follower.stop()


def test_a_watch_calls_back_on_every_new_version_and_survives_an_agent_restart(
    processes: Processes,
) -> None:
    path = str(processes.dir / "agent.sock")
    pid = start_agent(processes, path)
    heard: list[tuple[int, dict]] = []
    reached: dict[int, threading.Event] = {v: threading.Event() for v in (0, 3, 5)}

    def callback(version: int, values: dict) -> None:
        heard.append((version, values))
        if version in reached:
            reached[version].set()

    watch = Watch(callback, "flags", lambda: AgentClient(path))
    try:
        assert reached[0].wait(WAIT), "no first call with the current (empty) configuration"
        with AgentClient(path) as client:
            for n in range(1, 4):
                client.config_write("flags", {"n": n})
            assert reached[3].wait(WAIT), heard
            os.kill(pid, signal.SIGKILL)
            wait_process_gone(pid)
        start_agent(processes, path)  # a new, empty agent: versions 1..5 there
        with AgentClient(path) as client:
            for n in range(1, 6):
                client.config_write("flags", {"n": 10 * n})
        assert reached[5].wait(WAIT), heard
    finally:
        watch.stop()
    versions = [v for v, _ in heard]
    assert versions == sorted(set(versions)), f"a version came twice or went back: {heard}"
    assert heard[0] == (0, {}) and (3, {"n": 3}) in heard and heard[-1] == (5, {"n": 50})
