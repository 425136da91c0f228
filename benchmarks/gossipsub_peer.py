"""One py-libp2p gossipsub node as an OS process, for benchmarks/loopback.py.

Run it through the harness (it speaks the line protocol documented in loopback.py):

    /work/main/.venv/bin/python benchmarks/loopback.py --system gossipsub \\
        --python /work/bench-venv/bin/python --nodes 8 --size 256 --messages 600

It needs PyPI ``libp2p`` (tested with 0.8.1), installed in a separate venv because its
pins differ from episub's: ``python3 -m venv /work/bench-venv &&
/work/bench-venv/bin/pip install libp2p``. By hand, for one node (then type
``BOOTSTRAP``, ``START``, ``STOP`` lines on stdin):

    /work/bench-venv/bin/python benchmarks/gossipsub_peer.py --index 0 --nodes 1 \\
        --role publisher --messages 10 --size 256

The node: TCP on 127.0.0.1 with py-libp2p's default security and muxer (Noise, yamux) and
an Ed25519 identity; it dials every address it is given in BOOTSTRAP (the harness gives all
nodes started before it, so the connection graph is complete and gossipsub picks its mesh
of D peers among them), subscribes to one topic and reports READY once it knows all N-1
peers' subscriptions and its mesh holds min(D_lo, N-1) peers.

Fair configuration (each knob is recorded in the result's ``config``): go-libp2p-pubsub's
defaults for the protocol (D=6, D_lo=5, D_hi=12, heartbeat 1 s, gossip window 3, history 5,
fanout TTL 60 s, seen TTL 120 s, strict signing, 1000 IDONTWANT ids per peer), and
py-libp2p's own throttles lifted: the 10 msg/s per peer and topic "spam protection" (which
silently stops forwarding), the 32-entry subscription channel and the 32-entry per-peer
outbound queue (both drop on overflow), IP-diversity "eclipse protection" (meaningless when
every peer is 127.0.0.1) and adaptive mesh degrees (so D stays 6). py-libp2p's default
heartbeat is 120 s; 1 s is go's and the spec's. go sends IDONTWANT (meshsub v1.2) only for
messages of 1 KiB or more; py-libp2p sends one to every mesh peer for every message, which
doubled CPU per delivered 256 B message here, so v1.2 is offered only when --size >= 1024
(below that: v1.1, v1.0). Two ablation switches, off the shared CLI, are read from the
environment (pass them with ``loopback.py --peer-env KEY=VALUE``):
``BENCH_GOSSIPSUB_PROTOCOLS="1.2,1.1,1.0"`` (meshsub versions offered) and
``BENCH_GOSSIPSUB_SIGN=0`` (no per-message signatures). Kept as py-libp2p ships them: Noise
encryption, yamux, and the signed peer record it attaches to every RPC and verifies on
receipt.

Measured here: ``payload_copies`` counts every data message that arrived from the network
(first copies and duplicates, including IWANT replies) by wrapping ``Pubsub.push_msg``;
wire bytes count what passed through py-libp2p's TCP stream wrapper (``TrioTCPStream``):
encrypted Noise frames with yamux and protobuf framing, i.e. TCP payload bytes.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import sys
from typing import Any

import multiaddr
import peer_common
import trio
from libp2p import new_host
from libp2p.io.trio import TrioTCPStream
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.pubsub import pubsub as pubsub_module
from libp2p.pubsub import rpc_queue
from libp2p.pubsub.gossipsub import PROTOCOL_ID, PROTOCOL_ID_V11, PROTOCOL_ID_V12, GossipSub
from libp2p.pubsub.pubsub import Pubsub
from libp2p.tools.anyio_service import background_trio_service

DEGREE, DEGREE_LOW, DEGREE_HIGH = 6, 5, 12
PROTOCOLS = {"1.2": PROTOCOL_ID_V12, "1.1": PROTOCOL_ID_V11, "1.0": PROTOCOL_ID}
IDONTWANT_THRESHOLD = 1024  # go-libp2p-pubsub's GossipSubIDontWantMessageThreshold
ENV_PROTOCOLS = os.environ.get("BENCH_GOSSIPSUB_PROTOCOLS", "auto")
ENV_SIGN = os.environ.get("BENCH_GOSSIPSUB_SIGN", "1") != "0"
HEARTBEAT_S = 1
QUEUE_SIZE = 1 << 20  # in place of py-libp2p's 32: nothing is dropped for queue space
CONNECT_ATTEMPTS = 5
CONNECT_TIMEOUT_S = 10.0


def protocols_for(size: int) -> list[Any]:
    """py-libp2p sends IDONTWANT for every message on v1.2; go only for >= 1 KiB."""
    versions = ENV_PROTOCOLS
    if versions == "auto":
        versions = "1.2,1.1,1.0" if size >= IDONTWANT_THRESHOLD else "1.1,1.0"
    return [PROTOCOLS[v.strip()] for v in versions.split(",")]


class WireCounter:
    read = 0
    written = 0


def _count_tcp_bytes() -> None:
    """Wrap py-libp2p's TCP stream so every byte read or written is counted."""
    orig_read, orig_write = TrioTCPStream.read, TrioTCPStream.write

    async def read(self: TrioTCPStream, n: int | None = None) -> bytes:
        data = await orig_read(self, n)
        WireCounter.read += len(data)
        return data

    async def write(self: TrioTCPStream, data: bytes) -> None:
        WireCounter.written += len(data)
        await orig_write(self, data)

    TrioTCPStream.read = read  # type: ignore[method-assign]
    TrioTCPStream.write = write  # type: ignore[method-assign]


