"""The course's synthetic dataset: ten classes of shapes, generated offline and deterministically.

The images are drawn from a random generator seeded by ``(seed, index)`` alone, so the same seed
gives the same bytes however many processes share the work. Keys are handed out class by class, so
sorted order is also sorted by class.

    root = make_dataset(size="small")      # data/synthetic-small: 500 JPEGs and their manifest
"""

import os
from functools import partial
from pathlib import Path
from typing import NamedTuple

import numpy as np
from PIL import Image, ImageDraw

from .imagefolder import data_dir, is_dataset, load_manifest, write_dataset
from .images import encode_jpeg
from .perprocess import map_in_processes
from .system import usable_cores

CLASSES = (
    "arrow",
    "checkerboard",
    "circle",
    "cross",
    "dots",
    "ring",
    "square",
    "star",
    "stripes",
    "triangle",
)
SIZES = {"small": 500, "workshop": 10_000}
SUPERSAMPLING = 3  # shapes are drawn this many times larger, then shrunk: smooth edges
IMAGES_PER_WORKER = 1_000  # below this, one process is faster than starting a pool


def default_size():
    """The dataset size to use when none is given: ``$PACKDATA_SIZE`` or ``"workshop"``."""
    return os.environ.get("PACKDATA_SIZE") or "workshop"


def parse_size(size):
    """Turn ``"small"``, ``"workshop"``, ``"1234"`` or ``1234`` into a number of images."""
    if isinstance(size, str) and size in SIZES:
        return SIZES[size]
    if isinstance(size, str) and size.isdigit():
        size = int(size)
    if not isinstance(size, int) or isinstance(size, bool) or size < len(CLASSES):
        raise ValueError(
            f"unknown dataset size {size!r}: use {' or '.join(map(repr, SIZES))} "
            f"or a whole number of images, at least {len(CLASSES)} (one per class)"
        )
    return size


def _disc(x=0.0, y=0.0, radius=1.0, corners=40):
    angles = np.linspace(0, 2 * np.pi, corners, endpoint=False)
    return np.stack([x + radius * np.cos(angles), y + radius * np.sin(angles)], axis=1)


def _box(x0, y0, x1, y1):
    return np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]])


def _regular(corners, radius=1.0, inner_radius=None):
    """A regular polygon, or a star when ``inner_radius`` alternates with ``radius``."""
    radii = [radius] if inner_radius is None else [radius, inner_radius]
    points = corners * len(radii)
    angles = np.linspace(0, 2 * np.pi, points, endpoint=False) - np.pi / 2
    lengths = np.resize(radii, points)
    return np.stack([lengths * np.cos(angles), lengths * np.sin(angles)], axis=1)


def _arrow(rng):
    outline = [
        (-1, -0.22),
        (0.15, -0.22),
        (0.15, -0.6),
        (1, 0),
        (0.15, 0.6),
        (0.15, 0.22),
        (-1, 0.22),
    ]
    return [(np.array(outline, dtype=float), True)]


def _checkerboard(rng):
    edges = np.linspace(-0.9, 0.9, 5)
    return [
        (_box(edges[i], edges[j], edges[i + 1], edges[j + 1]), True)
        for i in range(4)
        for j in range(4)
        if (i + j) % 2 == 0
    ]


def _circle(rng):
    return [(_disc(radius=0.9), True)]


def _cross(rng):
    return [(_box(-1, -0.25, 1, 0.25), True), (_box(-0.25, -1, 0.25, 1), True)]


def _dots(rng):
    grid = [(x, y) for x in (-0.65, 0, 0.65) for y in (-0.65, 0, 0.65)]
    kept = rng.permutation(len(grid))[: rng.integers(6, 10)]
    jitter = rng.uniform(-0.08, 0.08, size=(len(grid), 2))
    return [
        (_disc(*(np.array(grid[i]) + jitter[i]), radius=0.2, corners=16), True)
        for i in sorted(kept)
    ]


def _ring(rng):
    return [(_disc(radius=1.0), True), (_disc(radius=rng.uniform(0.5, 0.65)), False)]


def _square(rng):
    return [(_box(-0.75, -0.75, 0.75, 0.75), True)]


def _star(rng):
    return [(_regular(5, radius=1.0, inner_radius=0.42), True)]


def _stripes(rng):
    return [(_box(-0.9, y, 0.9, y + 0.24), True) for y in (-0.9, -0.42, 0.06, 0.54)]


def _triangle(rng):
    return [(_regular(3, radius=1.0), True)]


SHAPES = {
    "arrow": _arrow,
    "checkerboard": _checkerboard,
    "circle": _circle,
    "cross": _cross,
    "dots": _dots,
    "ring": _ring,
    "square": _square,
    "star": _star,
    "stripes": _stripes,
    "triangle": _triangle,
}


