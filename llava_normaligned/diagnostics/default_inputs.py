"""The default inputs of ``diagnose``: a few synthetic scenes and a prompt file, shipped as package data.

The scenes are drawn in code (so they are reproducible and carry no licence question) and saved as PNG under
``llava_normaligned/assets/diagnostics/``. Regenerate them with::

    python .ci/default_images.py
"""

from __future__ import annotations

import math
import os
from importlib import resources

SIZE = 192  # pixels; every processor resizes, so the exact size only sets the file size (all six: under 10 KB)


def default_assets_dir() -> str:
    return str(resources.files("llava_normaligned") / "assets" / "diagnostics")


def default_images_dir() -> str:
    return os.path.join(default_assets_dir(), "images")


def default_prompts_file() -> str:
    return os.path.join(default_assets_dir(), "prompts.txt")


# ------------------------------------------------------------------------------------------------- the scenes


def _vertical_gradient(top: tuple, bottom: tuple):
    from PIL import Image

    image = Image.new("RGB", (SIZE, SIZE))
    for y in range(SIZE):
        t = y / (SIZE - 1)
        image.paste(tuple(round(a + (b - a) * t) for a, b in zip(top, bottom)), (0, y, SIZE, y + 1))
    return image


def _landscape(draw):
    draw.rectangle((0, 130, SIZE, SIZE), fill=(70, 150, 60))  # grass
    draw.ellipse((140, 18, 178, 56), fill=(250, 210, 40))  # sun
    draw.rectangle((40, 80, 100, 130), fill=(200, 60, 50))  # house
    draw.polygon([(34, 82), (70, 48), (106, 82)], fill=(110, 60, 40))  # roof
    draw.rectangle((62, 104, 78, 130), fill=(90, 50, 30))  # door


def _three_shapes(draw):
    draw.ellipse((20, 30, 80, 90), fill=(220, 40, 40))
    draw.rectangle((110, 40, 170, 100), fill=(40, 90, 220))
    draw.polygon([(60, 170), (95, 110), (130, 170)], fill=(40, 170, 70))


def _traffic_light(draw):
    draw.rectangle((76, 20, 116, 150), fill=(40, 40, 40))
    draw.rectangle((92, 150, 100, 190), fill=(90, 90, 90))
    for i, colour in enumerate([(230, 40, 40), (240, 200, 30), (40, 200, 70)]):
        draw.ellipse((84, 28 + 40 * i, 108, 52 + 40 * i), fill=colour)


def _sea(draw):
    draw.ellipse((70, 70, 122, 122), fill=(250, 140, 40))  # sun, its lower half then hidden by the sea
    draw.rectangle((0, 110, SIZE, SIZE), fill=(30, 90, 160))
    draw.polygon([(40, 140), (90, 140), (80, 155), (50, 155)], fill=(120, 70, 40))  # boat
    draw.line((65, 100, 65, 140), fill=(60, 40, 20), width=3)
    draw.polygon([(67, 102), (67, 136), (92, 136)], fill=(245, 245, 245))  # sail


def _grid_of_dots(draw):
    colours = [(220, 40, 40), (40, 90, 220), (40, 170, 70), (240, 200, 30)]
    for row in range(4):
        for col in range(4):
            x, y = 24 + 40 * col, 24 + 40 * row
            draw.ellipse((x, y, x + 24, y + 24), fill=colours[(row + col) % 4])


def _stripes_and_star(draw):
    for i in range(0, SIZE, 24):
        draw.rectangle((i, 0, i + 11, SIZE), fill=(235, 235, 235))
    cx, cy, r_out, r_in = 96, 96, 60, 24
    points = []
    for k in range(10):
        r = r_out if k % 2 == 0 else r_in
        angle = math.pi / 2 + k * math.pi / 5
        points.append((cx + r * math.cos(angle), cy - r * math.sin(angle)))
    draw.polygon(points, fill=(250, 190, 20), outline=(120, 80, 0))


# name -> (background top colour, bottom colour, painter)
SCENES = {
    "house": ((140, 190, 240), (220, 235, 250), _landscape),
    "three_shapes": ((250, 250, 245), (230, 230, 225), _three_shapes),
    "traffic_light": ((150, 200, 240), (200, 220, 240), _traffic_light),
    "sunset_sea": ((250, 170, 110), (250, 220, 160), _sea),
    "dots": ((255, 255, 255), (240, 240, 240), _grid_of_dots),
    "star": ((60, 60, 120), (40, 40, 90), _stripes_and_star),
}


def draw_scene(name: str):
    """One default scene as an RGB PIL image of SIZE x SIZE pixels."""
    from PIL import ImageDraw

    if name not in SCENES:
        raise ValueError(f"unknown scene {name!r}; known: {sorted(SCENES)}")
    top, bottom, paint = SCENES[name]
    image = _vertical_gradient(top, bottom)
    paint(ImageDraw.Draw(image))
    return image


def write_default_images(output_dir: str) -> list[str]:
    """Draw every scene and save it as ``<output_dir>/<name>.png``; returns the paths."""
    os.makedirs(output_dir, exist_ok=True)
    paths = []
    for name in SCENES:
        path = os.path.join(output_dir, f"{name}.png")
        draw_scene(name).save(path, optimize=True)
        paths.append(path)
    return paths