class LargeRpcQueue(rpc_queue.RpcQueue):
    def __init__(
        self, max_size: int = QUEUE_SIZE, max_message_size: int = rpc_queue.DefaultMaxMessageSize
    ) -> None:
        super().__init__(max_size, max_message_size)


def _lift_queue_limits() -> None:
    # Pubsub.subscribe reads this module global when it opens the subscription channel,
    # and Pubsub creates each peer's outbound queue as RpcQueue() from its own namespace.
    pubsub_module.SUBSCRIPTION_CHANNEL_SIZE = QUEUE_SIZE
    pubsub_module.RpcQueue = LargeRpcQueue  # type: ignore[misc]


class GossipsubAdapter:
    system = "gossipsub"

    def __init__(self, args: Any) -> None:
        self.args = args
        self.payload_copies: int | None = 0
        self.control: dict[str, int] = {"ihave_ids": 0, "iwant_ids": 0, "idontwant_ids": 0}
        self.listen_addr = multiaddr.Multiaddr(f"/ip4/127.0.0.1/tcp/{args.port}")
        self.host = new_host(listen_addrs=[self.listen_addr])
        self.router = GossipSub(
            protocols=protocols_for(args.size),
            degree=DEGREE,
            degree_low=DEGREE_LOW,
            degree_high=DEGREE_HIGH,
            time_to_live=60,
            gossip_window=3,
            gossip_history=5,
            heartbeat_initial_delay=0.1,
            heartbeat_interval=HEARTBEAT_S,
            max_idontwant_messages=1000,
            adaptive_gossip_enabled=False,
            spam_protection_enabled=False,
            eclipse_protection_enabled=False,
        )
        self.pubsub = Pubsub(self.host, self.router, seen_ttl=120, strict_signing=ENV_SIGN)
        self._instrument()
        self.sub: Any = None

    @property
    def wire_read(self) -> int:
        return WireCounter.read

    @property
    def wire_written(self) -> int:
        return WireCounter.written

    def _instrument(self) -> None:
        my_id = self.host.get_id()
        push_msg, handle_rpc = self.pubsub.push_msg, self.router.handle_rpc

        async def counting_push_msg(forwarder: Any, msg: Any) -> None:
            if forwarder != my_id:  # own publications pass here too; not a copy
                self.payload_copies = (self.payload_copies or 0) + 1
            await push_msg(forwarder, msg)

        async def counting_handle_rpc(rpc: Any, sender: Any) -> None:
            ctl = rpc.control
            self.control["ihave_ids"] += sum(len(x.messageIDs) for x in ctl.ihave)
            self.control["iwant_ids"] += sum(len(x.messageIDs) for x in ctl.iwant)
            self.control["idontwant_ids"] += sum(len(x.messageIDs) for x in ctl.idontwant)
            await handle_rpc(rpc, sender)

        self.pubsub.push_msg = counting_push_msg  # type: ignore[method-assign]
        self.router.handle_rpc = counting_handle_rpc  # type: ignore[method-assign]

    async def _run(self, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        async with (
            self.host.run(listen_addrs=[self.listen_addr]),
            background_trio_service(self.pubsub),
            background_trio_service(self.router),
        ):
            await self.pubsub.wait_until_ready()
            self.sub = await self.pubsub.subscribe(self.args.topic)
            task_status.started()
            await trio.sleep_forever()

    async def listen(self, nursery: trio.Nursery) -> str:
        await nursery.start(self._run)
        peer = self.host.get_id().to_string()
        for addr in self.host.get_transport_addrs():
            text = str(addr)
            if text.startswith("/ip4/127.0.0.1/tcp/"):
                return f"{text}/p2p/{peer}"
        raise RuntimeError(f"no 127.0.0.1 TCP listen address in {self.host.get_addrs()}")

    async def _dial(self, addr: str) -> None:
        info = info_from_p2p_addr(multiaddr.Multiaddr(addr))
        for attempt in range(CONNECT_ATTEMPTS):
            with trio.move_on_after(CONNECT_TIMEOUT_S):
                try:
                    await self.host.connect(info)
                    return
                except Exception as exc:
                    print(f"dial {addr} attempt {attempt}: {exc!r}", file=sys.stderr)
            await trio.sleep(0.2 * (attempt + 1))
        print(f"giving up on {addr}", file=sys.stderr)

    async def connect(self, addrs: list[str]) -> None:
        async with trio.open_nursery() as nursery:
            for addr in addrs:
                nursery.start_soon(self._dial, addr)

    async def wait_ready(self) -> None:
        topic, others = self.args.topic, self.args.nodes - 1
        want_mesh = min(DEGREE_LOW, others)
        while (
            len(self.pubsub.peer_topics.get(topic, ())) < others
            or len(self.router.mesh.get(topic, ())) < want_mesh
        ):
            await trio.sleep(0.05)  # bounded by the driver's --deadline

    async def publish(self, data: bytes) -> None:
        await self.pubsub.publish(self.args.topic, data)

    async def receive_batch(self) -> list[bytes]:
        msg = await self.sub.get()  # py-libp2p hands messages over one at a time
        return [bytes(msg.data)]

    def config(self) -> dict[str, Any]:
        return {
            "degree": DEGREE,
            "degree_low": DEGREE_LOW,
            "degree_high": DEGREE_HIGH,
            "heartbeat_interval_s": HEARTBEAT_S,
            "gossip_window": 3,
            "gossip_history": 5,
            "seen_ttl_s": 120,
            "strict_signing": ENV_SIGN,
            "protocols": [str(p) for p in self.router.protocols],
            "max_idontwant_messages": 1000,
            "spam_protection_enabled": False,
            "eclipse_protection_enabled": False,
            "adaptive_gossip_enabled": False,
            "subscription_channel_size": QUEUE_SIZE,
            "outbound_queue_size": QUEUE_SIZE,
            "security": "noise (py-libp2p default)",
            "muxer": "yamux (py-libp2p default)",
            "mesh_size_at_end": len(self.router.mesh.get(self.args.topic, ())),
            "peers_at_end": len(self.pubsub.peers),
            "control_ids_received": dict(self.control),
            "payload_copies_note": "Pubsub.push_msg calls from remote forwarders",
            "wire_bytes_note": "bytes through libp2p.io.trio.TrioTCPStream (TCP payload)",
        }

    def versions(self) -> dict[str, str]:
        names = ("libp2p", "trio", "protobuf", "multiaddr")
        return {name: importlib.metadata.version(name) for name in names}


def main() -> None:
    args = peer_common.parse_args()
    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
    _count_tcp_bytes()
    _lift_queue_limits()
    trio.run(peer_common.drive, GossipsubAdapter(args), args)


if __name__ == "__main__":
    main()
