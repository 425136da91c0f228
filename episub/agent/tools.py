"""`episub publish` and `episub subscribe`: through an agent, or a node of their own.

    episub publish --agent /tmp/a.sock --topic prices 42 43 44       # prints "<seq> <id>"
    seq 100 | episub publish --agent /tmp/a.sock --topic prices --lines   # one message a line
    episub publish --agent /tmp/a.sock --topic blobs --file model.bin    # the file, one value
    episub publish --agent /tmp/a.sock --topic blobs < model.bin         # stdin, one value
    episub publish --agent /tmp/a.sock --topic t --count 2000 --size 100   # a summary
    episub subscribe --agent /tmp/a.sock --topic prices --json --count 10
    EPISUB_KEY=... episub publish --bootstrap 10.0.0.5:7000 --topic prices 42

With `--agent PATH` the agent's node does the work (it joins the topic first, a no-op when
joined). With `--bootstrap ADDR` the command runs a temporary node: it joins through the
address, waits for its first neighbour (a message published before any link exists would
reach nobody), publishes or subscribes, and leaves on exit.

`subscribe` says "subscribed to TOPIC" on stderr once items flow, then prints each message:
its value as text, or with `--json` one object a line (topic, publisher, id in hex, seq,
timestamp_ms, key, value, headers; each bytes field as UTF-8 text, or base64 with
`"<field>_encoding": "base64"`; a publisher id as everywhere else, episub.format_publisher:
`host:port/tag` for a node's own stream). A record batch (episub/recordbatch.py: a Spark
sink's rows) prints a line per row, its seq the row's offset. Lagged and Lost notices go
to stderr.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from collections.abc import Callable, Iterator
from typing import Any

import trio

from episub.agent.client import AgentClient, AgentSubscription
from episub.agent.options import (
    UsageError,
    check_addresses,
    load_config,
    load_key,
    number_type,
    topic_name,
)
from episub.agent.wire import Record
from episub.node import JOIN_TIMEOUT, SUBSCRIPTION_BUFFER, Node
from episub.recordbatch import BatchFormatError, unbatch
from episub.records import Receipt, format_publisher
from episub.subscription import Delivery, Item, Lagged, Lost

__all__ = ["add_parsers"]

COUNT = number_type(int, 1)
POSITIVE = number_type(float, 0, above=True)
PUBLISH_BATCH = 1000  # records per publish_batch request; guess: ~100 KB of small values


def add_parsers(subparsers: Any, add_node_arguments: Callable[[Any], None]) -> None:
    publish = subparsers.add_parser(
        "publish",
        help="publish messages to a topic",
        description="Publish the VALUEs, or a file as one value, or stdin as one value (its "
        "lines with --lines), or --count generated payloads.",
    )
    _target_arguments(publish, add_node_arguments)
    add = publish.add_argument
    add("values", nargs="*", metavar="VALUE", help="one message each (default: stdin)")
    add("--file", metavar="PATH", help="publish this file's content as one message")
    add("--lines", action="store_true", help="stdin: one message a line (default: all of it, one)")
    add("--count", type=COUNT, help="publish this many generated payloads instead")
    add("--size", type=COUNT, default=100, help="bytes of each generated payload")
    add("--key", help="the messages' key (UTF-8)")
    add("--header", action="append", default=[], metavar="NAME=VALUE", help="(repeatable)")
    add("--summary", action="store_true", help="one summary line instead of one line each")
    publish.set_defaults(func=run_publish_command)

    subscribe = subparsers.add_parser(
        "subscribe",
        help="print a topic's messages",
        description="Print the topic's messages as they arrive (Lagged/Lost on stderr).",
    )
    _target_arguments(subscribe, add_node_arguments)
    add = subscribe.add_argument
    add("--json", action="store_true", help="one JSON object a line")
    add("--count", type=COUNT, help="exit after this many messages")
    add("--buffer", type=COUNT, default=SUBSCRIPTION_BUFFER, help="items held for us")
    subscribe.set_defaults(func=run_subscribe_command)


def _target_arguments(parser: argparse.ArgumentParser, add_node_arguments: Any) -> None:
    parser.add_argument("--agent", metavar="PATH", help="the agent's socket")
    add_node_arguments(parser)  # --bootstrap and friends, for a temporary node
    parser.add_argument("--topic", required=True, type=topic_name)
    parser.add_argument(
        "--join-timeout",
        type=POSITIVE,
        default=JOIN_TIMEOUT,
        help="temporary node: longest wait for a first neighbour",
    )
    parser.add_argument(
        "--debug", action="store_true", default=argparse.SUPPRESS, help="tracebacks on errors"
    )


def _check_target(args: argparse.Namespace) -> None:
    if (args.agent is None) == (not args.bootstrap):
        raise UsageError("give either --agent PATH or --bootstrap ADDR (a temporary node)")
    check_addresses(args.listen, args.bootstrap)


# -- publish ---------------------------------------------------------------------------------


def _records(args: argparse.Namespace) -> Iterator[Record]:
    key = None if args.key is None else args.key.encode()
    headers = []
    for header in args.header:
        name, sep, value = header.partition("=")
        if not sep or not name:
            raise UsageError(f"--header takes NAME=VALUE, not {header!r}")
        headers.append((name, value.encode()))
    given = [
        name
        for name, present in (
            ("VALUEs", bool(args.values)),
            ("--count", args.count is not None),
            ("--file", args.file is not None),
            ("--lines", args.lines),
        )
        if present
    ]
    if len(given) > 1:
        raise UsageError(f"give one of VALUEs, --file, --lines (stdin) or --count, not {given}")
    values: Any
    if args.count is not None:
        values = (_payload(i, args.size) for i in range(args.count))
    elif args.values:
        values = (value.encode() for value in args.values)
    elif args.file is not None:
        values = [_read_file(args.file)]
    elif args.lines:
        values = (line.rstrip(b"\r\n") for line in sys.stdin.buffer)
    else:
        values = [sys.stdin.buffer.read()]  # binary data has no lines to split at
    return (Record(value, key, tuple(headers)) for value in values)


def _read_file(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise UsageError(f"--file: cannot read {path!r}: {exc.strerror}") from None


def _payload(i: int, size: int) -> bytes:
    head = b"%d " % i
    return head + b"x" * (size - len(head)) if size > len(head) else head[:size]


def run_publish_command(args: argparse.Namespace) -> int:
    _check_target(args)
    records = _records(args)
    summary = args.summary or args.count is not None
    if args.agent is not None:
        published: list[Receipt] = []
        with AgentClient(args.agent) as client:
            client.join(args.topic)
            batch: list[Record] = []
            for record in records:
                batch.append(record)
                if len(batch) >= PUBLISH_BATCH:
                    published += _report(client.publish_batch(args.topic, batch), summary)
                    batch = []
            if batch:
                published += _report(client.publish_batch(args.topic, batch), summary)
    else:
        key, config = load_key(args.key_file), load_config(args.config)
        published = _report(trio.run(_publish_alone, args, key, config, list(records)), summary)
    if summary:
        if published:
            publisher = format_publisher(published[0].publisher)
            print(
                f"published {len(published)} messages to {args.topic!r} as {publisher} "
                f"(seq {published[0].seq}..{published[-1].seq})"
            )
        else:
            print(f"published nothing to {args.topic!r}: no values")
    return 0


def _report(published: list[Receipt], summary: bool) -> list[Receipt]:
    if not summary:
        for p in published:
            print(f"{p.seq} {(p.id or b'').hex()}", flush=True)
    return published


async def _joined_node(args: argparse.Namespace, node: Node) -> None:
    """Join through --bootstrap; Node.join returns once the first neighbour is there, as a
    message published before any link exists would reach nobody."""
    await node.join(args.topic, args.bootstrap, timeout=args.join_timeout)


async def _publish_alone(
    args: argparse.Namespace, key: bytes, config: Any, records: list[Record]
) -> list[Receipt]:
    out = []
    async with Node(
        key=key,
        listen=args.listen,
        advertise=args.advertise,
        config=config,
        encrypt=args.encrypt,
        sign=args.sign,
    ) as node:
        await _joined_node(args, node)
        for record in records:
            out.append(
                await node.publish_record(args.topic, record.value, record.key, record.headers)
            )
    return out


# -- subscribe -------------------------------------------------------------------------------


def run_subscribe_command(args: argparse.Namespace) -> int:
    _check_target(args)
    show = _json_line if args.json else _text_line
    if args.agent is not None:
        with AgentClient(args.agent) as client:
            client.join(args.topic)
            with client.subscribe(args.topic, args.buffer) as sub:
                _say_subscribed(args.topic)
                _print_items(_iterate(sub), show, args.count)
        return 0
    key, config = load_key(args.key_file), load_config(args.config)
    trio.run(_subscribe_alone, args, key, config, show)
    return 0


def _iterate(sub: AgentSubscription) -> Iterator[Item]:
    yield from sub
    raise ConnectionError(f"the agent ended the subscription: {sub.ended}")


async def _subscribe_alone(
    args: argparse.Namespace, key: bytes, config: Any, show: Callable[[Delivery], str]
) -> None:
    node = Node(
        key=key,
        listen=args.listen,
        advertise=args.advertise,
        config=config,
        encrypt=args.encrypt,
        sign=args.sign,
    )
    async with node, node.subscribe(args.topic, args.buffer) as sub:
        await _joined_node(args, node)
        _say_subscribed(args.topic)
        seen = 0
        async for item in sub:
            seen += _print_item(item, show)
            if args.count is not None and seen >= args.count:
                return


def _say_subscribed(topic: str) -> None:
    print(f"subscribed to {topic!r}", file=sys.stderr, flush=True)


def _print_items(items: Iterator[Item], show: Callable[[Delivery], str], count: int | None) -> None:
    seen = 0
    for item in items:
        seen += _print_item(item, show)
        if count is not None and seen >= count:
            return


def _print_item(item: Item, show: Callable[[Delivery], str]) -> int:
    if isinstance(item, Delivery):
        try:
            rows = unbatch(item)  # a record batch: a line per row
        except BatchFormatError as exc:
            print(f"unreadable record batch at seq {item.seq}: {exc}", file=sys.stderr, flush=True)
            return 0
        for row in rows:
            print(show(row), flush=True)
        return len(rows)
    if isinstance(item, Lagged):
        print(f"lagged: {item.count} items dropped here", file=sys.stderr, flush=True)
    elif isinstance(item, Lost):
        publisher = format_publisher(item.publisher)
        print(
            f"lost: {publisher} seq {item.first_seq}..{item.last_seq}", file=sys.stderr, flush=True
        )
    return 0


def _text_line(message: Delivery) -> str:
    return message.value.decode("utf-8", "backslashreplace")


def _bytes_fields(name: str, value: bytes | None) -> dict[str, Any]:
    if value is None:
        return {name: None}
    try:
        return {name: value.decode("utf-8")}
    except UnicodeDecodeError:
        return {name: base64.b64encode(value).decode("ascii"), f"{name}_encoding": "base64"}


def message_json(message: Delivery) -> dict[str, Any]:
    out: dict[str, Any] = {
        "topic": message.topic,
        "publisher": format_publisher(message.publisher),
        "seq": message.seq,
        "timestamp_ms": message.timestamp_ms,
        "id": message.id.hex(),
    }
    out.update(_bytes_fields("key", message.key))
    out.update(_bytes_fields("value", message.value))
    out["headers"] = [{"name": n, **_bytes_fields("value", v)} for n, v in message.headers]
    return out


def _json_line(message: Delivery) -> str:
    return json.dumps(message_json(message), sort_keys=True)
