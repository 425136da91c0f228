"""Fault injection in the simulator: each fault knocks out one repair path, and the
others must still deliver everything (reliability 1.0) through repair and gap pull."""

from __future__ import annotations

import subprocess
import sys

import pytest

from episub.cli import main
from episub.proto.events import JoinTopic, Received, Send
from episub.proto.messages import Graft, IHave, Ping
from episub.sim.engine import Simulator
from episub.sim.faults import OneWayPartition, parse_delay, parse_drop
from episub.sim.latency import make_latency
from episub.sim.params import SimParams
from episub.sim.scenarios import run

SMALL = {"nodes": 80, "messages": 30, "warmup": 5}


def report(**overrides) -> dict:
    return run(SimParams(scenario="steady", **{**SMALL, **overrides}), timing=False)


def assert_everything_delivered_once(r: dict) -> None:
    assert r["reliability"] == 1.0, f"missed {r['missed']} of {r['expected']}"
    assert r["duplicates"] == 0
    assert r["never_joined"] == 0
    assert r["dropped_by_faults"] > 0  # the fault did happen


def test_half_the_grafts_dropped_still_delivers_everything():
    r = report(drop=(("graft", 0.5), ("gossip", 0.05)))  # lost GOSSIPs: grafts are needed
    assert_everything_delivered_once(r)


def test_every_ihave_dropped_the_eager_tree_alone_delivers_everything():
    r = report(drop=(("ihave", 1.0),))
    assert_everything_delivered_once(r)
    assert r["faults"]["drop"] == {"ihave": 1.0}


def test_a_one_way_partition_that_heals_loses_nothing():
    # The sender's side cannot reach the other half for 2 s of the 6 s of counted
    # messages; the later messages show the far side its gap, and it pulls.
    r = report(one_way_partition=OneWayPartition.parse("0.5@1-3"))
    assert_everything_delivered_once(r)
    assert r["faults"]["one_way_partition"] == "0.5@1-3"


def test_delayed_prunes_and_grafts_still_deliver_everything():
    r = report(delay=(("prune", 0.5), ("graft", 0.3)), drop=(("gossip", 0.05),))
    assert_everything_delivered_once(r)


def test_links_seconds_slow_repair_their_gaps_and_lose_nothing():
    """Every message takes 3 s a hop (queues seconds deep, as on executors busy with their
    tasks) and 5% of the eager copies are lost: a PULL's answer comes 6 s after it, so a
    gap stands that long before it counts as unanswered. Given up after the fixed
    6 x 0.5 s of PULLs, 30 messages the neighbours held were reported DataLost."""
    r = report(
        nodes=50,
        messages=40,
        latency="constant",
        latency_ms=3000.0,
        drop=(("gossip", 0.05),),
    )
    assert_everything_delivered_once(r)
    assert r["data_lost"] == 0


@pytest.mark.parametrize(("seed", "nodes"), [(5, 80), (21, 80), (24, 80), (35, 80), (8, 300)])
def test_uniform_loss_while_joining_leaves_one_overlay(seed, nodes):
    # Each of these runs used to end in two or three full components (reliability
    # 0.13-0.90): a joiner whose GETNODES, NODES or JOINs were lost became the root of an
    # island of the nodes that joined through it (at 300 nodes, seed 8: its JOINs; the
    # island's last bridges were evicted 10 s later). It now asks its contact again until
    # a JOIN of its own is taken in.
    r = report(seed=seed, nodes=nodes, loss=0.02)
    assert r["reliability"] == 1.0, f"missed {r['missed']} of {r['expected']}"


def test_faults_are_deterministic_for_a_seed():
    params = {"drop": (("graft", 0.5), ("gossip", 0.05)), "nodes": 40, "messages": 10}
    assert report(**params) == report(**params)


class Scripted:
    """Node 0 sends `script` to node 1 on any input; every node records what it receives."""

    def __init__(self, peer: int, script: list, got: list) -> None:
        self.peer, self.script, self.got = peer, script, got

    def handle(self, event, now):
        if isinstance(event, Received):
            self.got.append((event.peer, self.peer, event.message))
            return []
        return [Send(1 - self.peer, "t", message) for message in self.script]


