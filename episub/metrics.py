"""A Prometheus endpoint for one node: `episub node|agent --metrics-port PORT` (the
`metrics` extra, prometheus_client).

    curl http://127.0.0.1:9464/metrics

What is exported, read from the node at each scrape (nothing is kept in between):

- counters, summed over topics (the core's counters): `episub_published_total`,
  `episub_delivered_total`, `episub_duplicates_received_total`, `episub_grafts_sent_total`,
  `episub_prunes_sent_total`, `episub_ihave_ids_sent_total`, `episub_data_lost_total`,
  `episub_subscriber_dropped_total` (items dropped for slow subscribers),
  `episub_core_errors_total` (exceptions out of the core, contained: should stay 0), and
  what peers' requests cost: `episub_answers_{sent,merged,dropped,cancelled,throttled}_total`,
  `episub_requests_throttled_total`, `episub_peers_over_budget_total`;
- gauges: `episub_subscribers_lagged` (subscriptions that have dropped items),
  `episub_subscriptions`, `episub_active_view_size{topic}`,
  `episub_passive_view_size{topic}`, `episub_neighbor_rtt_seconds{topic,peer,kind,role}`
  (neighbours with a measured RTT), and every other `Node.stats()` counter as
  `episub_node_stat{name}`.

The HTTP side is a few lines of trio in the node's own event loop, not prometheus_client's
thread server: a scrape then reads the node's state between two of its events, never in
the middle of one. It answers GET /metrics (and /); each connection is bounded (request
head size, time) and so is their number.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import trio

from episub.extras import require
from episub.node import Node

__all__ = ["MAX_SCRAPERS", "render", "serve_metrics"]

log = logging.getLogger("episub.metrics")

MAX_SCRAPERS = 8  # guess: connections at once; Prometheus scrapes one at a time per target
MAX_REQUEST_HEAD = 8192  # bytes; an HTTP request line and headers from a scraper fit
REQUEST_TIMEOUT = 10.0  # seconds to read the request and write the answer; Prometheus's default

# Core counters exported as Prometheus counters: stats() name -> (metric name, help).
COUNTERS = {
    "published": ("published", "Messages this node published"),
    "delivered": ("delivered", "Messages delivered to this node's application"),
    "duplicates_received": ("duplicates_received", "Payload copies received twice"),
    "grafts_sent": ("grafts_sent", "GRAFT messages sent (lazy link made eager)"),
    "prunes_sent": ("prunes_sent", "PRUNE messages sent (eager link made lazy)"),
    "ihave_ids_sent": ("ihave_ids_sent", "Message ids announced in IHAVE"),
    "data_lost": ("data_lost", "Sequence numbers given up as lost"),
    "subscriber_dropped": ("subscriber_dropped", "Items dropped for slow subscribers"),
    "core_errors": ("core_errors", "Exceptions out of the protocol core, contained (a bug)"),
    # What peers' requests cost (episub/net/answers.py): answers streamed, budgets spent.
    "answers_sent": ("answers_sent", "Answers to peers' requests handed to a send queue"),
    "answers_merged": ("answers_merged", "Repeats of a waiting answer, merged with it"),
    "answers_dropped": ("answers_dropped", "Answers past a peer's lane bounds, not sent"),
    "answers_cancelled": ("answers_cancelled", "Answers dropped: the asker's connection went"),
    "answers_throttled": ("answers_throttled", "Times a peer's answers waited for its byte budget"),
    "requests_throttled": ("requests_throttled", "Peer requests refused past its work budget"),
    "peers_over_budget": ("peers_over_budget", "Peers dropped for asking on past their budget"),
    # PULL and GRAFT answers made a batch at a time in the core (episub/proto/answers.py).
    "answer_batches": ("answer_batches", "Batches of PULL and GRAFT answers made"),
    "answer_ranges_merged": (
        "answer_ranges_merged",
        "PULL or GRAFT ranges asked again while being answered, merged",
    ),
    "answer_ranges_refused": (
        "answer_ranges_refused",
        "PULL or GRAFT ranges past a peer's waiting bounds, not answered",
    ),
    "answer_askers_evicted": (
        "answer_askers_evicted",
        "Peers whose waiting answers were dropped to make room for another's",
    ),
}


def _families(node: Node, topics: Callable[[], list[str]]) -> Iterator[Any]:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    stats = node.stats()
    for name, (metric, text) in COUNTERS.items():
        family = CounterMetricFamily(f"episub_{metric}", text)
        family.add_metric([], stats.get(name, 0))
        yield family
    lagged = GaugeMetricFamily("episub_subscribers_lagged", "Subscriptions that dropped items")
    lagged.add_metric([], stats.get("subscribers_lagged", 0))
    yield lagged
    subs = GaugeMetricFamily("episub_subscriptions", "Open subscriptions")
    subs.add_metric([], stats.get("subscriptions", 0))
    yield subs
    active = GaugeMetricFamily("episub_active_view_size", "Active view size", labels=["topic"])
    passive = GaugeMetricFamily("episub_passive_view_size", "Passive view size", labels=["topic"])
    rtt = GaugeMetricFamily(
        "episub_neighbor_rtt_seconds",
        "Smoothed RTT to each active neighbour",
        labels=["topic", "peer", "kind", "role"],
    )
    for topic in topics():
        neighbors = node.neighbors(topic)
        active.add_metric([topic], len(neighbors))
        passive.add_metric([topic], node.passive_view_size(topic))
        for n in neighbors:
            if n.rtt_ms is not None:
                rtt.add_metric([topic, n.address, n.kind, n.role], n.rtt_ms / 1000.0)
    yield active
    yield passive
    yield rtt
    other = GaugeMetricFamily("episub_node_stat", "Other node counters", labels=["name"])
    for name, value in sorted(stats.items()):
        if name not in COUNTERS:
            other.add_metric([name], value)
    yield other


def render(node: Node, topics: Callable[[], list[str]]) -> tuple[bytes, str]:
    """The exposition text of `node` now, and its content type."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
    from prometheus_client.registry import CollectorRegistry

    class _Collector:
        def collect(self) -> Iterator[Any]:
            return _families(node, topics)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector())  # type: ignore[arg-type]
    return generate_latest(registry), CONTENT_TYPE_LATEST


