"""Contact sheets: look at what was generated (scene | instance mask | object list)."""

from __future__ import annotations

import textwrap
from itertools import islice

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from bench.core.dataset import Dataset

#: Distinct colours for instance ids (tab20), background black.
_ID_COLOURS = np.array(
    [(0, 0, 0)] + [
        (31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189), (140, 86, 75),
        (227, 119, 194), (127, 127, 127), (188, 189, 34), (23, 190, 207), (174, 199, 232), (255, 187, 120),
        (152, 223, 138), (255, 152, 150), (197, 176, 213), (196, 156, 148), (247, 182, 210), (199, 199, 199),
        (219, 219, 141), (158, 218, 229),
    ],
    dtype=np.uint8,
)


def colourize_mask(mask: np.ndarray) -> np.ndarray:
    """RGB picture of an instance-id mask (ids cycle through 20 colours)."""
    ids = mask.astype(np.int64)
    return np.where(ids[..., None] == 0, _ID_COLOURS[0], _ID_COLOURS[1 + (ids - 1) % 20])


def contact_sheet(ds: Dataset, split: str, n: int, cols: int = 4, tile: int = 192) -> Image.Image:
    """A grid of scenes; each cell shows the image, its mask and a caption of its objects."""
    scenes = list(islice(ds.iter_scenes(split), n))
    font = ImageFont.load_default(size=10)
    caption_h = 80
    cell_w, cell_h = 2 * tile + 8, tile + caption_h + 8
    rows = -(-len(scenes) // cols)
    sheet = Image.new("RGB", (cols * cell_w, max(rows, 1) * cell_h), "white")
    draw = ImageDraw.Draw(sheet)
    for k, scene in enumerate(scenes):
        x, y = (k % cols) * cell_w, (k // cols) * cell_h
        img = Image.fromarray(scene["image"][..., :3]).resize((tile, tile), Image.NEAREST)
        msk = Image.fromarray(colourize_mask(scene["mask"])).resize((tile, tile), Image.NEAREST)
        sheet.paste(img, (x, y))
        sheet.paste(msk, (x + tile + 4, y))
        objs = ", ".join(f"{o['id']}:{' '.join(o['attributes'])}" for o in scene["objects"])
        text = f"{scene['scene_id']} ({len(scene['objects'])} objects) " + objs
        lines = textwrap.wrap(text, width=cell_w // 6)[:7]
        draw.multiline_text((x + 2, y + tile + 2), "\n".join(lines), fill="black", font=font, spacing=1)
    return sheet