def two_nodes(script: list, **faults) -> tuple[Simulator, list]:
    got: list = []
    sim = Simulator(
        latency=make_latency("constant", 1, latency_ms=10.0),
        seed=1,
        node_factory=lambda peer, rng: Scripted(peer, script, got),
        **faults,
    )
    for node in (0, 1):
        sim.add_node(node)
    return sim, got


def test_a_dropped_kind_never_arrives_and_a_delayed_one_arrives_late():
    script = [IHave(ranges=((7, 0, 0, 1),)), Graft(), Ping(nonce=1)]
    sim, got = two_nodes(script, drop={IHave: 1.0}, delay={Ping: 1.0})
    sim.input(0, JoinTopic("t"))
    sim.run(0.5)
    assert [type(m) for _, _, m in got] == [Graft]  # IHAVE dropped, PING still on its way
    sim.run(2.0)
    assert [type(m) for _, _, m in got] == [Graft, Ping]
    assert sim.metrics.dropped_fault == 1


def test_a_one_way_cut_drops_one_direction_only_until_it_ends():
    sim, got = two_nodes([Ping(nonce=1)])
    sim.cut_one_way(bytearray([1, 0]))  # 0 cannot send to 1
    sim.input(0, JoinTopic("t"))
    sim.input(1, JoinTopic("t"))
    sim.run(1.0)
    assert [(a, b) for a, b, _ in got] == [(1, 0)]
    assert sim.connected(0, 1)  # silent: nobody was told
    sim.cut_one_way(None)
    sim.input(0, JoinTopic("t"))
    sim.run(2.0)
    assert [(a, b) for a, b, _ in got] == [(1, 0), (0, 1)]


def test_fault_arguments_parse():
    assert parse_drop("GRAFT=0.5") == ("graft", 0.5)
    assert parse_drop("ihave=1") == ("ihave", 1.0)
    assert parse_delay("prune=0.25") == ("prune", 0.25)
    cut = OneWayPartition.parse("0.3@1.5-4")
    assert (cut.fraction, cut.start, cut.end) == (0.3, 1.5, 4.0)
    assert str(cut) == "0.3@1.5-4"


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--drop", "graft"], ["--drop", "KIND=P", "'graft'"]),
        (["--drop", "graft=1.5"], ["--drop", "[0, 1]", "1.5"]),
        (["--drop", "graft=-0.1"], ["--drop", "[0, 1]"]),
        (["--drop", "graft=half"], ["--drop", "number", "'half'"]),
        (["--drop", "grift=0.5"], ["--drop", "unknown message kind 'grift'", "ihave"]),
        (["--drop", "=0.5"], ["--drop", "KIND=P"]),
        (["--drop", "graft=nan"], ["--drop", "[0, 1]"]),
        (["--delay", "ihave=-1"], ["--delay", "seconds"]),
        (["--one-way-partition", "0.5"], ["--one-way-partition", "FRACTION@START-END"]),
        (["--one-way-partition", "a@1-2"], ["FRACTION@START-END with numbers"]),
        (["--one-way-partition", "1@1-2"], ["fraction must be in (0, 1)"]),
        (["--one-way-partition", "0.5@3-2"], ["START < END"]),
        (["--one-way-partition", "0.5@1-100"], ["before the last counted message"]),
    ],
)
def test_bad_fault_arguments_give_one_clear_line_and_status_2(capsys, args, words):
    with pytest.raises(SystemExit) as exit_info:
        main(["sim", "steady", "--nodes", "10", *args])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("episub sim: error: "), err
    for word in words:
        assert word in err, (word, err)
    assert "Traceback" not in err


def test_the_command_runs_a_fault_scenario_and_names_the_faults():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "episub.cli",
            "sim",
            "steady",
            "--nodes",
            "40",
            "--messages",
            "20",
            "--warmup",
            "3",
            "--drop",
            "graft=0.5",
            "--delay",
            "prune=0.2",
            "--one-way-partition",
            "0.5@1-2",
            "--no-timing",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "faults: drop graft=0.5, delay prune=0.2s, one-way partition 0.5@1-2" in out
    assert "reliability       1  (0 missed" in out


def test_fault_rng_is_its_own_stream():
    # Adding a drop of a kind that is never sent changes nothing else in the run.
    base = report(nodes=30, messages=5)
    other = report(nodes=30, messages=5, drop=(("gettopics", 1.0),))
    other.pop("faults")
    assert base == other
