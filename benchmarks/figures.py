"""The figures at the top of docs/benchmarks.md, drawn from the JSON of one sitting.

    .venv/bin/python benchmarks/figures.py            # after `bash benchmarks/sitting.sh`

Reads benchmarks/results/sitting/*.json (and benchmarks/results/before/ for the figures
before the fast path), draws docs/img/bench_*.png (matplotlib, the viz extra) and rewrites the
part of docs/benchmarks.md between the `figures:start` and `figures:end` markers: the
pictures with their captions, then the tables, every number taken from a JSON file named
beside it. What each picture draws is one function's answer (`burst_bars`, `config_bars`,
`latency_lines`): one bar per run, each with its own label, which tests/test_docs.py checks
against the JSON.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SITTING = ROOT / "benchmarks" / "results" / "sitting"
BEFORE = ROOT / "benchmarks" / "results" / "before"
IMG = ROOT / "docs" / "img"
DOC = ROOT / "docs" / "benchmarks.md"
START, END = "<!-- figures:start -->", "<!-- figures:end -->"


def load(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.exists() else None


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def json_name(path: Path) -> str:
    """A table's JSON cell: the file's name, its directory said once above the tables."""
    return f"`{path.name}`" if path.parent == SITTING else f"`{path.parent.name}/{path.name}`"


def fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def loopback_row(name: str, path: Path) -> tuple[str, dict[str, Any]] | None:
    run = load(path)
    if run is None:
        return None
    s = run["summary"]
    row = (
        f"| {name} | {fmt(s['msgs_per_s_per_receiver_median'], 0)} | {s['delivery_ratio']:.4f} | "
        f"{fmt(s['latency_p50_ms'])} / {fmt(s['latency_p99_ms'])} | "
        f"{fmt(1000 * s['cpu_s_per_delivered'], 3) if s.get('cpu_s_per_delivered') else '-'} | "
        f"{fmt(run['machine'].get('other_cpu_s'))} | {json_name(path)} |"
    )
    return row, s


def role_cpu_us(run: dict[str, Any]) -> dict[str, float]:
    """CPU microseconds per published message of the publisher, a relay and a leaf."""
    nodes = run["nodes"]
    messages = run["params"]["messages"]
    receivers = sorted(
        (n for n in nodes if n["role"] == "receiver"),
        key=lambda n: n.get("wire_bytes_written") or 0,
    )
    picks = {"publisher": nodes[0], "relay": receivers[-1], "leaf": receivers[0]}
    return {role: 1e6 * n["cpu_s"] / messages for role, n in picks.items()}


def profile_lines() -> list[str]:
    before_run = load(BEFORE / "episub_n8_256B_burst20000.json")
    after_run = load(SITTING / "episub_n8_256B_burst20000.json")
    before_prof = load(BEFORE / "profile_before.json")
    after_prof = load(SITTING / "profile_after.json")
    if not (before_run and after_run and before_prof and after_prof):
        return []
    before, after = role_cpu_us(before_run), role_cpu_us(after_run)
    lines = ["", "### Where a message's CPU goes: publisher, relay and leaf, before and after",
             "", "CPU per published message in the 8-node, 256 B, 20,000-message burst (not "
             "profiled), then each role's profiled time by area (cProfile, wall time, the "
             "epoll wait left out):", "",
             "| role | CPU us per message, before | after |", "|---|---|---|"]  # fmt: skip
    for role in ("publisher", "relay", "leaf"):
        lines.append(f"| {role} | {before[role]:.0f} | {after[role]:.0f} |")
    areas = list(dict.fromkeys(
        a for prof in (before_prof, after_prof) for role in ("publisher", "relay", "leaf")
        for a in prof[role]["by_area_pct_of_busy"]
    ))  # fmt: skip
    lines += ["", "| area, % of profiled busy time | publisher before / after | relay before "
              "/ after | leaf before / after |", "|---|---|---|---|"]  # fmt: skip
    for area in areas:
        cells = []
        for role in ("publisher", "relay", "leaf"):
            b = before_prof[role]["by_area_pct_of_busy"].get(area, 0.0)
            a = after_prof[role]["by_area_pct_of_busy"].get(area, 0.0)
            cells.append(f"{b:.0f} / {a:.0f}")
        lines.append(f"| {area} | " + " | ".join(cells) + " |")
    files = f"`{rel(BEFORE / 'profile_before.json')}`, `{rel(SITTING / 'profile_after.json')}`"
    lines += ["", f"({files}: each role's top functions too.)"]
    return lines


def config_runs(system: str) -> list[dict[str, Any]]:
    runs = []
    for path in sorted(SITTING.glob(f"config_{system}_n32_run*.json")):
        run = load(path)
        assert run is not None
        run["_path"] = path
        run["_run"] = _run_number(path)
        runs.append(run)
    return runs


@dataclass(frozen=True)
class Bar:
    """One run's value in one panel of a picture."""

    label: str  # unique within its panel
    value: float
    group: str  # bars of one group share a colour (a system, or today / before)
    source: Path  # the JSON it comes from


