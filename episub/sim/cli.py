"""`episub sim SCENARIO`: run a simulation from the command line and report it.

`--json` prints one JSON object (sorted keys, so equal runs print equal bytes);
otherwise a few aligned lines for a human. `--no-timing` leaves out wall-clock numbers,
the only part of the report that differs between two runs with the same arguments.
Defaults come from `SimParams`, where each one says where it came from.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from episub.sim.latency import MODELS
from episub.sim.scenarios import SCENARIOS, SimParams, run

_DEFAULTS = SimParams()


def _bounded(kind: type, low: float | None = None, high: float | None = None, open_high=False):
    """An argparse type: parse with `kind`, check the range, say what was wrong."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a {kind.__name__}, got {text!r}") from None
        if low is not None and value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {text}")
        if high is not None and (value >= high if open_high else value > high):
            raise argparse.ArgumentTypeError(
                f"must be {'<' if open_high else '<='} {high}, got {text}"
            )
        return value

    parse.__name__ = kind.__name__
    return parse


def _positive(kind: type):
    def parse(text: str) -> Any:
        value = _bounded(kind, 0)(text)
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value

    parse.__name__ = kind.__name__
    return parse


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the `sim` subcommand on `subparsers` (from `add_subparsers()`)."""
    d = _DEFAULTS
    parser = subparsers.add_parser(
        "sim",
        help="run a deterministic simulation of many nodes",
        description="Run many episub cores on a simulated network and report the paper's "
        "metrics (reliability, RMR, LDH, latency, stretch, view health).",
    )
    parser.add_argument("scenario", choices=SCENARIOS)
    add = parser.add_argument
    add("--nodes", type=_bounded(int, 2), default=d.nodes, help="overlay size (%(default)s)")
    add("--messages", type=_bounded(int, 1), default=d.messages, help="counted messages")
    add("--warmup", type=_bounded(int, 0), default=d.warmup, help="unmeasured messages first")
    add("--seed", type=_bounded(int, 0), default=d.seed)
    add("--interval", type=_positive(float), default=d.interval, help="seconds between messages")
    add("--settle", type=_bounded(float, 0), default=d.settle, help="seconds after the joins")
    add(
        "--latency", choices=MODELS, default=None, help="latency model (uniform; proximity: coords)"
    )
    add("--latency-ms", type=_positive(float), default=d.latency_ms, help="constant model's delay")
    add("--zones", type=_bounded(int, 1), default=None, help="zones model with K zones")
    add("--loss", type=_bounded(float, 0, 1, open_high=True), default=d.loss)
    add("--hop-cost-ms", type=_bounded(float, 0), default=d.hop_cost_ms)
    add(
        "--join-rate", type=_positive(float), default=None, help="joins per second (N/20, 100..500)"
    )
    add("--senders", type=_bounded(int, 1), default=d.senders, help="multi-sender: publishers")
    add("--fraction", type=_bounded(float, 0, 1, open_high=True), default=d.fraction,
        help="crash: share of nodes that crash")  # fmt: skip
    add("--settle-after", type=_bounded(float, 0), default=d.settle_after,
        help="crash/partition: probing seconds before the counted messages")  # fmt: skip
    add("--rate", type=_bounded(float, 0, 1), default=d.rate, help="churn: share replaced per s")
    add("--duration", type=_bounded(float, 0), default=d.duration, help="churn: seconds")
    add("--lifetime", type=_bounded(float, 0), default=d.lifetime, help="churn: message lifetime")
    add("--partition-seconds", type=_bounded(float, 0), default=d.partition_seconds)
    add("--probe-interval", type=_positive(float), default=d.probe_interval)
    add("--probe-deadline", type=_positive(float), default=d.probe_deadline)
    add("--max-drain", type=_bounded(float, 0), default=d.max_drain)
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
        fraction=args.fraction,
        settle_after=args.settle_after,
        rate=args.rate,
        duration=args.duration,
        lifetime=args.lifetime,
        partition_seconds=args.partition_seconds,
        probe_interval=args.probe_interval,
        probe_deadline=args.probe_deadline,
        max_drain=args.max_drain,
    )


def run_command(args: argparse.Namespace) -> int:
    try:
        params = params_from_args(args)
    except ValueError as exc:
        args.parser.error(str(exc))  # exits with status 2
    progress = not args.quiet and sys.stderr.isatty()
    report = run(params, progress=progress, timing=not args.no_timing)
    if args.json:
        print(json.dumps(report, sort_keys=True))
    else:
        print(format_report(report))
    return 0


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
        ("symmetry", f"{m['symmetry_violations']} violations"),
    ]
    if m.get("cross_zone_copies_per_message") is not None:
        rows.append(("cross-zone copies", _fmt(m["cross_zone_copies_per_message"], " per msg")))
    if m.get("heal_seconds") is not None or m.get("probes"):
        rows.append(
            (
                "heal",
                f"{_fmt(m['heal_seconds'], ' s')}  ({m['probes_reached']}/{m['probes']} probes)",
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
