"""`episub config get|set`: read or write a live configuration (episub.config).

    episub config get --agent /tmp/a.sock                       # {"version": 3, "values": {...}}
    episub config get --agent /tmp/a.sock threshold             # 0.7
    EPISUB_KEY=... episub config set --bootstrap 10.0.0.5:7000 threshold=0.7 mode=fast
    episub config set --agent /tmp/a.sock --delete old_flag

A VALUE is JSON when it parses as JSON (`0.7`, `true`, `{"a": 1}`, `"quoted"`), else the
text itself (`mode=fast` sets the string "fast"). All KEY=VALUEs and --deletes of one
command are one write, under one new version; `--repeat N` makes N such writes in a row.

With `--bootstrap`, the command runs a temporary node: it joins the configuration's topic,
catches up from a neighbour (so its write is stamped above what the deployment holds), and
before exiting waits until a neighbour holds its write (`--confirm-timeout`).
"""

from __future__ import annotations

import argparse
import base64
import json
from collections.abc import Callable
from typing import Any

import trio

from episub.agent.client import AgentClient
from episub.agent.options import UsageError, check_addresses, load_config, load_key, number_type
from episub.config import DELETE, ConfigReplica
from episub.config.codec import value_of
from episub.node import Node

__all__ = ["add_parser"]

COUNT = number_type(int, 1)
POSITIVE = number_type(float, 0, above=True)
CONFIRM_TIMEOUT = 10.0  # s; guess: a few sync rounds (SYNC_TIMEOUT) on a busy machine
SYNC_WAIT = 10.0  # s a temporary node waits to catch up before writing; as the agent's


def add_parser(subparsers: Any, add_node_arguments: Callable[[Any], None]) -> None:
    config = subparsers.add_parser(
        "config",
        help="read or write a live configuration",
        description="Read or write a live configuration replicated over the overlay.",
    )
    actions = config.add_subparsers(dest="action", required=True, metavar="{get,set}")
    get = actions.add_parser("get", help="print the configuration, or one key's value")
    get.add_argument("key", nargs="?", help="print only this key's value (JSON)")
    set_ = actions.add_parser("set", help="set KEY=VALUEs and delete keys, as one write")
    set_.add_argument("assignments", nargs="*", metavar="KEY=VALUE")
    set_.add_argument("--delete", action="append", default=[], metavar="KEY")
    set_.add_argument("--repeat", type=COUNT, default=1, help="make the write N times")
    set_.add_argument(
        "--confirm-timeout",
        type=POSITIVE,
        default=CONFIRM_TIMEOUT,
        help="temporary node: longest wait for a neighbour to hold the write",
    )
    for parser in (get, set_):
        parser.add_argument("--agent", metavar="PATH", help="the agent's socket")
        add_node_arguments(parser)  # --bootstrap and friends, for a temporary node
        parser.add_argument("--name", default="default", help="the configuration's name")
        parser.add_argument(
            "--debug", action="store_true", default=argparse.SUPPRESS, help="tracebacks on errors"
        )
        parser.set_defaults(func=run_config_command)


def parse_assignment(text: str) -> tuple[str, object]:
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise UsageError(f"give KEY=VALUE, not {text!r}")
    try:
        return key, json.loads(raw)
    except json.JSONDecodeError:
        return key, raw


def run_config_command(args: argparse.Namespace) -> int:
    if (args.agent is None) == (not args.bootstrap):
        raise UsageError("give either --agent PATH or --bootstrap ADDR (a temporary node)")
    check_addresses(args.listen, args.bootstrap)
    changes: dict[str, object] = {}
    if args.action == "set":
        changes = dict(parse_assignment(a) for a in args.assignments)
        changes.update((key, DELETE) for key in args.delete)
        if not changes:
            raise UsageError("give at least one KEY=VALUE or --delete KEY")
    if args.agent is not None:
        with AgentClient(args.agent) as client:
            view = client.config_read(args.name)
            for _ in range(args.repeat if changes else 0):
                values = {k: v for k, v in changes.items() if v is not DELETE}
                deleted = [k for k, v in changes.items() if v is DELETE]
                view = client.config_write(args.name, values, deleted)
        values, version = view.values, view.version
    else:
        key, config = load_key(args.key_file), load_config(args.config)
        version, values = trio.run(_alone, args, key, config, changes)
    _print(args, version, values)
    return 0


async def _alone(
    args: argparse.Namespace, key: bytes, config: Any, changes: dict[str, object]
) -> tuple[int, dict[str, object]]:
    async with (
        Node(
            key=key,
            listen=args.listen,
            advertise=args.advertise,
            config=config,
            encrypt=args.encrypt,
            sign=args.sign,
        ) as node,
        trio.open_nursery() as nursery,
    ):
        replica = ConfigReplica(node, args.name, bootstrap=args.bootstrap)
        await nursery.start(replica.run)
        with trio.move_on_after(SYNC_WAIT):
            await replica.synced.wait()
        for _ in range(args.repeat if changes else 0):
            await replica.write(changes)
        if changes and not await replica.confirm(list(changes), args.confirm_timeout):
            raise UsageError(
                f"no neighbour confirmed the write within {args.confirm_timeout} s; "
                "it may not have reached the deployment"
            )
        nursery.cancel_scope.cancel()
        values = {k: value_of(e) for k, e in replica.state.values().items()}
        return replica.state.version, values


def _printable(value: object) -> object:
    if isinstance(value, bytes):
        return {"base64": base64.b64encode(value).decode("ascii")}
    return value


def _print(args: argparse.Namespace, version: int, values: dict[str, object]) -> None:
    if args.action == "get" and args.key is not None:
        if args.key not in values:
            raise UsageError(f"configuration {args.name!r} has no key {args.key!r}")
        print(json.dumps(_printable(values[args.key])))
        return
    shown = {k: _printable(v) for k, v in sorted(values.items())}
    print(json.dumps({"name": args.name, "version": version, "values": shown}))
