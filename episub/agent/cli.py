"""`episub node`, `episub agent` and `episub inspect`; `publish`/`subscribe` are in tools.py.

    episub node --listen 127.0.0.1:7001 --bootstrap 127.0.0.1:7000 --topic prices \\
        --key-file deploy.key --socket /tmp/episub-7001.sock
    episub agent --socket /tmp/episub/agent.sock --owner-pid 4242   # what ensure_agent runs
    episub inspect --agent /tmp/episub-7001.sock [--json]

`episub node` prints one line, "episub node <peer id> listening on <address>", once it
listens, serves its socket and has joined its topics; it leaves every topic and exits 0 on
SIGTERM or SIGINT. `episub agent` is the same process as ensure_agent starts it: a socket
is required, it exits when its owner is gone or after `--idle-timeout` seconds unused, and
`--ready-fd`/`--detach` are the launcher's handshake.

Logging goes to stderr, or to `--log FILE`; `--debug` adds debug lines and, on an error,
the traceback (otherwise an error is one line on stderr and exit status 1, or 2 for bad
arguments, as episub/cli.py arranges).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import Any

import trio

from episub.agent import config_cli, tools
from episub.agent.client import AgentClient, AgentStatus
from episub.agent.launcher import DEFAULT_IDLE_TIMEOUT
from episub.agent.options import (
    UsageError,
    check_addresses,
    load_config,
    load_key,
    load_link_delay,
    load_retention,
    number_type,
    topic_name,
)
from episub.agent.runner import NodeOptions, run_node
from episub.extras import require
from episub.node import Node
from episub.node.bootstrap import BOOTSTRAP_PATIENCE
from episub.records import format_publisher

__all__ = ["add_parsers"]

POSITIVE = number_type(float, 0, above=True)
PID = number_type(int, 1)
FD = number_type(int, 0)


def _port(text: str) -> int:
    """An argparse type: a TCP port, 0..65535 (0: any free one)."""
    port = number_type(int, 0)(text)
    if port > 65535:
        raise argparse.ArgumentTypeError(f"must be <= 65535, got {text}")
    return port


def add_node_arguments(parser: argparse.ArgumentParser) -> None:
    """What every command that runs a node of its own takes."""
    add = parser.add_argument
    add("--listen", default="127.0.0.1:0", help="host:port to listen on (port 0: any free one)")
    add("--advertise", help="host peers should dial, when --listen is a wildcard like 0.0.0.0")
    add(
        "--bootstrap",
        action="append",
        default=[],
        metavar="ADDR",
        help="host:port of a node already in the overlay (repeatable)",
    )
    add("--key-file", metavar="PATH", help="the deployment key (default: $EPISUB_KEY, 64 hex)")
    add(
        "--config",
        metavar="FILE",
        help='JSON overrides: {"membership": {..}, "broadcast": {..}, "retention": {..}}',
    )
    add(
        "--no-encryption",
        dest="encrypt",
        action="store_false",
        help="send frames in the clear after the handshake (trusted networks only; every "
        "node of the deployment must agree)",
    )
    add(
        "--signed",
        dest="sign",
        action="store_true",
        help="signed publishing: sign what this node publishes and drop messages not signed "
        "by their publisher (every node of the deployment must agree; docs/threat-model.md)",
    )


def add_bootstrap_timeout_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--bootstrap-timeout",
        type=number_type(float, 0),
        default=BOOTSTRAP_PATIENCE,
        metavar="SECONDS",
        help="keep trying --bootstrap addresses that do not answer yet for this long, with "
        "backoff, before giving up (default: %(default)s; 0: give up at once)",
    )


def add_metrics_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--metrics-port",
        type=_port,
        metavar="PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics, HOST that of --listen "
        "(needs the metrics extra)",
    )


def add_logging_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log", metavar="FILE", help="write the log here instead of stderr")
    parser.add_argument(
        "--debug", action="store_true", default=argparse.SUPPRESS, help="debug log, tracebacks"
    )


def setup_logging(args: argparse.Namespace, level: int = logging.INFO) -> None:
    handler: logging.Handler
    log_file = getattr(args, "log", None)
    handler = logging.FileHandler(log_file) if log_file else logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if getattr(args, "debug", False) else level)


def add_parsers(subparsers: Any) -> None:
    """Register node, agent, publish, subscribe and inspect on `subparsers`."""
    node = subparsers.add_parser(
        "node",
        help="run a node in the foreground",
        description="Run one episub node until SIGTERM/SIGINT, optionally serving the agent "
        "protocol on a Unix socket.",
    )
    add_node_arguments(node)
    node.add_argument(
        "--topic", action="append", default=[], type=topic_name, help="join at start (repeatable)"
    )
    node.add_argument("--link-delay", metavar="FILE", help="emulated zone latencies (JSON)")
    node.add_argument("--socket", metavar="PATH", help="also serve the agent protocol here")
    add_bootstrap_timeout_argument(node)
    add_metrics_argument(node)
    add_logging_arguments(node)
    node.set_defaults(func=run_node_command)

    agent = subparsers.add_parser(
        "agent",
        help="run the local agent (as ensure_agent starts it)",
        description="Serve a node to local clients over a Unix socket; exit when the owner "
        "process is gone or nobody used it for --idle-timeout seconds.",
    )
    add_node_arguments(agent)
    agent.add_argument("--socket", metavar="PATH", required=True, help="Unix socket to serve")
    agent.add_argument(
        "--topic", action="append", default=[], type=topic_name, help="join at start (repeatable)"
    )
    agent.add_argument("--link-delay", metavar="FILE", help="emulated zone latencies (JSON)")
    agent.add_argument("--owner-pid", type=PID, help="exit once this process is gone")
    agent.add_argument(
        "--owner-file",
        metavar="PATH",
        action="append",
        default=[],
        help="remove this file when exiting because the owner is gone (repeatable)",
    )
    agent.add_argument(
        "--idle-timeout",
        type=POSITIVE,
        default=DEFAULT_IDLE_TIMEOUT,
        help="exit after this many seconds without client or request (default: %(default)s, "
        "the retention window)",
    )
    agent.add_argument("--ready-fd", type=FD, help="write 'ready' to this descriptor when serving")
    agent.add_argument("--detach", action="store_true", help="fork; the first process exits")
    add_bootstrap_timeout_argument(agent)
    add_metrics_argument(agent)
    add_logging_arguments(agent)
    agent.set_defaults(func=run_agent_command)

    inspect = subparsers.add_parser(
        "inspect",
        help="show an agent's node: views, RTTs, eager/lazy links, counters",
        description="Ask the agent at --agent for its node's state.",
    )
    inspect.add_argument("--agent", metavar="PATH", required=True, help="the agent's socket")
    inspect.add_argument(
        "--json", action="store_true", help="print one JSON object (with every counter)"
    )
    inspect.add_argument(
        "--all", action="store_true", help="list every counter, not only those above zero"
    )
    inspect.add_argument(
        "--draw",
        metavar="FILE.png",
        help="walk the topic's overlay (every node reports its view) and draw it; needs the "
        "viz extra",
    )
    inspect.add_argument(
        "--topic", type=topic_name, help="--draw: the topic (default: the node's first)"
    )
    inspect.add_argument(
        "--publisher",
        metavar="ADDR",
        help="--draw: highlight this node's eager tree (address or peer id; default: the "
        "node asked)",
    )
    inspect.add_argument(
        "--max-nodes", type=number_type(int, 1), default=0, help="--draw: nodes asked at most"
    )
    inspect.add_argument(
        "--walk-timeout", type=POSITIVE, default=0.0, help="--draw: seconds the walk may take"
    )
    inspect.add_argument(
        "--debug", action="store_true", default=argparse.SUPPRESS, help="tracebacks on errors"
    )
    inspect.set_defaults(func=run_inspect_command)

    tools.add_parsers(subparsers, add_node_arguments)
    config_cli.add_parser(subparsers, add_node_arguments)


def _node_options(args: argparse.Namespace, **extra: Any) -> NodeOptions:
    check_addresses(args.listen, args.bootstrap)
    if args.metrics_port is not None:
        require("metrics", "prometheus_client")
    return NodeOptions(
        key=load_key(args.key_file),
        listen=args.listen,
        advertise=args.advertise,
        bootstrap=args.bootstrap,
        topics=args.topic,
        config=load_config(args.config),
        retention=load_retention(args.config),
        link_delay=load_link_delay(args.link_delay),
        socket_path=args.socket,
        encrypt=args.encrypt,
        sign=args.sign,
        metrics_port=args.metrics_port,
        bootstrap_timeout=args.bootstrap_timeout,
        **extra,
    )


def run_node_command(args: argparse.Namespace) -> int:
    options = _node_options(args)
    setup_logging(args, logging.WARNING)

    def ready(node: Node) -> None:
        print(f"episub node {format_publisher(node.id)} listening on {node.address}", flush=True)

    reason = trio.run(run_node, options, ready)
    logging.getLogger("episub.agent").info("stopped: %s", reason)
    return 0


def run_agent_command(args: argparse.Namespace) -> int:
    if args.owner_file and args.owner_pid is None:
        raise UsageError("--owner-file needs --owner-pid")
    options = _node_options(
        args,
        owner_pid=args.owner_pid,
        owner_files=args.owner_file,
        idle_timeout=args.idle_timeout,
    )
    if args.detach:
        sys.stdout.flush()
        sys.stderr.flush()
        if os.fork() != 0:
            os._exit(0)  # the launcher reaps this one; the agent is now nobody's child
    setup_logging(args)
    log = logging.getLogger("episub.agent")

    def ready(node: Node) -> None:
        log.info("agent pid %d serving %s", os.getpid(), options.socket_path)
        if args.ready_fd is not None:
            os.write(args.ready_fd, b"ready\n")
            os.close(args.ready_fd)

    reason = trio.run(run_node, options, ready)
    log.info("agent pid %d exits: %s", os.getpid(), reason)
    return 0


def run_inspect_command(args: argparse.Namespace) -> int:
    if args.draw is not None:
        require("viz", "matplotlib", "networkx")
    with AgentClient(args.agent) as client:
        status = client.inspect()
        if args.draw is not None:
            topic = args.topic or next(iter(status.topics), None)
            if topic is None:
                raise UsageError("the node has joined no topic: nothing to draw")
            nodes = client.overlay(topic, args.max_nodes, args.walk_timeout)
    if args.draw is not None:
        from episub.viz.deployment import draw_deployment

        assert topic is not None  # chosen above, with the overlay
        meta = draw_deployment(nodes, args.draw, publisher=args.publisher, topic=topic)
        print(f"drew {meta['nodes']} nodes, {meta['links']} links: {args.draw}", file=sys.stderr)
    if args.json:
        print(json.dumps(status_json(status), sort_keys=True))
    else:
        print(format_status(status, every_counter=args.all))
    return 0


def status_json(status: AgentStatus) -> dict[str, Any]:
    return {
        "node_id": format_publisher(status.node_id),
        "address": status.address,
        "pid": status.pid,
        "topics": {
            topic: [
                {
                    "peer_id": format_publisher(n.peer_id),
                    "address": n.address,
                    "kind": n.kind,
                    "role": n.role,
                    "rtt_ms": n.rtt_ms,
                }
                for n in neighbors
            ]
            for topic, neighbors in status.topics.items()
        },
        "stats": status.stats,
    }


def format_status(status: AgentStatus, every_counter: bool = False) -> str:
    """The text `inspect` prints: the counters above zero only, unless `every_counter`
    (most of ~95 are zero on a given node, and would bury the ones that say something)."""
    lines = [
        f"node     {format_publisher(status.node_id)}",
        f"address  {status.address}",
        f"pid      {status.pid}",
    ]
    for topic, neighbors in status.topics.items():
        lines.append(f"topic {topic!r}: {len(neighbors)} neighbours")
        for n in neighbors:
            rtt = "-" if n.rtt_ms is None else f"{n.rtt_ms:.1f} ms"
            lines.append(f"  {n.kind:4}  {n.role:5}  {rtt:>10}  {n.address}")
    if not status.topics:
        lines.append("no topics joined")
    shown = {n: v for n, v in status.stats.items() if every_counter or v}
    hidden = len(status.stats) - len(shown)
    width = max((len(name) for name in shown), default=0)
    lines.append("counters:" if not hidden else f"counters ({hidden} at zero not shown; --all):")
    lines += [f"  {name:{width}}  {value}" for name, value in shown.items()]
    return "\n".join(lines)