def coverage(parts, center, scale, angle, size):
    """Draw unit-coordinate polygons at ``center`` (pixels) on a ``(width, height)`` canvas; return
    per-pixel coverage in 0..1, as a (height, width, 1) array."""
    rotation = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
    canvas = Image.new("L", (size[0] * SUPERSAMPLING, size[1] * SUPERSAMPLING))
    pen = ImageDraw.Draw(canvas)
    for polygon, filled in parts:
        pixels = ((polygon * scale) @ rotation.T + center) * SUPERSAMPLING
        pen.polygon([tuple(point) for point in pixels], fill=255 if filled else 0)
    small = canvas.resize(size, Image.Resampling.BOX)
    return np.asarray(small, dtype=np.float32)[..., None] / 255


def contrasting_colors(rng):
    """A background and a foreground colour whose brightness differs clearly."""
    luma = np.array([0.299, 0.587, 0.114])
    while True:
        background, foreground = rng.integers(0, 256, size=(2, 3))
        if abs(luma @ (foreground - background)) > 70:
            return background.astype(np.float32), foreground.astype(np.float32)


def _paint(image, coverage, color):
    image *= 1 - coverage
    image += coverage * color


def render_image(label, rng, image_size=64):
    """One synthetic ``image_size``² RGB image (uint8 HWC array) of class ``CLASSES[label]``."""
    square = (image_size, image_size)
    background, foreground = contrasting_colors(rng)
    across = np.linspace(-0.5, 0.5, image_size, dtype=np.float32)
    direction = rng.uniform(0, 2 * np.pi)
    gradient = np.cos(direction) * across[None, :] + np.sin(direction) * across[:, None]
    image = background + gradient[..., None] * rng.uniform(-60, 60, size=3).astype(np.float32)

    for _ in range(rng.choice([0, 0, 1, 2, 3])):  # clutter: thin strokes under the shape
        stroke = [(_box(-1, -0.08, 1, 0.08), True)]
        center = rng.uniform(0, image_size, size=2)
        length = rng.uniform(0.08, 0.2) * image_size
        covered = coverage(stroke, center, length, rng.uniform(0, np.pi), square)
        _paint(image, covered, rng.integers(0, 256, size=3))

    radius = rng.uniform(0.2, 0.36) * image_size
    center = rng.uniform(radius, image_size - radius, size=2)
    scale = radius * rng.uniform(0.85, 1.15, size=2)  # a little stretch, so no two are congruent
    parts = SHAPES[CLASSES[label]](rng)
    _paint(image, coverage(parts, center, scale, rng.uniform(0, 2 * np.pi), square), foreground)

    image += rng.normal(0, rng.uniform(2, 12), size=image.shape).astype(np.float32)
    return np.clip(image, 0, 255).round().astype(np.uint8)


def rendered(item, *, render, seed):
    """``(label, jpeg_bytes)`` of ``item``, an ``(index, label)`` pair, drawn by ``render(label,
    rng)``: a pure function of its arguments."""
    index, label = item
    rng = np.random.default_rng([seed, index])
    return label, encode_jpeg(Image.fromarray(render(label, rng)))


def _balanced_labels(count):
    """Labels for ``count`` samples: class 0 first, then class 1, ...; sizes differ by at most
    one."""
    per_class, extra = divmod(count, len(CLASSES))
    return [label for label in range(len(CLASSES)) for _ in range(per_class + (label < extra))]


def make_dataset(root=None, size=None, seed=0, image_size=64, force=False, progress=True):
    """Generate the synthetic dataset at ``root`` (default: ``default_root(size)``); return
    ``root``.

    Returns at once when ``root`` already holds this exact dataset, unless ``force``.
    """
    size = default_size() if size is None else size
    if not isinstance(image_size, int) or image_size < 16:
        raise ValueError(f"image_size must be an integer of at least 16 pixels, got {image_size!r}")
    render = partial(render_image, image_size=image_size)
    root = Path(root) if root is not None else default_root(size)
    kind = Generated("synthetic", render, IMAGES_PER_WORKER, image_size)
    return generate(kind, root, parse_size(size), seed, force, progress)


class Generated(NamedTuple):
    """A kind of generated dataset: its manifest ``source``, how to draw one image, how many images
    make a process pool worth starting, and the image size it records (None: sizes vary)."""

    source: str
    render: object  # render(label, rng) -> uint8 HWC array
    per_worker: int
    image_size: int | None


def generate(kind, root, count, seed, force=False, progress=True):
    """Draw ``count`` images of ``kind`` into ``root`` (processes share the work when there are
    enough); return at once when ``root`` already holds this exact dataset, unless ``force``."""
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    wanted = {
        "source": kind.source,
        "seed": seed,
        "size": count,
        "image_size": kind.image_size,
        "classes": list(CLASSES),
    }
    if not force and is_dataset(root):
        manifest = load_manifest(root)
        if all(manifest.get(name) == value for name, value in wanted.items()):
            return root
    draw = partial(rendered, render=kind.render, seed=seed)
    workers = min(usable_cores(), count // kind.per_worker)
    chunks = max(1, kind.per_worker // 10)
    samples = map_in_processes(draw, enumerate(_balanced_labels(count)), workers, chunksize=chunks)
    return write_dataset(
        root, CLASSES, samples, count, progress, kind.source, seed, kind.image_size
    )


def default_root(size=None):
    """The folder of the synthetic dataset of this size, e.g. ``data/synthetic-workshop``."""
    return data_dir() / f"synthetic-{default_size() if size is None else size}"
