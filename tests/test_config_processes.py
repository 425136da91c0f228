"""Live configuration between real `episub node` processes on 127.0.0.1, through their agents,
with the configuration topic's own overlay rules (NodeConfig.topic_membership: random links
only, no optimisation): every reader holds every write, and the readers carry on when the
writer's node, the bootstrap node of all, is killed and another node writes."""

from __future__ import annotations

import pytest

from episub.agent import AgentClient
from episub.config import config_topic
from tests.proc_helpers import WAIT, Processes, node_ready, start_node, wait_until

pytestmark = pytest.mark.timeout(200)

NODES = 6
WRITES = 30
NAME = "default"


def test_six_processes_hold_every_write_and_survive_the_writers_node(
    processes: Processes,
) -> None:
    config = processes.config_file()
    names = [f"n{i}" for i in range(NODES)]
    first = start_node(processes, names[0], config=config)
    procs = {names[0]: first}
    contact = node_ready(first)[1]
    for name in names[1:]:
        procs[name] = start_node(processes, name, config=config, bootstrap=[contact])
    for name in names[1:]:
        node_ready(procs[name])
    sockets = {name: str(processes.dir / f"{name}.sock") for name in names}
    topic = config_topic(NAME)
    for name in names:  # each agent starts its replica on first use, and catches up
        with AgentClient(sockets[name]) as client:
            assert client.config_read(NAME).version == 0

    with AgentClient(sockets["n0"]) as writer:
        for i in range(1, WRITES + 1):
            assert writer.config_write(NAME, {f"k{i}": i}).version == i
    expected = {f"k{i}": i for i in range(1, WRITES + 1)}
    for name in names[1:]:
        with AgentClient(sockets[name]) as client:
            view = client.config_read(NAME, min_version=WRITES, timeout=WAIT)
            assert view.version == WRITES and view.values == expected, name

    procs["n0"].popen.kill()  # the writer's node, and the bootstrap node of every other
    procs["n0"].popen.wait(WAIT)
    survivors = names[1:]

    def rid_of_n0() -> bool:  # every survivor has dropped the dead node and kept a link
        for name in survivors:
            with AgentClient(sockets[name]) as client:
                links = client.inspect().topics.get(topic, [])
                if not links or contact in {link.address for link in links}:
                    return False
        return True

    wait_until(rid_of_n0, what="survivors linked without the killed node")
    with AgentClient(sockets["n1"]) as second:
        assert second.config_write(NAME, {"after": True}).version == WRITES + 1
    for name in survivors[1:]:
        with AgentClient(sockets[name]) as client:
            view = client.config_read(NAME, min_version=WRITES + 1, timeout=WAIT)
            assert view.values == {**expected, "after": True}, name
