"""One picture of an overlay: its active links coloured by RTT, one publisher's eager tree
highlighted, zones (or executors) labelled.

The picture is made to be checked, not only looked at: every node is one filled disc of
`NODE_COLOR`, a colour nothing else in the picture uses, and nodes sit on the cells of a
grid (the layout is snapped to it), so no two discs touch. Counting the connected blobs
of that colour in the PNG gives the number of nodes drawn (tests/test_viz.py does). Links,
the tree and labels are drawn beneath the discs, so none of them cuts a disc in two.

Input is an `Overlay`: what a simulation holds, or what `Node.crawl` gathered from a live
deployment. Each node lists its own active view, so a link appears once per end that
reports it; the eager tree of a publisher is the breadth-first tree over eager links
from it (Plumtree pushes payloads along exactly these).
"""

from __future__ import annotations

import json
import math
from collections import deque
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from episub.viz import require

__all__ = [
    "MAX_DRAWN_NODES",
    "NODE_COLOR",
    "Overlay",
    "OverlayLink",
    "OverlayNode",
    "draw_overlay",
    "eager_tree",
]

NODE_COLOR = "#ff00ff"  # pure magenta: not in the RTT colour map, the tree's red or text
TREE_COLOR = "#d62728"
RTT_COLORMAP = "viridis"  # purple-blue-green-yellow: never magenta
MAX_DRAWN_NODES = 2000  # guess: past this the discs get a few pixels wide at FIGURE_INCHES
FIGURE_INCHES = 10.0
DPI = 120
LABEL_ALL_NODES_UP_TO = 300  # guess: more node labels than this are only ink


@dataclass(frozen=True, slots=True)
class OverlayNode:
    key: str  # unique: a simulated node's number, a live node's peer id
    label: str = ""  # what to write beside the disc (an address, an executor)
    group: str | None = None  # a zone or executor name; groups are laid out apart


@dataclass(frozen=True, slots=True)
class OverlayLink:
    """`a` has `b` in its active view."""

    a: str
    b: str
    kind: str = "rand"  # "rand" or "near"
    eager: bool = False  # a pushes payloads to b
    rtt_ms: float | None = None


@dataclass(slots=True)
class Overlay:
    nodes: list[OverlayNode] = field(default_factory=list)
    links: list[OverlayLink] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "nodes": [asdict(n) for n in self.nodes],
            "links": [asdict(link) for link in self.links],
        }


def eager_tree(overlay: Overlay, publisher: str) -> list[tuple[str, str]]:
    """(parent, child) pairs of the breadth-first tree over eager links from `publisher`."""
    eager: dict[str, list[str]] = {}
    for link in overlay.links:
        if link.eager:
            eager.setdefault(link.a, []).append(link.b)
    seen = {publisher}
    queue = deque([publisher])
    tree = []
    while queue:
        node = queue.popleft()
        for child in sorted(eager.get(node, ())):
            if child not in seen:
                seen.add(child)
                tree.append((node, child))
                queue.append(child)
    return tree


# -- layout --------------------------------------------------------------------------------


def _spring(keys: list[str], edges: Iterable[tuple[str, str]], seed: int) -> dict[str, Any]:
    import networkx as nx

    graph = nx.Graph()
    graph.add_nodes_from(keys)
    graph.add_edges_from((a, b) for a, b in edges if a in graph and b in graph)
    if len(keys) == 1:
        return {keys[0]: (0.0, 0.0)}
    return nx.spring_layout(graph, seed=seed, iterations=60)


def layout(
    overlay: Overlay, positions: dict[str, tuple[float, float]] | None = None, seed: int = 0
) -> dict[str, tuple[int, int]]:
    """Grid cells (column, row) for every node, none shared.

    `positions` (say, a latency model's coordinates) are used when given; otherwise a
    spring layout of the links, and nodes of several groups get a block of the grid per
    group, blocks apart, so that no group is drawn over another. Nodes are snapped, one by
    one, to the free cell nearest their position."""
    keys = [n.key for n in overlay.nodes]
    groups: dict[str | None, list[str]] = {}
    for node in overlay.nodes:
        groups.setdefault(node.group, []).append(node.key)
    if positions is None and len(groups) > 1:
        return _group_blocks(overlay, groups, seed)
    if positions is None:
        edges = [(link.a, link.b) for link in overlay.links]
        positions = {k: (float(x), float(y)) for k, (x, y) in _spring(keys, edges, seed).items()}
    return _snap(keys, positions, _side(len(keys)), (0, 0))


