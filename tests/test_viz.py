"""Pictures: `episub sim --draw` and `--plot` write PNGs that decode to what was simulated.

The overlay picture is checked by counting its node discs (tests/viz_helpers.py) against
the simulated node count, and its eager tree against the publisher's reach.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")
pytest.importorskip("networkx")

from episub.viz.overlay import NODE_COLOR, Overlay, OverlayLink, OverlayNode, draw_overlay
from tests.viz_helpers import count_nodes

ROOT = Path(__file__).resolve().parents[1]


def episub(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "episub.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=ROOT,
    )


def test_sim_draw_shows_one_disc_per_simulated_node_and_a_spanning_eager_tree(tmp_path):
    png = tmp_path / "overlay.png"
    done = episub("sim", "steady", "--nodes", "200", "--seed", "1", "--draw", str(png))
    assert done.returncode == 0, done.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert count_nodes(png, NODE_COLOR) == 200
    meta = json.loads(Path(f"{png}.json").read_text())
    assert meta["nodes"] == 200
    # Plumtree's eager links reach every node from the publisher: a spanning tree.
    assert len(meta["tree"]) == 199
    assert {child for _, child in meta["tree"]} == {n["key"] for n in meta["overlay"]["nodes"]} - {
        meta["publisher"]
    }


def test_drawing_keeps_nodes_apart_even_when_their_positions_coincide(tmp_path):
    nodes = [OverlayNode(key=str(i), group=f"zone {i % 3}") for i in range(50)]
    links = [OverlayLink(a=str(i), b=str((i + 1) % 50), eager=True, rtt_ms=i) for i in range(50)]
    png = tmp_path / "o.png"
    same = {str(i): (0.5, 0.5) for i in range(50)}
    meta = draw_overlay(Overlay(nodes, links), png, publisher="0", positions=same)
    assert count_nodes(png, NODE_COLOR) == 50
    assert len(meta["tree"]) == 49  # the ring's eager links from node 0


def test_counting_reads_the_picture_not_a_fixed_number(tmp_path):
    """The check can fail: a picture of 9 nodes does not pass for 10."""
    png = tmp_path / "o.png"
    draw_overlay(Overlay([OverlayNode(key=str(i)) for i in range(9)], []), png)
    assert count_nodes(png, NODE_COLOR) == 9


def test_publisher_must_be_a_node(tmp_path):
    with pytest.raises(ValueError, match="not a node"):
        draw_overlay(Overlay([OverlayNode(key="a")], []), tmp_path / "x.png", publisher="b")


def test_sim_plot_writes_every_plot_of_the_crash_scenario(tmp_path):
    done = episub(
        "sim", "crash", "--nodes", "60", "--messages", "10", "--warmup", "3", "--seed", "1",
        "--settle", "10", "--plot", str(tmp_path / "plots"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    names = sorted(p.name for p in (tmp_path / "plots").iterdir())
    assert names == [
        "latency_cdf.png",
        "reliability_vs_crash.png",
        "rmr_ldh.png",
        "view_sizes.png",
    ]
    from PIL import Image

    for name in names:
        with Image.open(tmp_path / "plots" / name) as image:
            assert image.format == "PNG" and image.size[0] >= 600


def test_a_missing_viz_extra_is_one_error_line(tmp_path):
    code = (
        "import sys; sys.modules['matplotlib'] = None\n"
        "from episub.cli import main\n"
        f"sys.exit(main(['sim', 'steady', '--nodes', '10', '--draw', r'{tmp_path}/x.png']))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "episub sim: error: matplotlib not installed: pip install 'episub[viz]'"
    ]


def test_groups_are_laid_out_in_blocks_apart_so_none_is_drawn_over_another():
    from episub.viz.overlay import layout

    nodes = [OverlayNode(key=str(i), group=f"zone {i % 3}") for i in range(150)]
    # Links across groups pull a spring layout together; the blocks must hold anyway.
    links = [OverlayLink(a=str(i), b=str((i * 7 + 1) % 150)) for i in range(150)]
    cells = layout(Overlay(nodes, links))
    assert len(set(cells.values())) == 150
    boxes = []
    for zone in range(3):
        members = [cells[str(i)] for i in range(zone, 150, 3)]
        xs, ys = [c[0] for c in members], [c[1] for c in members]
        boxes.append((min(xs), max(xs), min(ys), max(ys)))
    # Two empty rows or columns between any two groups: one holds the lower group's name.
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            apart_x = a[1] + 2 < b[0] or b[1] + 2 < a[0]
            apart_y = a[3] + 2 < b[2] or b[3] + 2 < a[2]
            assert apart_x or apart_y, (a, b)
