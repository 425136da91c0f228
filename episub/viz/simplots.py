"""`episub sim ... --draw FILE.png` and `--plot DIR`: pictures of a simulation run.

`--plot DIR` writes, for every scenario (docs/simulation.md shows them):

- `rmr_ldh.png`: RMR and LDH of each counted message, by message number;
- `latency_cdf.png`: the CDF of publish-to-delivery latency over every counted delivery
  (the proximity scenario draws its two runs, proximity on and off, on one axis);
- `view_sizes.png`: histograms of the live nodes' active and passive view sizes;

and for the crash scenario also `reliability_vs_crash.png`: the same run repeated at
`CRASH_FRACTIONS` of crashed nodes (same seed and size), with two curves: the share of
survivors the first probe reached within the probe deadline (published the instant of the
crash, before any repair) and the reliability of the counted messages (after the heal).
"""

from __future__ import annotations

import dataclasses
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from episub.sim.params import SimParams
from episub.viz import require
from episub.viz.overlay import Overlay, OverlayLink, OverlayNode, draw_overlay

__all__ = ["CRASH_FRACTIONS", "draw_run", "write_plots"]

CRASH_FRACTIONS = (0.1, 0.3, 0.5, 0.7, 0.9)  # the Plumtree paper plots 10%..90%


def overlay_from(data: dict[str, Any]) -> Overlay:
    return Overlay(
        nodes=[OverlayNode(**n) for n in data["nodes"]],
        links=[OverlayLink(**link) for link in data["links"]],
    )


def draw_run(data: dict[str, Any], path: str | Path, publisher: int | None) -> Path:
    """Draw a run's overlay (series.overlay_of's dict) with `publisher`'s eager tree."""
    chosen = data["publisher"] if publisher is None else str(publisher)
    positions = data.get("positions")
    if positions is not None:
        positions = {key: (float(x), float(y)) for key, (x, y) in positions.items()}
    draw_overlay(overlay_from(data), path, publisher=chosen, positions=positions)
    return Path(path)


def _pyplot() -> Any:
    require("viz", "matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_plots(
    report: dict[str, Any],
    extras: dict[str, dict[str, Any]],
    params: SimParams,
    directory: str | Path,
    *,
    jobs: int = 1,
) -> list[Path]:
    """Write the run's plots into `directory`; returns their paths."""
    plt = _pyplot()
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    runs = {
        ("proximity " + k.split("_")[1]) if k else report["scenario"]: v["series"]
        for k, v in extras.items()
    }
    title = f"{report['scenario']}, {report['nodes']} nodes, seed {report['seed']}"
    written = [
        _rmr_ldh(plt, runs, out / "rmr_ldh.png", title),
        _latency_cdf(plt, runs, out / "latency_cdf.png", title),
        _view_sizes(plt, runs, out / "view_sizes.png", title),
    ]
    if report["scenario"] == "crash":
        written.append(_crash_sweep(plt, params, out / "reliability_vs_crash.png", jobs))
    return written


def _save(plt: Any, fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _rmr_ldh(plt: Any, runs: dict[str, Any], path: Path, title: str) -> Path:
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 5.5), sharex=True)
    for name, series in runs.items():
        rows = series["per_message"]
        top.plot(
            [r["index"] for r in rows],
            [r["rmr"] for r in rows],
            marker=".",
            label=name,
        )
        bottom.plot([r["index"] for r in rows], [r["ldh"] for r in rows], marker=".", label=name)
    top.set_ylabel("RMR")
    bottom.set_ylabel("LDH (hops)")
    bottom.set_xlabel("counted message number")
    top.set_title(f"Relative message redundancy and last delivery hop ({title})", fontsize=10)
    top.legend(fontsize=8)
    top.grid(alpha=0.3)
    bottom.grid(alpha=0.3)
    return _save(plt, fig, path)


def _latency_cdf(plt: Any, runs: dict[str, Any], path: Path, title: str) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, series in runs.items():
        values = sorted(series["latencies_ms"])
        if values:
            n = len(values)
            ax.step(values, [(i + 1) / n for i in range(n)], where="post", label=name)
    ax.set_xlabel("publish-to-delivery latency (ms)")
    ax.set_ylabel("share of deliveries")
    ax.set_ylim(0, 1.01)
    ax.set_title(f"Delivery latency CDF ({title})", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _save(plt, fig, path)


def _view_sizes(plt: Any, runs: dict[str, Any], path: Path, title: str) -> Path:
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 4))
    for name, series in runs.items():
        for ax, key in ((left, "active_sizes"), (right, "passive_sizes")):
            sizes = series[key]
            if sizes:
                bins = range(min(sizes), max(sizes) + 2)
                ax.hist(sizes, bins=bins, alpha=0.6, label=name, align="left")
    left.set_xlabel("active view size")
    right.set_xlabel("passive view size")
    left.set_ylabel("live nodes")
    left.legend(fontsize=8)
    fig.suptitle(f"View sizes at the end ({title})", fontsize=10)
    return _save(plt, fig, path)


def _crash_point(params: SimParams, fraction: float) -> tuple[float, float | None, float]:
    from episub.sim.scenarios import run

    report = run(dataclasses.replace(params, fraction=fraction), timing=False, extras=True)
    probes = report["series"]["probes"]
    first = probes[0]["reached"] if probes else 0.0
    return fraction, report["reliability"], first


def _crash_sweep(plt: Any, params: SimParams, path: Path, jobs: int) -> Path:
    if jobs > 1:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futures = [pool.submit(_crash_point, params, f) for f in CRASH_FRACTIONS]
            points = [future.result() for future in futures]
    else:
        points = [_crash_point(params, f) for f in CRASH_FRACTIONS]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    xs = [100 * f for f, _, _ in points]
    ax.plot(xs, [first for _, _, first in points], marker="o", label="first probe, at the crash")
    ax.plot(
        xs,
        [rel if rel is not None else float("nan") for _, rel, _ in points],
        marker="s",
        label="counted messages, after the heal",
    )
    ax.set_xlabel("nodes crashed at once (%)")
    ax.set_ylabel("share of survivors reached")
    ax.set_ylim(0, 1.05)
    ax.set_title(
        f"Reliability against crash fraction ({params.nodes} nodes, seed {params.seed})",
        fontsize=10,
    )
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _save(plt, fig, path)
