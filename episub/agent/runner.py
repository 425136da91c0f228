"""One node process: `episub node` in the foreground, `episub agent` for ensure_agent.

Both run the same thing: a `Node`, the agent service on it, optionally the Unix socket,
the topics given at start; then they wait for SIGTERM/SIGINT, for the owner process to go,
or for the idle timeout, and leave cleanly (socket removed first, so no new client
connects to a process on its way out; then every topic left, LEAVE flushed by the node).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import trio

from episub.agent.errors import AgentWaitExpired
from episub.agent.lifetime import WATCH_INTERVAL, OwnerProcess
from episub.agent.server import AgentServer
from episub.agent.service import AgentLimits, AgentService
from episub.allocator import ReleaseWatch, limit_heap_growth
from episub.collector import collect_rarely
from episub.net.link_delay import LinkDelay
from episub.net.peer_id import format_address, parse_address
from episub.node import Node
from episub.node.bootstrap import BOOTSTRAP_PATIENCE, BootstrapError, patiently
from episub.proto.config import NodeConfig
from episub.proto.store import RetentionConfig

# How often an idle node looks whether its tables let go of memory: a trim then comes at
# most this long plus a slow upkeep tick (episub.net.timers.SLOW_TICK, 6 s) plus two
# WATCH_INTERVALs after a large release began. The look rides the node's own upkeep
# ticks: on its own, 0.2 wakeups a second cost an idle node ~0.09 ms of CPU a second.
RELEASE_IDLE_INTERVAL = 5.0

__all__ = ["NodeOptions", "run_node"]

log = logging.getLogger("episub.agent")


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeOptions:
    key: bytes
    listen: str = "127.0.0.1:0"
    advertise: str | None = None
    bootstrap: Sequence[str] = ()
    topics: Sequence[str] = ()
    config: NodeConfig = field(default_factory=NodeConfig)
    retention: RetentionConfig = field(default_factory=RetentionConfig)
    link_delay: LinkDelay | None = None
    socket_path: str | None = None
    owner_pid: int | None = None
    # Files that exist for the owner's sake (a Spark executor's copy of its deployment):
    # removed when the owner is gone, kept when the agent retires idle (a later client of
    # the same owner may need them to start it again).
    owner_files: Sequence[str] = ()
    idle_timeout: float | None = None  # seconds; needs socket_path (idle = no client)
    limits: AgentLimits = field(default_factory=AgentLimits)
    encrypt: bool = True  # seal frames after the handshake (episub.net.sealing)
    sign: bool = False  # signed publishing (episub.proto.signing)
    metrics_port: int | None = None  # serve Prometheus metrics here (episub.metrics)
    # How long joining the start topics keeps trying bootstrap addresses that refuse (nodes
    # started together: the bootstrap node may not listen yet); 0: fail at once.
    bootstrap_timeout: float = BOOTSTRAP_PATIENCE


async def run_node(options: NodeOptions, on_ready: Callable[[Node], None]) -> str:
    """Run until told to stop; returns why it stopped. `on_ready(node)` is called once the
    node listens, the socket (if any) accepts and the start topics are joined."""
    watched = options.idle_timeout is not None or options.owner_pid is not None
    if options.socket_path is None and watched:
        raise ValueError("an owner pid or idle timeout needs a socket (idle means: no client)")
    owner = OwnerProcess(options.owner_pid) if options.owner_pid is not None else None
    reasons: list[str] = []
    # Opened before anything else, so a SIGTERM during start-up still exits cleanly.
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:

            def stop(reason: str) -> None:
                reasons.append(reason)
                nursery.cancel_scope.cancel()

            async def on_signal() -> None:
                async for signum in signals:
                    stop(f"got {signal.Signals(signum).name}")

            nursery.start_soon(on_signal)
            nursery.start_soon(_serve, options, owner, on_ready, stop)
    return reasons[0] if reasons else "stopped"


async def _serve(
    options: NodeOptions,
    owner: OwnerProcess | None,
    on_ready: Callable[[Node], None],
    stop: Callable[[str], None],
) -> None:
    limit_heap_growth()  # before the node's tables grow (episub/allocator.py)
    collect_rarely()  # full collections stall the node (episub/collector.py)
    node = Node(
        key=options.key,
        listen=options.listen,
        advertise=options.advertise,
        config=options.config,
        retention=options.retention,
        link_delay=options.link_delay,
        encrypt=options.encrypt,
        sign=options.sign,
    )
    async with node, trio.open_nursery() as nursery:
        service = AgentService(
            node,
            bootstrap=options.bootstrap,
            limits=options.limits,
        )
        await nursery.start(service.run)
        server = None
        if options.socket_path is not None:
            server = AgentServer(service, options.socket_path)
            await nursery.start(server.run)
        if options.metrics_port is not None:
            from episub.metrics import serve_metrics

            host = parse_address(options.listen, allow_port_zero=True).host
            port = await nursery.start(
                serve_metrics, node, lambda: service.topics, host, options.metrics_port
            )
            # A wildcard listens everywhere; scrapers dial the host peers dial.
            shown = parse_address(node.address).host
            service.metrics_url = f"http://{format_address(shown, port)}/metrics"
        for topic in options.topics:
            # AgentWaitExpired: joined without a neighbour yet (logged); serve, the node
            # keeps trying.
            with contextlib.suppress(AgentWaitExpired):
                await _join_patiently(service, topic, options.bootstrap_timeout)
        log.info("node %s listening on %s", node.id.decode("ascii", "replace"), node.address)
        on_ready(node)
        # Free memory goes back to the OS once the node is quiet after letting go of many
        # messages (episub/allocator.py); the watch wakes every second only while a
        # release is under way, and rarely on an idle node (an idle node's CPU is its
        # wakeups).
        release = ReleaseWatch(lambda: node.retention_released, before_trim=node.shrink_retention)
        nursery.start_soon(_watch_releases, release, node)
        if server is None:
            await trio.sleep_forever()  # until a signal
        reason = await server.wait_retired(idle_timeout=options.idle_timeout, owner=owner)
        if owner is not None and not owner.alive():
            for path in options.owner_files:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
        stop(reason)


async def _join_patiently(service: AgentService, topic: str, within: float) -> None:
    """Join a start topic, trying its bootstrap addresses again for up to `within` seconds
    while none answers; said once at WARNING (shown by `episub node`), then at DEBUG."""
    said = False

    def on_retry(error: BootstrapError, left: float) -> None:
        nonlocal said
        level = logging.DEBUG if said else logging.WARNING
        said = True
        log.log(level, "topic %r: %s; trying again for %.0f s more", topic, error, left)

    await patiently(lambda: service.join(topic), within, on_retry)


async def _watch_releases(release: ReleaseWatch, node: Node) -> None:
    """Look at the node's released bytes every WATCH_INTERVAL while they move or a trim is
    due, and otherwise RELEASE_IDLE_INTERVAL or a little more: on the node's own upkeep
    ticks (Node.upkeep_deadline), so that an idle process wakes once for both."""
    while True:
        if release.pending():
            await trio.sleep(WATCH_INTERVAL)
        else:
            await trio.sleep_until(node.upkeep_deadline(RELEASE_IDLE_INTERVAL))
        release.check()
