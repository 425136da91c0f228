"""The pictures at the top of docs/benchmarks.md draw what the results JSON holds: one bar
per run, each with a label of its own, and the page shows every picture with a caption."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
_SPEC = importlib.util.spec_from_file_location("figures", ROOT / "benchmarks" / "figures.py")
assert _SPEC is not None and _SPEC.loader is not None
figures = importlib.util.module_from_spec(_SPEC)
sys.modules["figures"] = figures  # dataclasses look their module up there
_SPEC.loader.exec_module(figures)


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


def test_the_burst_picture_has_one_bar_per_run_with_its_own_label():
    runs = sorted(
        p for p in [*RESULTS.glob("sitting/episub_*_burst*.json"), *RESULTS.glob("before/*_burst*")]
    )
    assert len(runs) == 4  # two shapes, today and before the fast path
    panels = figures.burst_bars()
    assert list(panels) == list(figures.BURST_PANELS)
    for panel, bars in panels.items():
        assert sorted(b.source for b in bars) == sorted(runs), panel
        labels = [b.label for b in bars]
        assert len(set(labels)) == len(labels) == 4, labels
    rates = {b.source: b.value for b in panels[figures.BURST_PANELS[0]]}
    for path in runs:
        assert rates[path] == _json(path)["summary"]["msgs_per_s_per_receiver_median"]


def test_the_configuration_picture_has_one_bar_per_run_with_its_own_label():
    runs = sorted(RESULTS.glob("sitting/config_*_n32_run*.json"))
    assert len(runs) == 6  # three interleaved runs of each system
    panels = figures.config_bars()
    for panel, bars in panels.items():
        assert sorted(b.source for b in bars) == runs, panel
        labels = [b.label for b in bars]
        assert len(set(labels)) == len(labels), labels
    p99 = {b.source: b.value for b in panels[figures.CONFIG_PANELS[0]]}
    assert p99 == {path: _json(path)["latency"]["p99_ms"] for path in runs}
    assert {b.label for b in panels[figures.CONFIG_PANELS[0]]} == {
        f"{system}, run {n}" for system in ("episub", "redis") for n in (1, 2, 3)
    }


def test_the_latency_picture_has_one_line_per_paced_run():
    runs = sorted(RESULTS.glob("sitting/*_n8_256B_paced100_run*.json"))
    lines = figures.latency_lines()
    assert len(lines) == len(runs) == 4
    assert (
        lines["episub, run 1"]
        == _json(RESULTS / "sitting/episub_n8_256B_paced100_run1.json")["summary"][
            "latency_quantiles_ms"
        ]
    )


def test_every_picture_is_on_the_page_with_its_caption_and_command():
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    for name, (title, shows, command) in figures.FIGURES.items():
        assert f"![{title}](img/{name})\n\n*{shows}* Command: `{command}`." in page
    # The pictures come before the tables.
    assert page.index("](img/bench_burst.png)") < page.index("| run |")
    assert len(re.findall(r"\]\(img/bench_\w+\.png\)", page)) == len(figures.FIGURES)
