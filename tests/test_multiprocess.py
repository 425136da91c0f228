"""Overlays of real `episub node` processes on 127.0.0.1, checked through their agents.

Each node serves its agent socket (`--socket`); the test subscribes on every node before
anything is published, publishes through one node's agent, and reads every node's
subscription in a thread of its own (one blocking AgentClient per thread). Deliveries are
checked by (publisher, seq): every message once, in per-publisher order.
"""

from __future__ import annotations

import json
import random
import socket
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import pytest

from episub.agent import AgentClient, Receipt
from episub.subscription import Delivery, Lagged
from tests.proc_helpers import TOPIC, WAIT, Processes, node_ready, start_node, wait_until

pytestmark = pytest.mark.timeout(200)

NODES = 12
MESSAGES = 2000
BATCH = 250  # records per publish_batch: the stream goes out in several requests
BUFFER = 8192  # subscription buffer: above MESSAGES, so a busy test thread never lags


class Overlay:
    """Node processes by name, with their addresses and agent sockets."""

    def __init__(self, processes: Processes) -> None:
        self.processes = processes
        self.procs: dict[str, object] = {}
        self.address: dict[str, str] = {}

    def socket(self, name: str) -> str:
        return str(self.processes.dir / f"{name}.sock")

    def start(self, names: Sequence[str], **kwargs: object) -> None:
        """Start the nodes at once (they boot in parallel), then wait for each one's line."""
        procs = {name: start_node(self.processes, name, **kwargs) for name in names}  # type: ignore[arg-type]
        for name, proc in procs.items():
            self.procs[name] = proc
            self.address[name] = node_ready(proc)[1]

    def active_views(self, names: Sequence[str]) -> dict[str, list[str]]:
        views = {}
        for name in names:
            with AgentClient(self.socket(name)) as client:
                views[name] = [n.address for n in client.inspect().topics.get(TOPIC, [])]
        return views

    def wait_connected(self, names: Sequence[str]) -> None:
        """Until every node has a neighbour and the active views form one component."""
        by_address = {self.address[name]: name for name in names}

        def connected() -> bool:
            views = self.active_views(names)
            if not all(views.values()):
                return False
            seen, frontier = {names[0]}, [names[0]]
            while frontier:
                for address in views[frontier.pop()]:
                    peer = by_address.get(address)
                    if peer is not None and peer not in seen:
                        seen.add(peer)
                        frontier.append(peer)
            return len(seen) == len(names)

        wait_until(connected, what="a connected overlay")


def one_overlay(processes: Processes, nodes: int = NODES) -> tuple[Overlay, list[str]]:
    """`nodes` processes joined through one bootstrap address (the first node's)."""
    overlay = Overlay(processes)
    names = [f"n{i}" for i in range(nodes)]
    config = processes.config_file()
    overlay.start(names[:1], config=config)
    overlay.start(names[1:], config=config, bootstrap=[overlay.address["n0"]])
    overlay.wait_connected(names)
    return overlay, names


def receive_until(
    socket_path: str, subscribed: object, publisher: bytes, last_seq: int
) -> list[tuple[bytes, int]]:
    """(publisher, seq) of every message received, up to `publisher`'s `last_seq`."""
    client, sub = subscribed  # type: ignore[misc]
    got: list[tuple[bytes, int]] = []
    try:
        while True:
            item = sub.receive(timeout=WAIT)
            assert item is not None, f"{socket_path}: subscription ended: {sub.ended}"
            assert not isinstance(item, Lagged), f"{socket_path}: lagged {item}"
            if isinstance(item, Delivery):
                got.append((item.publisher, item.seq))
                if item.publisher == publisher and item.seq >= last_seq:
                    return got
    finally:
        client.close()


def subscribe(socket_path: str) -> tuple[AgentClient, object]:
    client = AgentClient(socket_path)
    return client, client.subscribe(TOPIC, BUFFER)


def publish(socket_path: str, first: int, count: int) -> list[Receipt]:
    out: list[Receipt] = []
    with AgentClient(socket_path) as client:
        for start in range(first, first + count, BATCH):
            values = [b"m%d" % i for i in range(start, min(first + count, start + BATCH))]
            out += client.publish_batch(TOPIC, values)
    return out


def test_twelve_processes_receive_every_message_once_in_publisher_order(
    processes: Processes,
) -> None:
    overlay, names = one_overlay(processes)
    receivers = names[1:]
    subs = {name: subscribe(overlay.socket(name)) for name in receivers}  # before publishing
    published = publish(overlay.socket("n0"), 0, MESSAGES)
    publisher = published[0].publisher
    assert [p.seq for p in published] == list(range(MESSAGES))
    with ThreadPoolExecutor(len(receivers)) as pool:
        futures = {
            name: pool.submit(
                receive_until, overlay.socket(name), subs[name], publisher, MESSAGES - 1
            )
            for name in receivers
        }
        received = {name: future.result() for name, future in futures.items()}
    expected = [(publisher, seq) for seq in range(MESSAGES)]
    for name in receivers:
        assert received[name] == expected, f"{name} got a different stream"
    for name in receivers:
        with AgentClient(overlay.socket(name)) as client:
            stats = client.inspect().stats
        assert stats["delivered"] == MESSAGES, (name, stats["delivered"])
        assert stats["data_lost"] == 0


