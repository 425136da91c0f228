"""`episub sim SCENARIO`: run a simulation from the command line and report it.

`--json` prints one JSON object (sorted keys, so equal runs print equal bytes);
otherwise a few aligned lines for a human. `--no-timing` leaves out wall-clock numbers,
the only part of the report that differs between two runs with the same arguments.
Defaults come from `SimParams`, where each one says where it came from.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from episub.sim.faults import MESSAGE_KINDS, OneWayPartition, parse_delay, parse_drop
from episub.sim.latency import MODELS
from episub.sim.params import DEFAULT_ZONES, SCENARIOS, SimParams
from episub.sim.scenarios import run

_DEFAULTS = SimParams()
PROXIMITY_RUNS = ("proximity_on", "proximity_off")


def _number(
    kind: type,
    low: float | None = None,
    high: float | None = None,
    *,
    above: bool = False,
    below: bool = False,
) -> Any:
    """An argparse type: parse with `kind`, check low <= value <= high (strict with
    `above`/`below`), and say what was wrong in one line."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a {kind.__name__}, got {text!r}") from None
        if low is not None and (value <= low if above else value < low):
            raise argparse.ArgumentTypeError(f"must be {'>' if above else '>='} {low}, got {text}")
        if high is not None and (value >= high if below else value > high):
            raise argparse.ArgumentTypeError(f"must be {'<' if below else '<='} {high}, got {text}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


COUNT = _number(int, 1)
NONNEGATIVE_INT = _number(int, 0)
SECONDS = _number(float, 0)  # zero allowed: "no such phase"
POSITIVE = _number(float, 0, above=True)
SHARE = _number(float, 0, 1, below=True)  # a probability or fraction in [0, 1)


def _checked(parse: Any, name: str) -> Any:
    """An argparse type from a parser that raises ValueError with a one-line reason."""

    def check(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    check.__name__ = name
    return check


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the `sim` subcommand on `subparsers` (from `add_subparsers()`)."""
    d = _DEFAULTS
    parser = subparsers.add_parser(
        "sim",
        help="run a deterministic simulation of many nodes",
        description="Run many episub cores on a simulated network and report the paper's "
        "metrics (reliability, RMR, LDH, latency, stretch, view health).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add = parser.add_argument
    add("scenario", choices=SCENARIOS)
    add("--nodes", type=_number(int, 2), default=d.nodes, help="overlay size")
    add("--messages", type=COUNT, default=d.messages, help="counted messages")
    add("--warmup", type=NONNEGATIVE_INT, default=d.warmup, help="unmeasured messages first")
    add("--seed", type=NONNEGATIVE_INT, default=d.seed, help="determines every random choice")
    add("--interval", type=POSITIVE, default=d.interval, help="seconds between messages")
    add(
        "--settle",
        type=SECONDS,
        default=d.settle,
        help="seconds of quiet after the joins (default 30; 90 for proximity)",
    )
    add("--latency", choices=MODELS, help="latency model (default: uniform; proximity: coords)")
    add("--latency-ms", type=POSITIVE, default=d.latency_ms, help="the constant model's delay")
    add("--zones", type=COUNT, help=f"zones model with K zones (default {DEFAULT_ZONES})")
    add("--loss", type=SHARE, default=d.loss, help="probability a send is dropped")
    add("--hop-cost-ms", type=SECONDS, default=d.hop_cost_ms, help="processing time per hop")
    add(
        "--near-parent-factor",
        type=_number(float, 0),
        default=d.near_parent_factor,
        help="broadcast's near parent rule: RTT factor (0: off, the default)",
    )
    add(
        "--stream-trees",
        type=NONNEGATIVE_INT,
        default=d.stream_trees,
        help="streams with a delivery tree of their own (0: one tree for all, Plumtree's)",
    )
    add(
        "--race-lazy-hops",
        type=NONNEGATIVE_INT,
        default=d.race_lazy_hops,
        help="broadcast's lazy race: hops a lazy announcer must save (0: off, the default)",
    )
    add(
        "--swap-factor-growth",
        type=_number(float, 1),
        default=d.swap_factor_growth,
        help="proximity, several senders: each swap makes the next dearer by this (1: off)",
    )
    add("--join-rate", type=POSITIVE, help="joins per second (default N/20 within 100..500)")
    add(
        "--senders",
        type=COUNT,
        help="publishers, round-robin (default: multi-sender 4, the other scenarios 1)",
    )
    add(
        "--sender",
        type=NONNEGATIVE_INT,
        metavar="NODE",
        help="one sender's runs: publish from NODE, not the node the seed draws",
    )
    add("--fraction", type=SHARE, default=d.fraction, help="crash: share of nodes that crash")
    add("--settle-after", type=SECONDS, default=d.settle_after, help="crash/partition: probing")
    add("--rate", type=_number(float, 0, 1), default=d.rate, help="churn: share replaced per s")
    add("--duration", type=SECONDS, default=d.duration, help="churn: seconds of churn")
    add("--lifetime", type=SECONDS, default=d.lifetime, help="churn: a message's lifetime")
    add("--partition-seconds", type=SECONDS, default=d.partition_seconds, help="cut length")
    add("--probe-interval", type=POSITIVE, default=d.probe_interval, help="seconds between probes")
    add("--probe-deadline", type=POSITIVE, default=d.probe_deadline, help="a probe's time limit")
    add(
        "--max-drain",
        type=SECONDS,
        default=d.max_drain,
        help="longest drain after the last publish",
    )
    kinds = ", ".join(MESSAGE_KINDS)
    add(
        "--drop",
        type=_checked(parse_drop, "KIND=P"),
        action="append",
        default=[],
        metavar="KIND=P",
        help=f"drop sends of a message kind with probability P, repeatable (kinds: {kinds})",
    )
    add(
        "--delay",
        type=_checked(parse_delay, "KIND=SECONDS"),
        action="append",
        default=[],
        metavar="KIND=SECONDS",
        help="deliver a message kind SECONDS late, repeatable",
    )
    add(
        "--one-way-partition",
        type=_checked(OneWayPartition.parse, "FRACTION@START-END"),
        metavar="FRACTION@START-END",
        help="a FRACTION of the nodes, the sender among them, cannot send to the others "
        "from START to END seconds after the first counted message (e.g. 0.5@2-6)",
    )
    add(
        "--jobs",
        type=COUNT,
        default=min(2, os.cpu_count() or 1),
        help="processes for proximity's two runs (the report does not depend on it)",
    )
    add(
        "--draw",
        metavar="FILE.png",
        help="draw the overlay at the end (proximity: the run with proximity on); needs "
        "the viz extra",
    )
    add(
        "--publisher",
        type=NONNEGATIVE_INT,
        metavar="NODE",
        help="--draw highlights this node's eager tree (default: the first sender)",
    )
    add("--plot", metavar="DIR", help="write the run's plots (PNG) here; needs the viz extra")
    add("--json", action="store_true", help="print one JSON object on stdout")
    add("--no-timing", action="store_true", help="leave out wall-clock numbers")
    add("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(func=run_command, parser=parser)
    return parser


def params_from_args(args: argparse.Namespace) -> SimParams:
    return SimParams(
        scenario=args.scenario,
        nodes=args.nodes,
        messages=args.messages,
        warmup=args.warmup,
        seed=args.seed,
        interval=args.interval,
        settle=args.settle,
        latency=args.latency,
        latency_ms=args.latency_ms,
        zones=args.zones,
        loss=args.loss,
        hop_cost_ms=args.hop_cost_ms,
        join_rate=args.join_rate,
        senders=args.senders,
        sender=args.sender,
        fraction=args.fraction,
        settle_after=args.settle_after,
        rate=args.rate,
        duration=args.duration,
        lifetime=args.lifetime,
        partition_seconds=args.partition_seconds,
        probe_interval=args.probe_interval,
        probe_deadline=args.probe_deadline,
        max_drain=args.max_drain,
        drop=tuple(args.drop),
        delay=tuple(args.delay),
        one_way_partition=args.one_way_partition,
        near_parent_factor=args.near_parent_factor,
        stream_trees=args.stream_trees,
        race_lazy_hops=args.race_lazy_hops,
        swap_factor_growth=args.swap_factor_growth,
    )


def run_command(args: argparse.Namespace) -> int:
    try:
        params = params_from_args(args)
    except ValueError as exc:
        args.parser.error(str(exc))  # exits with status 2
    pictures = args.draw is not None or args.plot is not None
    if pictures:
        from episub.extras import require

        require("viz", "matplotlib", "networkx")  # before the run, not after it
    progress = not args.quiet and sys.stderr.isatty()
    report = run(
        params, progress=progress, timing=not args.no_timing, jobs=args.jobs, extras=pictures
    )
    extras = _take_extras(report)
    if args.json:
        print(json.dumps(report, sort_keys=True))
    else:
        print(format_report(report))
    if pictures:
        from episub.viz import simplots

        if args.draw is not None:
            overlay = extras.get("proximity_on", extras.get(""))
            assert overlay is not None  # every scenario's run keeps one overlay
            path = simplots.draw_run(overlay["overlay"], args.draw, args.publisher)
            print(f"drew {path}", file=sys.stderr)
        if args.plot is not None:
            for path in simplots.write_plots(report, extras, params, args.plot, jobs=args.jobs):
                print(f"wrote {path}", file=sys.stderr)
    return 0


def _take_extras(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Move the runs' "overlay" and "series" out of `report`, by run ("" for the one run of
    most scenarios, "proximity_on"/"proximity_off" for the proximity scenario)."""
    out = {}
    for key, part in [("", report), *((k, report.get(k)) for k in PROXIMITY_RUNS)]:
        if isinstance(part, dict) and "series" in part:
            out[key] = {"overlay": part.pop("overlay"), "series": part.pop("series")}
    return out


def _fmt(value: Any, unit: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}{unit}"
    return f"{value}{unit}"


def _lines(m: dict[str, Any]) -> list[tuple[str, str]]:
    rel = m["reliability"]
    rows = [
        ("reliability", f"{_fmt(rel)}  ({m['missed']} missed of {m['expected']})"),
        ("duplicates", _fmt(m["duplicates"])),
        ("rmr / ldh", f"{_fmt(m['rmr'])} / {_fmt(m['ldh'])}"),
        ("latency p50/p99", f"{_fmt(m['latency_p50_ms'])} / {_fmt(m['latency_p99_ms'], ' ms')}"),
        ("stretch mean", _fmt(m["stretch_mean"])),
        ("active views", " ".join(f"{k}:{v}" for k, v in m["active_view_hist"].items()) or "-"),
        (
            "asymmetric pairs",
            f"{m['symmetry_violations']} at the end, {m['symmetry_violations_persistent']} stuck",
        ),
    ]
    if m.get("dropped_by_faults"):
        rows.append(("fault drops", f"{m['dropped_by_faults']} sends"))
    if m.get("cross_zone_copies_per_message") is not None:
        rows.append(("cross-zone copies", _fmt(m["cross_zone_copies_per_message"], " per msg")))
    if m.get("heal_seconds") is not None or m.get("probes"):
        rows.append(
            (
                "heal",
                f"{_fmt(m['heal_seconds'], ' s')}  ({m['probes_reached']}/{m['probes']} probes)",
            )
        )
    for sender, s in m.get("per_sender", {}).items():
        rows.append(
            (
                f"sender {sender}",
                f"rel {_fmt(s['reliability'])}, rmr {_fmt(s['rmr'])}, ldh {_fmt(s['ldh'])}, "
                f"p50/p99 {_fmt(s['latency_p50_ms'])} / {_fmt(s['latency_p99_ms'], ' ms')}",
            )
        )
    events = f"{m['events']} in {_fmt(m['sim_seconds'], ' sim s')}"
    if "wall_seconds" in m:
        events += f", {m['wall_seconds']} s wall ({m['events_per_second']} events/s)"
    rows.append(("events", events))
    return rows


def format_report(report: dict[str, Any]) -> str:
    """A few aligned lines for a human."""
    head = (
        f"{report['scenario']}: {report['nodes']} nodes, {report['messages']} messages, "
        f"seed {report['seed']}, latency {report['latency']}"
    )
    if "faults" in report:
        f = report["faults"]
        parts = [f"drop {k}={v:g}" for k, v in f["drop"].items()]
        parts += [f"delay {k}={v:g}s" for k, v in f["delay"].items()]
        if f["one_way_partition"]:
            parts.append(f"one-way partition {f['one_way_partition']}")
        head += f"\nfaults: {', '.join(parts)}"
    if report["scenario"] == "proximity":
        on, off = _lines(report["proximity_on"]), _lines(report["proximity_off"])
        width = max(len(label) for label, _ in on)
        col = max(len(value) for _, value in on)
        out = [head, f"{'':{width}}  {'proximity on':{col}}  proximity off"]
        out += [f"{a:{width}}  {x:{col}}  {y}" for (a, x), (_, y) in zip(on, off, strict=True)]
        return "\n".join(out)
    rows = _lines(report)
    width = max(len(label) for label, _ in rows)
    return "\n".join([head] + [f"{label:{width}}  {value}" for label, value in rows])
