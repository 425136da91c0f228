"""Aggregation and printing of loopback.py's figures (see loopback.py for their meaning).

Imported by loopback.py; not run by itself.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

from _common import percentile


def pct(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile, q in 0..1; None for no values."""
    return percentile(values, q * 100) if values else None


def _ratio(num: float | None, den: float) -> float | None:
    return None if num is None or den <= 0 else num / den


def aggregate(results: list[dict[str, Any]]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    delivered = sum(r["distinct"] for r in results)
    expected = sum(r["expected"] for r in results)
    latencies = sorted(x / 1e6 for r in results for x in r["latency_ns"])
    rates, nodes = [], []
    for r in results:
        span = None
        if r["first_recv_ns"] is not None and r["distinct"] > 1:
            span = (r["last_recv_ns"] - r["first_recv_ns"]) / 1e9
        rate = r["distinct"] / span if span else None
        if r["expected"] > 0 and rate is not None:
            rates.append(rate)
        lat = sorted(x / 1e6 for x in r["latency_ns"])
        node = {k: v for k, v in r.items() if k not in ("latency_ns", "config", "versions")}
        handled = r["published"] if r["role"] == "publisher" else r["distinct"]
        node.update(
            msgs_per_s=rate,
            latency_p50_ms=pct(lat, 0.5),
            latency_p99_ms=pct(lat, 0.99),
            wakeups_per_message=_ratio(r.get("wakeups"), handled),
        )
        nodes.append(node)
    copies = [r["payload_copies"] for r in results]
    wire = [r["wire_bytes_written"] for r in results]
    cpu = sum(r["cpu_s"] for r in results)
    woken = [r.get("wakeups") for r in results]
    pubs = [r for r in results if r["role"] == "publisher" and r["publish_end_ns"]]
    pub_rates = [
        r["published"] / ((r["publish_end_ns"] - r["publish_start_ns"]) / 1e9)
        for r in pubs
        if r["publish_end_ns"] > r["publish_start_ns"]
    ]
    summary = {
        "delivered": delivered,
        "expected": expected,
        "delivery_ratio": _ratio(delivered, expected),
        "msgs_per_s_per_receiver_median": statistics.median(rates) if rates else None,
        "msgs_per_s_per_receiver_min": min(rates) if rates else None,
        "msgs_per_s_per_receiver_max": max(rates) if rates else None,
        "latency_p50_ms": pct(latencies, 0.5),
        "latency_p99_ms": pct(latencies, 0.99),
        # The pooled latency distribution at each whole percent (0..100), for a CDF.
        "latency_quantiles_ms": [pct(latencies, q / 100) for q in range(101)]
        if latencies
        else None,
        "latency_max_ms": latencies[-1] if latencies else None,
        "payload_copies_per_delivered": _ratio(None if None in copies else sum(copies), delivered),
        "wire_bytes_per_delivered": _ratio(None if None in wire else sum(wire), delivered),
        "cpu_s_per_delivered": _ratio(cpu, delivered),
        "cpu_s_total": cpu,
        # Times a node process blocked and was woken (voluntary context switches), all
        # nodes, per delivered message.
        "wakeups_per_delivered": _ratio(None if None in woken else sum(woken), delivered),
        "duplicates_to_app": sum(r["duplicates"] for r in results),
        "publish_rate_achieved": statistics.mean(pub_rates) if pub_rates else None,
        "nodes_timed_out": sum(1 for r in results if r["timed_out"]),
    }
    return summary, nodes


def fmt(value: Any, spec: str = ".3g") -> str:
    return "-" if value is None else format(value, spec)


def print_report(
    args: argparse.Namespace, summary: dict[str, Any], nodes: list[dict], machine: dict
) -> None:
    print(
        f"\n{args.system}: N={args.nodes} size={args.size}B M={args.messages} "
        f"K={args.publishers} rate={'burst' if args.rate == 0 else f'{args.rate:g}/s'}"
    )
    rows = [
        ("delivery ratio", fmt(summary["delivery_ratio"], ".4f")),
        ("delivered / expected", f"{summary['delivered']} / {summary['expected']}"),
        ("msgs/s per receiver (median)", fmt(summary["msgs_per_s_per_receiver_median"], ".1f")),
        (
            "msgs/s per receiver (min..max)",
            f"{fmt(summary['msgs_per_s_per_receiver_min'], '.1f')}.."
            f"{fmt(summary['msgs_per_s_per_receiver_max'], '.1f')}",
        ),
        ("publish rate achieved (msg/s)", fmt(summary["publish_rate_achieved"], ".1f")),
        (
            "latency p50 / p99 (ms)",
            f"{fmt(summary['latency_p50_ms'], '.1f')} / {fmt(summary['latency_p99_ms'], '.1f')}",
        ),
        ("payload copies per delivered", fmt(summary["payload_copies_per_delivered"], ".2f")),
        ("wire bytes per delivered", fmt(summary["wire_bytes_per_delivered"], ".0f")),
        ("CPU ms per delivered", fmt((summary["cpu_s_per_delivered"] or 0) * 1e3, ".3f")),
        ("wakeups per delivered", fmt(summary.get("wakeups_per_delivered"), ".3f")),
        ("nodes timed out", str(summary["nodes_timed_out"])),
        ("data phase (s)", fmt(machine.get("data_phase_s"), ".1f")),
        ("CPU s of other processes", fmt(machine.get("other_cpu_s"), ".1f")),
    ]
    for name, value in rows:
        print(f"  {name:<32} {value}")
    print(
        f"  {'node':>4} {'role':<9} {'distinct':>9} {'copies':>7} {'msg/s':>8} "
        f"{'p50ms':>8} {'p99ms':>8} {'cpu_s':>7} {'wireMB':>7} {'wake/msg':>8}"
    )
    for n in nodes:
        wire_mb = None if n["wire_bytes_written"] is None else n["wire_bytes_written"] / 1e6
        print(
            f"  {n['index']:>4} {n['role']:<9} {n['distinct']:>4}/{n['expected']:<4} "
            f"{fmt(n['payload_copies'], 'd'):>7} {fmt(n['msgs_per_s'], '.1f'):>8} "
            f"{fmt(n['latency_p50_ms'], '.1f'):>8} {fmt(n['latency_p99_ms'], '.1f'):>8} "
            f"{n['cpu_s']:>7.2f} {fmt(wire_mb, '.2f'):>7} "
            f"{fmt(n.get('wakeups_per_message'), '.3f'):>8}"
        )
