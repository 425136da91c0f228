"""`episub inspect --draw` on six real `episub node` processes: the asked node walks the
overlay over the node wire (GETVIEW to each node it learns of), and the picture has one
disc per process.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from episub.agent import AgentClient
from tests.proc_helpers import TOPIC, WAIT, Processes, node_ready, start_node, wait_until

pytest.importorskip("matplotlib")
pytest.importorskip("networkx")

from episub.viz.overlay import NODE_COLOR
from tests.viz_helpers import count_nodes

pytestmark = pytest.mark.timeout(120)

NODES = 6


def six_nodes(processes: Processes) -> tuple[list[str], dict[str, str]]:
    config = processes.config_file()
    names = [f"n{i}" for i in range(NODES)]
    first = start_node(processes, names[0], config=config)
    addresses = {names[0]: node_ready(first)[1]}
    procs = {
        name: start_node(processes, name, config=config, bootstrap=[addresses["n0"]])
        for name in names[1:]
    }
    for name, proc in procs.items():
        addresses[name] = node_ready(proc)[1]
    return names, addresses


def sock(processes: Processes, name: str) -> str:
    return str(processes.dir / f"{name}.sock")


def walk(processes: Processes, name: str, **kwargs: object) -> list:
    with AgentClient(sock(processes, name)) as client:
        return client.overlay(TOPIC, timeout=5.0, **kwargs)  # type: ignore[arg-type]


def own_view(processes: Processes, name: str) -> set[str]:
    with AgentClient(sock(processes, name)) as client:
        return {n.address for n in client.inspect().topics.get(TOPIC, [])}


def test_overlay_walk_reaches_every_process_with_the_view_its_agent_reports(processes):
    _names, addresses = six_nodes(processes)
    by_address = {address: name for name, address in addresses.items()}

    def walked_views_match_the_agents() -> bool:
        nodes = walk(processes, "n3")
        if len(nodes) != NODES or not all(n.answered for n in nodes):
            return False
        # Each node's reported view, over the node wire, is the one its own agent shows
        # (6 nodes with room for 7 links each: every node ends linked to every other).
        return all(
            {n.address for n in node.neighbors} == own_view(processes, by_address[node.address])
            for node in nodes
        )

    wait_until(walked_views_match_the_agents, what="a walk agreeing with every agent")
    nodes = walk(processes, "n3")
    assert nodes[0].address == addresses["n3"]  # the asked node first
    assert {n.address for n in nodes} == set(addresses.values())


def test_overlay_walk_is_bounded_by_max_nodes(processes):
    six_nodes(processes)
    wait_until(lambda: len(walk(processes, "n0")) == NODES, what="all six reachable")
    assert len(walk(processes, "n0", max_nodes=2)) == 2


def test_inspect_draw_shows_one_disc_per_process(processes, tmp_path):
    _names, addresses = six_nodes(processes)
    png = tmp_path / "deployment.png"

    def drawn_all() -> bool:
        proc = processes.episub(
            "inspect", "--agent", sock(processes, "n2"), "--draw", str(png), "--json"
        )
        assert proc.wait(WAIT) == 0, proc.stderr_text()
        meta = json.loads(Path(f"{png}.json").read_text())
        return meta["nodes"] == NODES and "(no answer)" not in json.dumps(meta)

    wait_until(drawn_all, what="a drawing of all six answering nodes")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert count_nodes(png, NODE_COLOR) == NODES
    meta = json.loads(Path(f"{png}.json").read_text())
    labels = {n["label"] for n in meta["overlay"]["nodes"]}
    assert labels == set(addresses.values())  # each process labelled by its address
    assert len(meta["tree"]) == NODES - 1  # n2's eager links reach every node