def _side(count: int) -> int:
    """Side of a square grid with room to spare for `count` nodes."""
    return max(2, math.ceil(math.sqrt(count * 1.6)))


GROUP_GAP_CELLS = 2  # empty cells between two groups' blocks: one row holds the group's name


def _group_blocks(
    overlay: Overlay, groups: dict[str | None, list[str]], seed: int
) -> dict[str, tuple[int, int]]:
    """One square block per group, in reading order on a grid of blocks (two groups side by
    side, three or four in two rows...), each laid out by a spring layout of its own links."""
    ordered = sorted(groups.items(), key=lambda g: str(g[0]))
    block = max(_side(len(keys)) for _, keys in ordered)
    columns = math.ceil(math.sqrt(len(ordered)))
    rows = math.ceil(len(ordered) / columns)
    pitch = block + GROUP_GAP_CELLS
    edges = [(link.a, link.b) for link in overlay.links]
    cells: dict[str, tuple[int, int]] = {}
    for i, (_, keys) in enumerate(ordered):
        members = set(keys)
        inner = _spring(keys, [(a, b) for a, b in edges if a in members and b in members], seed)
        # The first group on the top row: matplotlib's y grows upwards.
        origin = ((i % columns) * pitch, (rows - 1 - i // columns) * pitch)
        positions = {k: (float(x), float(y)) for k, (x, y) in inner.items()}
        cells.update(_snap(keys, positions, block, origin))
    return cells


def _snap(
    keys: list[str],
    positions: dict[str, tuple[float, float]],
    side: int,
    origin: tuple[int, int],
) -> dict[str, tuple[int, int]]:
    """`positions` scaled onto a `side` x `side` block of cells at `origin`, one node a cell."""
    xs = [positions[k][0] for k in keys]
    ys = [positions[k][1] for k in keys]
    x0, y0 = min(xs), min(ys)
    span = max(max(xs) - x0, max(ys) - y0) or 1.0
    taken: dict[tuple[int, int], str] = {}
    cells = {}
    for key in keys:
        x, y = positions[key]
        want = (
            min(side - 1, int((x - x0) / span * (side - 1) + 0.5)),
            min(side - 1, int((y - y0) / span * (side - 1) + 0.5)),
        )
        cell = _nearest_free(want, taken, side)
        taken[cell] = key
        cells[key] = (origin[0] + cell[0], origin[1] + cell[1])
    return cells


def _nearest_free(
    want: tuple[int, int], taken: dict[tuple[int, int], str], side: int
) -> tuple[int, int]:
    """The free cell nearest `want` (by rings of growing radius; the grid has room)."""
    if want not in taken:
        return want
    wx, wy = want
    for radius in range(1, 2 * side):
        best = None
        for dx in range(-radius, radius + 1):
            for dy in (-radius, radius) if abs(dx) != radius else range(-radius, radius + 1):
                cell = (wx + dx, wy + dy)
                if 0 <= cell[0] < side and 0 <= cell[1] < side and cell not in taken:
                    d = dx * dx + dy * dy
                    if best is None or d < best[0]:
                        best = (d, cell)
        if best is not None:
            return best[1]
    raise AssertionError("the grid has more cells than nodes")


# -- drawing -------------------------------------------------------------------------------


def draw_overlay(
    overlay: Overlay,
    path: str | Path,
    *,
    publisher: str | None = None,
    title: str = "",
    positions: dict[str, tuple[float, float]] | None = None,
) -> dict[str, Any]:
    """Draw `overlay` as a PNG at `path`; write the drawn graph as JSON beside it
    (`<path>.json`), and return that: nodes, links, the tree's edges, the publisher."""
    require("viz", "matplotlib", "networkx")
    count = len(overlay.nodes)
    if not 1 <= count <= MAX_DRAWN_NODES:
        raise ValueError(f"can draw 1..{MAX_DRAWN_NODES} nodes, not {count}")
    keys = {n.key for n in overlay.nodes}
    if publisher is not None and publisher not in keys:
        raise ValueError(f"publisher {publisher!r} is not a node of the overlay")

    import matplotlib

    matplotlib.use("Agg")  # files only; no display needed
    import matplotlib.pyplot as plt
    from matplotlib.collections import LineCollection
    from matplotlib.colors import Normalize

    cells = layout(overlay, positions)
    side = max(2, 1 + max(max(c) for c in cells.values()))
    links = [link for link in overlay.links if link.a in keys and link.b in keys]
    # One line per unordered pair; its RTT is the mean of what the ends reported.
    pairs: dict[tuple[str, str], list[float]] = {}
    for link in links:
        pair = (min(link.a, link.b), max(link.a, link.b))
        rtts = pairs.setdefault(pair, [])
        if link.rtt_ms is not None:
            rtts.append(link.rtt_ms)
    tree = eager_tree(overlay, publisher) if publisher is not None else []

    fig = plt.figure(figsize=(FIGURE_INCHES, FIGURE_INCHES), dpi=DPI)
    ax = fig.add_axes((0.03, 0.03, 0.82, 0.9))
    ax.set_xlim(-1, side)
    ax.set_ylim(-1, side + 0.6)  # room for group names above the top row
    ax.set_aspect("equal")
    ax.axis("off")

    def xy(key: str) -> tuple[float, float]:
        return cells[key]

    segments = [(xy(a), xy(b)) for a, b in pairs]
    rtt_values = [sum(r) / len(r) if r else math.nan for r in pairs.values()]
    known = [v for v in rtt_values if not math.isnan(v)]
    norm = Normalize(vmin=min(known, default=0.0), vmax=max(known, default=1.0) or 1.0)
    cmap = matplotlib.colormaps[RTT_COLORMAP]
    colors = [(0.75, 0.75, 0.75, 1.0) if math.isnan(v) else cmap(norm(v)) for v in rtt_values]
    ax.add_collection(LineCollection(segments, colors=colors, linewidths=0.6, zorder=1))
    if tree:
        tree_segments = [(xy(a), xy(b)) for a, b in tree]
        ax.add_collection(
            LineCollection(tree_segments, colors=TREE_COLOR, linewidths=2.2, zorder=2)
        )

    # Disc diameter: 45% of a grid cell, in points (scatter sizes are points squared).
    cell_points = ax.get_window_extent().width / (side + 1) * 72.0 / DPI
    diameter = 0.45 * cell_points
    if publisher is not None:
        px, py = xy(publisher)
        ax.scatter([px], [py], s=(diameter * 1.9) ** 2, c="black", zorder=3, linewidths=0)
    _labels(ax, overlay, cells, diameter)
    xs = [cells[n.key][0] for n in overlay.nodes]
    ys = [cells[n.key][1] for n in overlay.nodes]
    ax.scatter(xs, ys, s=diameter**2, c=NODE_COLOR, linewidths=0, zorder=5, antialiased=True)

    mappable = plt.cm.ScalarMappable(norm=norm, cmap=cmap)
    bar_ax = fig.add_axes((0.88, 0.1, 0.025, 0.75))
    fig.colorbar(mappable, cax=bar_ax, label="link RTT (ms)")
    head = title or f"{count} nodes, {len(pairs)} active links"
    if publisher is not None:
        head += f"; eager tree of {_short(overlay, publisher)} in red ({len(tree)} edges)"
    fig.suptitle(head, fontsize=10)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)

    meta = {
        "nodes": count,
        "links": len(pairs),
        "publisher": publisher,
        "tree": [list(edge) for edge in tree],
        "node_color": NODE_COLOR,
        "overlay": overlay.to_json(),
    }
    Path(f"{path}.json").write_text(json.dumps(meta, sort_keys=True))
    return meta


def _short(overlay: Overlay, key: str) -> str:
    for node in overlay.nodes:
        if node.key == key:
            return node.label or key
    return key


def _labels(ax: Any, overlay: Overlay, cells: dict[str, tuple[int, int]], diameter: float) -> None:
    """Group names at their members' centre, or each node's label when there are few;
    beneath the discs (zorder) so that text never splits one."""
    groups: dict[str, list[tuple[int, int]]] = {}
    for node in overlay.nodes:
        if node.group is not None:
            groups.setdefault(node.group, []).append(cells[node.key])
    for name, members in groups.items():
        # Above the group's topmost disc, where its members' discs cannot hide it.
        cx = sum(c[0] for c in members) / len(members)
        cy = max(c[1] for c in members) + 0.9
        ax.text(
            cx,
            cy,
            name,
            fontsize=14,
            fontweight="bold",
            color="#444444",
            ha="center",
            va="center",
            zorder=4,
        )
    if len(overlay.nodes) > LABEL_ALL_NODES_UP_TO:
        return
    size = max(4.0, min(9.0, diameter * 0.6))
    for node in overlay.nodes:
        x, y = cells[node.key]
        ax.text(
            x,
            y - 0.42,
            node.label or node.key,
            fontsize=size,
            ha="center",
            va="top",
            color="#222222",
            zorder=4,
        )