def test_survivors_of_sigkilled_processes_get_everything_published_after_and_agree(
    processes: Processes,
) -> None:
    overlay, names = one_overlay(processes)
    killed = ["n3", "n5", "n8", "n10"]
    survivors = [name for name in names if name not in killed]
    subs = {name: subscribe(overlay.socket(name)) for name in survivors}
    before = publish(overlay.socket("n0"), 0, MESSAGES // 4)
    for name in killed:  # mid-stream: the batches above are still spreading
        overlay.procs[name].popen.kill()  # type: ignore[attr-defined]
    for name in killed:
        overlay.procs[name].popen.wait(WAIT)  # type: ignore[attr-defined]
    after = publish(overlay.socket("n0"), MESSAGES // 4, MESSAGES - MESSAGES // 4)
    publisher = before[0].publisher
    assert [p.seq for p in before + after] == list(range(MESSAGES))
    with ThreadPoolExecutor(len(survivors)) as pool:
        futures = {
            name: pool.submit(
                receive_until, overlay.socket(name), subs[name], publisher, MESSAGES - 1
            )
            for name in survivors
        }
        received = {name: future.result() for name, future in futures.items()}
    held_by_any = set().union(*(set(stream) for stream in received.values()))
    for name, stream in received.items():
        seqs = [seq for _, seq in stream]
        assert seqs == sorted(set(seqs)), f"{name}: out of order or twice"
        assert set(range(after[0].seq, MESSAGES)) <= set(seqs), f"{name} missed a later one"
        assert set(stream) == held_by_any, f"{name} lacks what another survivor holds"


def _free_ports(count: int) -> list[int]:
    """Ports free now, below the kernel's ephemeral range: the link-delay file must name the
    nodes' ports before they start, and an outgoing connection (of these very nodes) never
    takes a port below that range, while it may take a free one inside it."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            ephemeral_low = int(f.read().split()[0])
    except OSError:
        ephemeral_low = 32768  # Linux's default
    rng = random.Random()
    ports: list[int] = []
    while len(ports) < count:
        port = rng.randrange(10000, ephemeral_low)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        if port not in ports:
            ports.append(port)
    return ports


def test_near_neighbours_settle_inside_each_emulated_zone_and_the_overlay_stays_connected(
    processes: Processes,
) -> None:
    ports = _free_ports(NODES)
    zone = {f"n{i}": "a" if i < NODES // 2 else "b" for i in range(NODES)}
    addresses = {f"n{i}": f"127.0.0.1:{port}" for i, port in enumerate(ports)}
    delay_file = processes.dir / "zones.json"
    delay_file.write_text(
        json.dumps({"zones": {addresses[n]: zone[n] for n in zone}, "intra_ms": 1, "inter_ms": 30})
    )
    # Zones of 6 with 2 near and 2 random slots: whichever zone-mates end up as random
    # links, at least 3 are left for the 2 near slots. alpha 1.0 (default 1.5): with equal
    # delays inside a zone, a node whose zone-mates all hold c_near near links is refused
    # by each of them (it is not closer by alpha than their farthest near link), and keeps
    # a near link to the other zone for good; at 1.5 about one run in three ended so.
    # With 1.0, measurement noise lets it in. (A limit of the core's acceptance rule,
    # reported to its owners.) Refusals are remembered 0.5 s instead of 10, to retry sooner.
    c_near = 2
    config = processes.config_file(
        {
            "membership": {
                "c_rand": 2,
                "c_near": c_near,
                "alpha": 1.0,
                "recent_reject_memory": 0.5,
            }
        }
    )
    overlay = Overlay(processes)
    names = list(zone)
    a_first, b_first = names[0], names[NODES // 2]

    def start(group: Sequence[str]) -> None:
        for name in group:
            # Everyone enters through the other zone, so JOIN's random links cross zones
            # (a zone-mate held as a random link is one near candidate fewer; see
            # test_net_overlay's zone test).
            contact = (
                [] if name == a_first else [addresses[b_first if zone[name] == "a" else a_first]]
            )
            overlay.procs[name] = start_node(
                processes,
                name,
                listen=addresses[name],
                bootstrap=contact,
                config=config,
                link_delay=str(delay_file),
            )
        for name in group:
            overlay.address[name] = node_ready(overlay.procs[name])[1]  # type: ignore[arg-type]

    start([a_first])
    start([b_first])
    start([n for n in names if n not in (a_first, b_first)])

    def near_links_inside_zones() -> bool:
        for name in names:
            with AgentClient(overlay.socket(name)) as client:
                neighbours = client.inspect().topics[TOPIC]
            near = [n for n in neighbours if n.kind == "near"]
            if len(near) < c_near:
                return False
            by_address = {addresses[n]: zone[n] for n in names}
            if any(by_address.get(n.address) != zone[name] for n in near):
                return False
        return True

    # Usually seconds; the wait's bound is wide because settling rides on measurement noise.
    wait_until(near_links_inside_zones, timeout=2 * WAIT, what="near links inside each zone")
    subs = {name: subscribe(overlay.socket(name)) for name in names[1:]}
    sent = publish(overlay.socket(a_first), 0, 1)[0]
    for name, (client, sub) in subs.items():
        with client:
            item = sub.receive(timeout=WAIT)  # type: ignore[attr-defined]
            assert isinstance(item, Delivery), (name, item)
            assert (item.publisher, item.seq, item.id) == (sent.publisher, sent.seq, sent.id)