# The burst runs: (shape, state, file). Today's run and the same shape before the fast path.
BURST_RUNS = (
    ("8 nodes, 256 B x 20,000", "today", SITTING / "episub_n8_256B_burst20000.json"),
    ("8 nodes, 256 B x 20,000", "before the fast path", BEFORE / "episub_n8_256B_burst20000.json"),
    ("16 nodes, 4 KiB x 5,000", "today", SITTING / "episub_n16_4KiB_burst5000.json"),
    ("16 nodes, 4 KiB x 5,000", "before the fast path", BEFORE / "episub_n16_4KiB_burst5000.json"),
)
BURST_PANELS = ("msgs/s per receiver (median)", "CPU ms per delivered message")
CONFIG_SYSTEMS = ("episub", "redis")
CONFIG_PANELS = ("p99 latency, ms (32 readers)", "CPU ms per update, all processes")


def burst_bars() -> dict[str, list[Bar]]:
    """bench_burst.png: per panel, one bar per burst run found, labelled by shape and state."""
    panels: dict[str, list[Bar]] = {name: [] for name in BURST_PANELS}
    for shape, state, path in BURST_RUNS:
        run = load(path)
        if run is None:
            continue
        s = run["summary"]
        label = f"{shape}, {state}"
        rate, cpu = s["msgs_per_s_per_receiver_median"], s["cpu_s_per_delivered"]
        panels[BURST_PANELS[0]].append(Bar(label, float(rate or 0), state, path))
        panels[BURST_PANELS[1]].append(Bar(label, 1000 * float(cpu or 0), state, path))
    return panels


def config_bars() -> dict[str, list[Bar]]:
    """bench_config.png: per panel, one bar per live-configuration run, "system, run N"."""
    panels: dict[str, list[Bar]] = {name: [] for name in CONFIG_PANELS}
    for system in CONFIG_SYSTEMS:
        for run in config_runs(system):
            label = f"{system}, run {run['_run']}"
            p99, cpu = run["latency"]["p99_ms"], run["cpu_ms_per_update"]
            panels[CONFIG_PANELS[0]].append(Bar(label, float(p99), system, run["_path"]))
            panels[CONFIG_PANELS[1]].append(Bar(label, float(cpu), system, run["_path"]))
    return panels


def latency_lines() -> dict[str, list[float]]:
    """bench_latency_cdf.png: one CDF per paced run, "system, run N": its latency at each
    percentile 0..100."""
    lines: dict[str, list[float]] = {}
    for system in ("episub", "iroh"):
        for path in sorted(SITTING.glob(f"{system}_n8_256B_paced100_run*.json")):
            run = load(path)
            assert run is not None
            quantiles = run["summary"].get("latency_quantiles_ms")
            if quantiles:
                lines[f"{system}, run {_run_number(path)}"] = quantiles
    return lines


def _run_number(path: Path) -> int:
    return int(path.stem.rsplit("_run", 1)[1])