async def serve_metrics(
    node: Node,
    topics: Callable[[], list[str]],
    host: str,
    port: int,
    *,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve GET /metrics on host:port until cancelled; started() with the bound port."""
    require("metrics", "prometheus_client")
    listeners = await trio.open_tcp_listeners(port, host=host)
    bound = listeners[0].socket.getsockname()[1]
    limiter = trio.CapacityLimiter(MAX_SCRAPERS)

    async def handle(stream: trio.SocketStream) -> None:
        try:
            limiter.acquire_nowait()
        except trio.WouldBlock:
            await stream.aclose()  # too many at once: the scraper retries next interval
            return
        try:
            with trio.move_on_after(REQUEST_TIMEOUT):
                await _answer(stream, node, topics)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass  # the scraper went away
        finally:
            limiter.release()
            await trio.aclose_forcefully(stream)

    log.info("metrics on http://%s:%d/metrics", host, bound)
    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, handle, listeners)
        task_status.started(bound)


async def _answer(stream: trio.SocketStream, node: Node, topics: Callable[[], list[str]]) -> None:
    head = b""
    while b"\r\n\r\n" not in head and b"\n\n" not in head:
        chunk = await stream.receive_some(MAX_REQUEST_HEAD)
        if not chunk:
            return
        head += chunk
        if len(head) > MAX_REQUEST_HEAD:
            await stream.send_all(_response(431, b"request head too large\n", "text/plain"))
            return
    parts = head.split(b"\r\n", 1)[0].split()
    if len(parts) != 3 or parts[0] != b"GET":
        await stream.send_all(_response(405, b"GET only\n", "text/plain"))
        return
    if parts[1].split(b"?", 1)[0] not in (b"/metrics", b"/"):
        await stream.send_all(_response(404, b"see /metrics\n", "text/plain"))
        return
    body, content_type = render(node, topics)
    await stream.send_all(_response(200, body, content_type))


_REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 431: "Too Large"}


def _response(status: int, body: bytes, content_type: str) -> bytes:
    head = (
        f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode("ascii") + body
