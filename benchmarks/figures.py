"""The figures at the top of docs/benchmarks.md, drawn from the JSON of one sitting.

    .venv/bin/python benchmarks/figures.py            # after `bash benchmarks/sitting.sh`

Reads benchmarks/results/sitting/*.json (and benchmarks/results/before/ for the figures
before the fast path), draws docs/img/bench_*.png (matplotlib, the viz extra) and rewrites the
part of docs/benchmarks.md between the `figures:start` and `figures:end` markers: the
tables and the machine's load, every number taken from a JSON file named beside it.
"""

from __future__ import annotations

import json
import statistics
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
        f"{fmt(run['machine'].get('other_cpu_s'))} | `{rel(path)}` |"
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
        runs.append(run)
    return runs


def draw(burst: list[tuple[str, dict[str, Any]]], paced: dict[str, list[float]],
         config: dict[str, list[dict[str, Any]]]) -> list[str]:  # fmt: skip
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    IMG.mkdir(parents=True, exist_ok=True)
    drawn = []
    if burst:
        fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.2))
        names = [n for n, _ in burst]
        left.barh(
            names, [s["msgs_per_s_per_receiver_median"] or 0 for _, s in burst], color="#4c72b0"
        )
        left.set_xlabel("msgs/s per receiver (median)")
        right.barh(names, [1000 * (s["cpu_s_per_delivered"] or 0) for _, s in burst],
                   color="#dd8452")  # fmt: skip
        right.set_xlabel("CPU ms per delivered message")
        right.set_yticks([])
        fig.tight_layout()
        fig.savefig(IMG / "bench_burst.png", dpi=110)
        plt.close(fig)
        drawn.append("bench_burst.png")
    if paced:
        fig, ax = plt.subplots(figsize=(6, 3.2))
        for name, quantiles in paced.items():
            ax.plot(quantiles, [q / 100 for q in range(101)], label=name)
        ax.set_xscale("log")
        ax.set_xlabel("publish-to-delivery latency, ms (log)")
        ax.set_ylabel("fraction of deliveries")
        ax.legend()
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(IMG / "bench_latency_cdf.png", dpi=110)
        plt.close(fig)
        drawn.append("bench_latency_cdf.png")
    if any(config.values()):
        fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.2))
        for i, (system, runs) in enumerate(config.items()):
            xs = [j + 1 + 0.2 * i for j in range(len(runs))]
            left.bar(xs, [r["latency"]["p99_ms"] for r in runs], width=0.2, label=system)
            right.bar(xs, [r["cpu_ms_per_update"] for r in runs], width=0.2, label=system)
        left.set_ylabel("p99 ms, 32 readers")
        right.set_ylabel("CPU ms per update, all processes")
        for ax in (left, right):
            ax.set_xlabel("run")
            ax.legend()
        fig.tight_layout()
        fig.savefig(IMG / "bench_config.png", dpi=110)
        plt.close(fig)
        drawn.append("bench_config.png")
    return drawn


def main() -> None:
    lines: list[str] = []
    burst: list[tuple[str, dict[str, Any]]] = []
    lines += ["### Throughput: one publisher, back to back (burst)", "",
              "| run | msgs/s per receiver (median) | delivery | p50 / p99 ms | "
              "CPU ms per delivered | other processes' CPU s | JSON |",
              "|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, path in (
        ("episub, 8 nodes, 256 B x 20,000", SITTING / "episub_n8_256B_burst20000.json"),
        ("episub before the fast path, same", BEFORE / "episub_n8_256B_burst20000.json"),
        ("episub, 16 nodes, 4 KiB x 5,000", SITTING / "episub_n16_4KiB_burst5000.json"),
        ("episub before the fast path, same", BEFORE / "episub_n16_4KiB_burst5000.json"),
    ):
        found = loopback_row(name, path)
        if found is not None:
            lines.append(found[0])
            burst.append((name.replace("episub before the fast path, same", "before"), found[1]))
    paced_quantiles: dict[str, list[float]] = {}
    lines += ["", "### Latency: one publisher, 100 msgs/s, 8 nodes, 256 B", "",
              "| run | msgs/s per receiver | delivery | p50 / p99 ms | CPU ms per delivered "
              "| other processes' CPU s | JSON |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for system in ("episub", "iroh"):
        for path in sorted(SITTING.glob(f"{system}_n8_256B_paced100_run*.json")):
            found = loopback_row(f"{system} ({path.stem.rsplit('_', 1)[1]})", path)
            if found is None:
                continue
            lines.append(found[0])
            quantiles = found[1].get("latency_quantiles_ms")
            if quantiles and system not in paced_quantiles:
                paced_quantiles[f"{system} ({path.stem.rsplit('_', 1)[1]})"] = quantiles
    config = {system: config_runs(system) for system in ("episub", "redis")}
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
                    f"{r['machine']['loadavg_before_after'][0][0]:.1f} | `{rel(r['_path'])}` |"
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
    loads = [p.read_text().strip() for p in load_files if p.exists()]
    if loads:
        lines += ["", "Machine load (`uptime`) before and after the sitting: "
                  + "; ".join(f"`{text}`" for text in loads) + "."]  # fmt: skip
    drawn = draw(burst, paced_quantiles, config)
    if drawn:
        lines += [""] + [f"![{name}](img/{name})" for name in drawn]
    text = DOC.read_text()
    if START not in text or END not in text:
        raise SystemExit(f"{rel(DOC)} has no {START} ... {END} section to fill")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    DOC.write_text(head + START + "\n" + "\n".join(lines) + "\n" + END + tail)
    print(f"wrote {rel(DOC)}'s figures and {len(drawn)} pictures")


if __name__ == "__main__":
    main()
