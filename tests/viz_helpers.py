"""Reading a drawn overlay back: count the node discs in a PNG.

Every node is drawn as one filled disc of episub.viz.overlay.NODE_COLOR, a colour nothing
else in the picture uses, on a grid so that no two discs touch. The discs are the
4-connected blobs of pixels of exactly that colour; specks of a few pixels (none are
expected) are not counted as nodes, so a stray pixel cannot pass for one.
"""

from __future__ import annotations

from collections import deque
from pathlib import Path

MIN_BLOB_PIXELS = 12  # a disc at MAX_DRAWN_NODES is still ~30 pixels


def blob_sizes(png: str | Path, color: str) -> list[int]:
    import numpy as np
    from PIL import Image

    with Image.open(png) as image:
        assert image.format == "PNG", image.format
        pixels = np.asarray(image.convert("RGB"))
    rgb = tuple(int(color[i : i + 2], 16) for i in (1, 3, 5))
    mask = np.all(pixels == np.array(rgb, dtype=pixels.dtype), axis=2)
    height, width = mask.shape
    seen = np.zeros_like(mask)
    sizes = []
    for y0, x0 in zip(*np.nonzero(mask), strict=True):
        if seen[y0, x0]:
            continue
        seen[y0, x0] = True
        queue = deque([(y0, x0)])
        size = 0
        while queue:
            y, x = queue.popleft()
            size += 1
            for ny, nx in ((y - 1, x), (y + 1, x), (y, x - 1), (y, x + 1)):
                if 0 <= ny < height and 0 <= nx < width and mask[ny, nx] and not seen[ny, nx]:
                    seen[ny, nx] = True
                    queue.append((ny, nx))
        sizes.append(size)
    return sizes


def count_nodes(png: str | Path, color: str) -> int:
    return sum(1 for size in blob_sizes(png, color) if size >= MIN_BLOB_PIXELS)
