"""ImageNet-sized synthetic photos: the same ten shapes on natural-looking texture, a few hundred
pixels a side, about 100 KB as JPEG.

The shapes dataset (``synthetic``) is tiny on purpose: 64×64 pixels and about 2 KB a file, so that
per-request and per-sample costs stand out. Where bytes and decode time are the point (worker
sweeps, decode scaling, shard sizes, staging), those tiny files mislead: per-sample overheads swamp
everything. These photos have ImageNet's statistics where they matter for loading: sides of 300 to
500 pixels in mixed aspect ratios, and texture with a natural image's 1/f spectrum, which is what
makes a JPEG of it weigh about as much as a photo's and take as long to decode.

Each image is a pure function of ``(seed, index)``, like the shapes.
"""

from pathlib import Path

import numpy as np

from .imagefolder import data_dir
from .synthetic import (
    CLASSES,
    SHAPES,
    Generated,
    contrasting_colors,
    coverage,
    default_size,
    generate,
)

SIZES = {"small": 100, "workshop": 1_000}  # about 10 MB and 100 MB of JPEG
PHOTOS_PER_WORKER = 40  # each takes tens of milliseconds: a pool pays off early
SIDES = (300, 500)  # each side drawn uniformly in this range: aspect ratios from 0.6 to 1.67
SPECTRUM_EXPONENT = 0.7  # amplitude ∝ 1 / frequency ** this; natural images are near 1


def pink_noise(rng, height, width, channels, exponent=SPECTRUM_EXPONENT):
    """``channels`` fields of noise whose amplitude falls as 1/f^exponent, each of unit standard
    deviation, as a (height, width, channels) float32 array."""
    fy = np.fft.fftfreq(height)[:, None]
    fx = np.fft.rfftfreq(width)[None, :]
    frequency = np.hypot(fx, fy)
    frequency[0, 0] = np.inf  # no constant term: the caller sets the mean
    shape = (channels, height, fx.shape[1])
    spectrum = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)) * frequency**-exponent
    fields = np.fft.irfft2(spectrum, s=(height, width), axes=(1, 2))
    fields /= fields.std(axis=(1, 2), keepdims=True)
    return fields.transpose(1, 2, 0).astype(np.float32)


def texture(noise, rng, color):
    """A textured surface of mean ``color`` from four noise fields: light, and three of tint."""
    light = noise[..., :1] * rng.uniform(25, 45)
    tint = noise[..., 1:] * rng.uniform(6, 16)
    return color + light + tint


def render_photo(label, rng):
    """One RGB photo (uint8 HWC array) of class ``CLASSES[label]``: its shape, in one texture, on a
    background of another."""
    parts = SHAPES[CLASSES[label]](rng)
    width, height = (int(side) for side in rng.integers(SIDES[0], SIDES[1] + 1, size=2))
    noise = pink_noise(rng, height, width, 4)
    back, front = contrasting_colors(rng)  # the shape stands out, as an object in a photo does
    background = texture(noise, rng, back)
    shift = rng.integers(height // 4, height // 2), rng.integers(width // 4, width // 2)
    foreground = texture(np.roll(noise, shift, axis=(0, 1)), rng, front)  # no second FFT
    radius = rng.uniform(0.25, 0.4) * min(width, height)
    center = np.array([rng.uniform(radius, width - radius), rng.uniform(radius, height - radius)])
    scale = radius * rng.uniform(0.85, 1.15, size=2)
    covered = coverage(parts, center, scale, rng.uniform(0, 2 * np.pi), (width, height))
    image = background * (1 - covered) + foreground * covered
    return np.clip(image, 0, 255).round().astype(np.uint8)


def make_photos(root=None, size=None, seed=0, force=False, progress=True):
    """Generate the photos at ``root`` (default: ``data/photos-SIZE``, SIZE as for the shapes:
    ``$PACKDATA_SIZE`` or ``"workshop"``); return ``root``. ``size`` is ``"small"`` (100),
    ``"workshop"`` (1,000) or a number of photos. Returns at once when they are there already."""
    size = default_size() if size is None else size
    count = SIZES.get(size) or int(size)
    root = Path(root) if root is not None else data_dir() / f"photos-{size}"
    kind = Generated("synthetic-photos", render_photo, PHOTOS_PER_WORKER, None)
    return generate(kind, root, count, seed, force, progress)