FIGURES = {  # picture -> (title, what it shows, the command that gives its data)
    "bench_burst.png": (
        "Throughput, one publisher",
        "Throughput of one publisher publishing back to back, on loopback: messages per "
        "second each receiver gets (top) and the CPU all nodes spend per delivered message "
        "(bottom), today against the same run before the fast path.",
        "benchmarks/loopback.py --system episub --nodes 8 --size 256 --messages 20000",
    ),
    "bench_latency_cdf.png": (
        "Latency at a steady rate, episub and iroh-gossip",
        "Publish-to-delivery latency at a steady 100 messages a second to 8 nodes, 256 B: "
        "the share of deliveries (y) that took at most x ms, episub against iroh-gossip, two "
        "runs each.",
        "benchmarks/loopback.py --system episub|iroh --nodes 8 --size 256 --messages 1000 "
        "--rate 100",
    ),
    "bench_config.png": (
        "Live configuration, episub and Redis pub/sub",
        "Live configuration, one writer and 32 readers, an update every 20 ms: the p99 of "
        "the time until the last reader sees an update (left) and the CPU all processes "
        "spend per update (right), episub against Redis pub/sub, three interleaved runs each.",
        "benchmarks/config_broadcast.py --system episub|redis --nodes 32",
    ),
}
GROUP_COLORS = {"today": "#4c72b0", "before the fast path": "#c9c9c9",
                "episub": "#4c72b0", "redis": "#dd8452"}  # fmt: skip


def _value(v: float) -> str:
    """A bar's value as its table writes it: 12,424 or 0.023, never 1.24e+04."""
    return f"{v:,.0f}" if v >= 100 else f"{v:.3g}"


def _thousands(ax: Any, axis: str) -> None:
    """Few ticks, with thousands separators, so that tick labels never run together."""
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    target = ax.xaxis if axis == "x" else ax.yaxis
    target.set_major_locator(MaxNLocator(nbins=4))
    target.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 100 else f"{v:g}"))


def draw() -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    IMG.mkdir(parents=True, exist_ok=True)
    drawn = []
    burst = burst_bars()
    if any(burst.values()):
        fig, axes = plt.subplots(2, 1, figsize=(7, 5))
        for ax, (panel, bars) in zip(axes, burst.items(), strict=True):
            ys = list(range(len(bars)))[::-1]  # the first run on top
            ax.barh(ys, [b.value for b in bars], color=[GROUP_COLORS[b.group] for b in bars])
            ax.bar_label(ax.containers[0], fmt=_value, padding=3, fontsize=8)
            ax.set_yticks(ys, [b.label for b in bars])
            ax.set_xlabel(panel)
            ax.margins(x=0.18)
            _thousands(ax, "x")
        fig.tight_layout()
        fig.savefig(IMG / "bench_burst.png", dpi=110)
        plt.close(fig)
        drawn.append("bench_burst.png")
    paced = latency_lines()
    if paced:
        from matplotlib.ticker import FixedLocator, NullFormatter

        fig, ax = plt.subplots(figsize=(6, 3.2))
        for name, quantiles in paced.items():
            system, run = name.split(", run ")
            ax.plot(quantiles, [q / 100 for q in range(len(quantiles))], label=name,
                    color=GROUP_COLORS.get(system, "#dd8452"),
                    linestyle="-" if run == "1" else "--")  # fmt: skip
        ax.set_xscale("log")
        ticks = [0.3, 0.5, 1, 2, 5, 10, 20]
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("publish-to-delivery latency, ms (log)")
        ax.set_ylabel("fraction of deliveries")
        ax.legend(loc="lower right", fontsize=8)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(IMG / "bench_latency_cdf.png", dpi=110)
        plt.close(fig)
        drawn.append("bench_latency_cdf.png")
    config = config_bars()
    if any(config.values()):
        fig, axes = plt.subplots(1, 2, figsize=(8, 3.6))
        for ax, (panel, bars) in zip(axes, config.items(), strict=True):
            xs = list(range(len(bars)))
            ax.bar(xs, [b.value for b in bars], color=[GROUP_COLORS[b.group] for b in bars])
            ax.bar_label(ax.containers[0], fmt="{:.1f}", padding=2, fontsize=8)
            ax.set_xticks(xs, [b.label.replace(", ", "\n") for b in bars], fontsize=8)
            ax.set_ylabel(panel)
            ax.margins(y=0.15)
        fig.tight_layout()
        fig.savefig(IMG / "bench_config.png", dpi=110)
        plt.close(fig)
        drawn.append("bench_config.png")
    return drawn


