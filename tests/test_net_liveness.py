"""Liveness between real processes once pings are sparse (docs/protocol.md, "Liveness").

A settled node pings each neighbour MembershipConfig.settled_upkeep times less often; a
peer whose process dies is seen through its kernel (FIN/RST) at once, a dead host through
TCP keepalive, and a process that hangs while its kernel still answers for it through the
app's pings: two of them missed (runtime.LIVENESS_PINGS) at the settled pace.
"""

from __future__ import annotations

import os
import signal

import pytest

from episub.agent import AgentClient
from tests.proc_helpers import TOPIC, Processes, is_alive, node_ready, start_node, wait_until

pytestmark = pytest.mark.timeout(240)


def test_a_stopped_process_is_dropped_by_its_silence_and_a_killed_one_by_its_kernel(
    processes: Processes,
) -> None:
    names = ("a", "b", "c", "d")
    config = processes.config_file()  # FAST_CONFIG: settled pings every ~3 s, liveness ~9.5 s
    procs = {"a": start_node(processes, "a", config=config)}
    addresses = {"a": node_ready(procs["a"])[1]}
    for name in names[1:]:
        procs[name] = start_node(processes, name, bootstrap=[addresses["a"]], config=config)
        addresses[name] = node_ready(procs[name])[1]
    sockets = {name: str(processes.dir / f"{name}.sock") for name in names}

    def view(name: str) -> set[str]:
        with AgentClient(sockets[name]) as client:
            return {n.address for n in client.inspect().topics.get(TOPIC, [])}

    for name in names:
        others = {addresses[n] for n in names if n != name}
        wait_until(lambda name=name, others=others: view(name) == others, what=f"{name} full")

    # SIGSTOP: the kernel still ACKs for "d" and keeps its connections open; only the
    # app's silence tells.
    stopped = procs["d"].pid
    os.kill(stopped, signal.SIGSTOP)
    try:
        for name in ("a", "b", "c"):
            wait_until(
                lambda name=name: addresses["d"] not in view(name),
                what=f"{name} drops the stopped d",
            )
        assert is_alive(stopped)
        with AgentClient(sockets["a"]) as client:
            assert client.inspect().stats["peers_lost"] >= 1
    finally:
        os.kill(stopped, signal.SIGCONT)
    procs["d"].popen.kill()

    # SIGKILL: the dead process's kernel closes its connections for it.
    procs["c"].popen.kill()
    procs["c"].popen.wait()
    for name in ("a", "b"):
        wait_until(
            lambda name=name: view(name) == {addresses[n] for n in ("a", "b") if n != name},
            what=f"{name} drops the killed c",
        )
