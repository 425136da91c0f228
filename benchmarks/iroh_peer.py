"""One iroh-gossip node as an OS process, for benchmarks/loopback.py.

    python3 -m venv /work/iroh-venv && /work/iroh-venv/bin/pip install iroh==0.35.0 trio
    .venv/bin/python benchmarks/loopback.py --system iroh --python /work/iroh-venv/bin/python \\
        --nodes 8 --size 256 --messages 1000 --rate 100

iroh (Rust; PyPI `iroh`, its uniffi bindings) in a venv of its own, like py-libp2p's. The
node: an in-memory iroh node bound to 127.0.0.1 (QUIC), no discovery service, one gossip
topic (iroh-gossip: HyParView + Plumtree, its defaults), joined through the addresses the
harness gives in BOOTSTRAP (all nodes started before this one; iroh dials them directly).
READY once the topic has `min(3, N-1)` neighbours, as the episub peer waits for.

iroh dials relay servers on the Internet by default and the bindings cannot turn that off,
so loopback.py runs iroh in a network namespace with nothing but `lo` (_common.py): there is
no route out. This script refuses to run anywhere else.

The bindings are asyncio; the contract's driver (peer_common.drive) is trio. trio runs as a
guest inside the asyncio loop (trio.lowlevel.start_guest_run), one thread for both; an iroh
call is an asyncio task that the trio side awaits through an event. Not counted here:
`payload_copies` and wire bytes (iroh's stats do not split them out): null in the result.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import math
import sys
from collections.abc import Coroutine
from typing import Any

import _common
import peer_common
import trio

STATUS_UNAVAILABLE = 3
READY_TIMEOUT = 60.0  # s a node waits for its neighbours; the driver's --deadline bounds all


async def _on_asyncio(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run `coro` as an asyncio task (the host loop) and await it from trio (the guest)."""
    token = trio.lowlevel.current_trio_token()
    done = trio.Event()
    future = asyncio.ensure_future(coro)
    future.add_done_callback(lambda _: token.run_sync_soon(done.set))
    await done.wait()
    return future.result()


class IrohAdapter:
    system = "iroh"
    payload_copies = None
    wire_read = None
    wire_written = None

    def __init__(self, args: Any, iroh: Any) -> None:
        self.args = args
        self.iroh = iroh
        self.node: Any = None
        self.node_id = ""
        self.sender: Any = None
        self.neighbors: set[str] = set()
        self._received, self._inbox = trio.open_memory_channel[bytes](math.inf)
        self._neighbors_changed = trio.Event()

    async def listen(self, nursery: trio.Nursery) -> str:
        iroh = self.iroh
        options = iroh.NodeOptions(
            ipv4_addr="127.0.0.1:0", node_discovery=iroh.NodeDiscoveryConfig.NONE
        )
        self.node = await _on_asyncio(iroh.Iroh.memory_with_options(options))
        net = self.node.net()
        self.node_id = await _on_asyncio(net.node_id())
        addr = await _on_asyncio(net.node_addr())
        direct = [a for a in addr.direct_addresses() if a.startswith("127.0.0.1:")]
        return f"{self.node_id}@{direct[0]}"

    async def connect(self, addrs: list[str]) -> None:
        iroh = self.iroh
        net = self.node.net()
        ids = []
        for entry in addrs:
            node_id, _, socket_addr = entry.partition("@")
            key = iroh.PublicKey.from_string(node_id)
            await _on_asyncio(net.add_node_addr(iroh.NodeAddr(key, None, [socket_addr])))
            ids.append(node_id)
        token = trio.lowlevel.current_trio_token()
        adapter = self

        class Callback(iroh.GossipMessageCallback):
            async def on_message(self, msg: Any) -> None:
                kind = msg.type()
                if kind == iroh.MessageType.RECEIVED:
                    content = msg.as_received().content
                    token.run_sync_soon(adapter._received.send_nowait, content)
                elif kind == iroh.MessageType.JOINED:
                    for node_id in msg.as_joined():
                        token.run_sync_soon(adapter._neighbor, node_id, True)
                elif kind == iroh.MessageType.NEIGHBOR_UP:
                    token.run_sync_soon(adapter._neighbor, msg.as_neighbor_up(), True)
                elif kind == iroh.MessageType.NEIGHBOR_DOWN:
                    token.run_sync_soon(adapter._neighbor, msg.as_neighbor_down(), False)

        topic = self.args.topic.encode().ljust(32, b"\0")[:32]
        self.sender = await _on_asyncio(self.node.gossip().subscribe(topic, ids, Callback()))

    def _neighbor(self, node_id: str, up: bool) -> None:
        if up:
            self.neighbors.add(node_id)
        else:
            self.neighbors.discard(node_id)
        self._neighbors_changed.set()
        self._neighbors_changed = trio.Event()

    async def wait_ready(self) -> None:
        want = min(3, self.args.nodes - 1)
        with trio.move_on_after(READY_TIMEOUT):
            while len(self.neighbors) < want:
                await self._neighbors_changed.wait()

    async def publish(self, data: bytes) -> None:
        await _on_asyncio(self.sender.broadcast(data))

    async def receive_batch(self) -> list[bytes]:
        batch = [await self._inbox.receive()]  # iroh's callback hands them over one at a time
        while True:
            try:
                batch.append(self._inbox.receive_nowait())
            except trio.WouldBlock:
                return batch

    def config(self) -> dict[str, Any]:
        return {
            "transport": "QUIC on 127.0.0.1, in a loopback-only network namespace",
            "discovery": "none (direct addresses from BOOTSTRAP)",
            "note": "iroh-gossip defaults; own publications are not delivered to the publisher",
            "neighbors": len(self.neighbors),
        }

    def versions(self) -> dict[str, str]:
        return {"iroh": importlib.metadata.version("iroh"), "trio": trio.__version__}


def main() -> int:
    args = peer_common.parse_args()
    if not _common.only_loopback():
        print("iroh_peer.py runs only where `lo` is the only interface (loopback.py sees to "
              "it): iroh would dial relay servers on the Internet", file=sys.stderr)  # fmt: skip
        return STATUS_UNAVAILABLE
    try:
        import iroh
    except ImportError:
        print("iroh is not installed in this interpreter: pip install iroh==0.35.0 trio",
              file=sys.stderr)  # fmt: skip
        return STATUS_UNAVAILABLE

    async def host() -> None:
        loop = asyncio.get_running_loop()
        # iroh calls our gossip callback from its own threads: it runs on this loop.
        iroh.iroh_ffi.uniffi_set_event_loop(loop)
        finished: asyncio.Future[Any] = loop.create_future()
        trio.lowlevel.start_guest_run(
            peer_common.drive,
            IrohAdapter(args, iroh),
            args,
            run_sync_soon_threadsafe=loop.call_soon_threadsafe,
            done_callback=finished.set_result,
            host_uses_signal_set_wakeup_fd=True,
        )
        (await finished).unwrap()

    asyncio.run(host())
    return 0


if __name__ == "__main__":
    sys.exit(main())