def picture_lines(drawn: list[str]) -> list[str]:
    """Each picture, then its caption: what it shows and the command that gives its data."""
    lines: list[str] = []
    for name in drawn:
        title, shows, command = FIGURES[name]
        lines += [f"![{title}](img/{name})", "", f"*{shows}* Command: `{command}`.", ""]
    return lines


def main() -> None:
    drawn = draw()
    lines: list[str] = picture_lines(drawn)
    lines += [f"The JSON files named in the tables are in `{rel(SITTING)}/` unless another "
              "directory of `benchmarks/results/` is named.", ""]  # fmt: skip
    lines += ["### Throughput: one publisher, back to back (burst)", "",
              "| run | msgs/s per receiver (median) | delivery | p50 / p99 ms | "
              "CPU ms per delivered | other processes' CPU s | JSON |",
              "|---|---|---|---|---|---|---|"]  # fmt: skip
    for shape, state, path in BURST_RUNS:
        found = loopback_row(f"{shape}, {state}", path)
        if found is not None:
            lines.append(found[0])
    lines += ["", "### Latency: one publisher, 100 msgs/s, 8 nodes, 256 B", "",
              "| run | msgs/s per receiver | delivery | p50 / p99 ms | CPU ms per delivered "
              "| other processes' CPU s | JSON |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for system in ("episub", "iroh"):
        for path in sorted(SITTING.glob(f"{system}_n8_256B_paced100_run*.json")):
            found = loopback_row(f"{system}, run {_run_number(path)}", path)
            if found is not None:
                lines.append(found[0])
    config = {system: config_runs(system) for system in CONFIG_SYSTEMS}
    lines += ["", "### Live configuration: 32 readers, one update every 20 ms, runs interleaved",
              "", "| system | run | p50 ms | p99 ms | max ms | CPU ms per update | load avg "
              "before | JSON |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for run_index in range(3):
        for system, runs in config.items():
            if run_index < len(runs):
                r = runs[run_index]
                lat = r["latency"]
                lines.append(
                    f"| {system} | {run_index + 1} | {fmt(lat['p50_ms'])} | {fmt(lat['p99_ms'])} | "
                    f"{fmt(lat['max_ms'])} | {fmt(r['cpu_ms_per_update'])} | "
                    f"{r['machine']['loadavg_before_after'][0][0]:.1f} | {json_name(r['_path'])} |"
                )
    for system, runs in config.items():
        if runs:
            p99 = statistics.median(r["latency"]["p99_ms"] for r in runs)
            cpu = statistics.median(r["cpu_ms_per_update"] for r in runs)
            lines.append(f"| {system} | median | | {fmt(p99)} | | {fmt(cpu)} | | |")
    lines += profile_lines()
    idle = load(SITTING / "idle_cpu_n16.json")
    memory = load(SITTING / "retention_memory.json")
    lines += ["", "### Upkeep and memory", ""]
    if idle is not None:
        lines.append(
            f"- Idle: {idle['per_node_ms_per_s']} ms CPU per node per second (16 nodes, "
            f"busiest {idle['max_node_ms_per_s']}): `{rel(SITTING / 'idle_cpu_n16.json')}`."
        )
    if memory is not None:
        for node in memory["nodes"]:
            lines.append(
                f"- Retention, {node['role']}: RSS {node['rss_idle_mb']} -> "
                f"{node['rss_after_mb']} MB retaining {node['retained_messages']:,} messages "
                f"({node['retained_mb']} MB): {node['growth_per_retained']}x what it retains "
                f"(`{rel(SITTING / 'retention_memory.json')}`)."
            )
    load_files = (SITTING / "load_before.txt", SITTING / "load_after.txt")
    loads = [p.read_text().split("load average:")[-1].strip() for p in load_files if p.exists()]
    if loads:
        lines += ["", "Load average (1, 5, 15 min) before and after the sitting: "
                  + "; ".join(loads) + "."]  # fmt: skip
    text = DOC.read_text()
    if START not in text or END not in text:
        raise SystemExit(f"{rel(DOC)} has no {START} ... {END} section to fill")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    DOC.write_text(head + START + "\n" + "\n".join(lines) + "\n" + END + tail)
    print(f"wrote {rel(DOC)}'s figures and {len(drawn)} pictures")


if __name__ == "__main__":
    main()
