"""The course dataset: synthetic shapes generated offline, and exporters for real datasets.

Every dataset lives in torchvision's ``ImageFolder`` layout, ``root/<class>/<key>.jpg``, next to a
``manifest.json`` that lists each sample's key, path, label, size in bytes and SHA-256. Keys are
zero-padded global indices; the synthetic generator hands them out class by class, so sorted
order is also sorted by class.

The synthetic images are drawn from a random generator seeded by ``(seed, index)`` alone, so the
same seed gives the same bytes however many processes share the work.
"""

import hashlib
import io
import json
import operator
import os
import shutil
import tempfile
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw
from tqdm import tqdm

CLASSES = ("arrow", "checkerboard", "circle", "cross", "dots", "ring", "square", "star", "stripes", "triangle")
SIZES = {"small": 500, "workshop": 10_000}

FORMAT = "packdata-imagefolder"
VERSION = 1
JPEG_QUALITY = 90
SUPERSAMPLING = 3  # shapes are drawn this many times larger, then shrunk: smooth edges
IMAGES_PER_WORKER = 1_000  # below this, one process is faster than starting a pool


# --- where the data lives -------------------------------------------------------------------------


def default_size():
    """The dataset size to use when none is given: ``$PACKDATA_SIZE`` or ``"workshop"``."""
    return os.environ.get("PACKDATA_SIZE") or "workshop"


def data_dir():
    """``$PACKDATA_DATA_DIR``, else the repository's ``data/`` folder, else ``~/.cache/packdata``."""
    if os.environ.get("PACKDATA_DATA_DIR"):
        return Path(os.environ["PACKDATA_DATA_DIR"]).expanduser()
    repository_data = Path(__file__).resolve().parents[2] / "data"
    if repository_data.is_dir():
        return repository_data
    return Path.home() / ".cache" / "packdata"


def default_root(size=None):
    """The folder of the synthetic dataset of this size, e.g. ``data/synthetic-workshop``."""
    return data_dir() / f"synthetic-{default_size() if size is None else size}"


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


# --- manifests ------------------------------------------------------------------------------------


def parse_versioned_json(data, where, format_name, version):
    """Decode a JSON document that names its ``format`` and ``version``; errors name ``where`` it came from."""
    try:
        document = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{where} is not a {format_name} document: {err}") from err
    if not isinstance(document, dict) or document.get("format") != format_name:
        raise ValueError(f"{where} is not a {format_name} document (no \"format\": \"{format_name}\")")
    if document.get("version") != version:
        raise ValueError(f"{where} has {format_name} version {document.get('version')!r}; this packdata reads {version}")
    return document


def load_manifest(root):
    """Read ``root/manifest.json``; fail clearly when it is missing or not a packdata manifest."""
    path = Path(root) / "manifest.json"
    if not path.is_file():
        raise FileNotFoundError(f"no dataset at {root}: {path} is missing (run 'packdata make-data')")
    return parse_versioned_json(path.read_bytes(), path, FORMAT, VERSION)


def manifest_digest(root):
    """SHA-256 of ``manifest.json``: one string that changes whenever any sample changes."""
    load_manifest(root)
    return hashlib.sha256((Path(root) / "manifest.json").read_bytes()).hexdigest()


def verify_dataset(root):
    """Re-hash every file listed in the manifest; return how many were checked."""
    samples = load_manifest(root)["samples"]
    for sample in samples:
        path = Path(root) / sample["path"]
        if not path.is_file():
            raise FileNotFoundError(f"{path} is listed in the manifest but missing")
        if hashlib.sha256(path.read_bytes()).hexdigest() != sample["sha256"]:
            raise ValueError(f"{path} does not match the SHA-256 in the manifest: the file changed")
    return len(samples)


def _is_ours(root):
    try:
        load_manifest(root)
    except (FileNotFoundError, ValueError):
        return False
    return True


# --- writing a dataset safely ---------------------------------------------------------------------


@contextmanager
def _staging_folder(target):
    """Yield an empty sibling of ``target`` that replaces it only if the block succeeds."""
    target = Path(os.path.abspath(target))  # so that "." or "x/.." have a real name and parent
    if target.exists() and not target.is_dir():
        raise FileExistsError(f"{target} exists and is not a folder")
    if target.is_dir() and any(target.iterdir()) and not _is_ours(target):
        raise FileExistsError(
            f"{target} is not empty and holds no packdata manifest: refusing to replace it "
            "(choose another folder, or delete it yourself)"
        )
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
    except PermissionError as err:
        raise PermissionError(f"cannot write a dataset to {target}: {err.strerror}") from err
    try:
        staging.chmod(0o755)  # mkdtemp makes it private; a dataset should be readable like any folder
        yield staging
        if target.exists():
            retired = staging.with_name(staging.name + "-old")
            target.rename(retired)
            staging.rename(target)
            shutil.rmtree(retired)
        else:
            staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _write_dataset(target, classes, samples, count, progress, source, seed=None, image_size=None):
    """Write ``count`` ``(label, jpeg_bytes)`` pairs and their manifest; return the root."""
    target = Path(target)
    key_width = max(6, len(str(count - 1)))
    entries = []
    with _staging_folder(target) as staging:
        for name in classes:
            (staging / name).mkdir()
        bar = tqdm(samples, total=count, desc=target.name, unit="img", disable=not progress)
        for index, (label, jpeg) in enumerate(bar):
            key = f"{index:0{key_width}d}"
            path = f"{classes[label]}/{key}.jpg"
            (staging / path).write_bytes(jpeg)
            digest = hashlib.sha256(jpeg).hexdigest()
            entries.append({"key": key, "path": path, "label": label, "bytes": len(jpeg), "sha256": digest})
        manifest = {
            "format": FORMAT,
            "version": VERSION,
            "source": source,
            "seed": seed,
            "size": count,
            "image_size": image_size,
            "classes": list(classes),
            "samples": entries,
        }
        text = json.dumps(manifest, indent=1, sort_keys=True) + "\n"
        (staging / "manifest.json").write_text(text, encoding="utf-8")
    return target


def encode_jpeg(image):
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=JPEG_QUALITY)
    return buffer.getvalue()


# --- the synthetic shapes -------------------------------------------------------------------------
# Each shape is a list of (polygon, filled) pairs in unit coordinates (about -1..1); filled=False
# cuts a hole. The renderer stretches, rotates and places them.


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
    outline = [(-1, -0.22), (0.15, -0.22), (0.15, -0.6), (1, 0), (0.15, 0.6), (0.15, 0.22), (-1, 0.22)]
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
    return [(_disc(*(np.array(grid[i]) + jitter[i]), radius=0.2, corners=16), True) for i in sorted(kept)]


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


_SHAPES = {
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


def _coverage(parts, center, scale, angle, image_size):
    """Draw unit-coordinate polygons at ``center`` (pixels); return per-pixel coverage in 0..1."""
    rotation = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
    canvas = Image.new("L", (image_size * SUPERSAMPLING,) * 2)
    pen = ImageDraw.Draw(canvas)
    for polygon, filled in parts:
        pixels = ((polygon * scale) @ rotation.T + center) * SUPERSAMPLING
        pen.polygon([tuple(point) for point in pixels], fill=255 if filled else 0)
    small = canvas.resize((image_size, image_size), Image.Resampling.BOX)
    return np.asarray(small, dtype=np.float32)[..., None] / 255


def _contrasting_colors(rng):
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
    background, foreground = _contrasting_colors(rng)
    across = np.linspace(-0.5, 0.5, image_size, dtype=np.float32)
    direction = rng.uniform(0, 2 * np.pi)
    gradient = np.cos(direction) * across[None, :] + np.sin(direction) * across[:, None]
    image = background + gradient[..., None] * rng.uniform(-60, 60, size=3).astype(np.float32)

    for _ in range(rng.choice([0, 0, 1, 2, 3])):  # clutter: thin strokes under the shape
        stroke = [(_box(-1, -0.08, 1, 0.08), True)]
        center = rng.uniform(0, image_size, size=2)
        coverage = _coverage(stroke, center, rng.uniform(0.08, 0.2) * image_size, rng.uniform(0, np.pi), image_size)
        _paint(image, coverage, rng.integers(0, 256, size=3))

    radius = rng.uniform(0.2, 0.36) * image_size
    center = rng.uniform(radius, image_size - radius, size=2)
    scale = radius * rng.uniform(0.85, 1.15, size=2)  # a little stretch, so no two are congruent
    parts = _SHAPES[CLASSES[label]](rng)
    _paint(image, _coverage(parts, center, scale, rng.uniform(0, 2 * np.pi), image_size), foreground)

    image += rng.normal(0, rng.uniform(2, 12), size=image.shape).astype(np.float32)
    return np.clip(image, 0, 255).round().astype(np.uint8)


def _synthetic_sample(index, label, *, seed, image_size):
    """``(label, jpeg_bytes)`` of sample ``index``: a pure function of its arguments."""
    rng = np.random.default_rng([seed, index])
    return label, encode_jpeg(Image.fromarray(render_image(label, rng, image_size)))


def _balanced_labels(count):
    """Labels for ``count`` samples: class 0 first, then class 1, ...; sizes differ by at most one."""
    per_class, extra = divmod(count, len(CLASSES))
    return [label for label in range(len(CLASSES)) for _ in range(per_class + (label < extra))]


def make_dataset(root=None, size=None, seed=0, image_size=64, force=False, progress=True):
    """Generate the synthetic dataset at ``root`` (default: ``default_root(size)``); return ``root``.

    Returns at once when ``root`` already holds this exact dataset, unless ``force``.
    """
    size = default_size() if size is None else size
    root = Path(root) if root is not None else default_root(size)
    count = parse_size(size)
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    if not isinstance(image_size, int) or image_size < 16:
        raise ValueError(f"image_size must be an integer of at least 16 pixels, got {image_size!r}")

    wanted = {"source": "synthetic", "seed": seed, "size": count, "image_size": image_size, "classes": list(CLASSES)}
    if not force and _is_ours(root):
        manifest = load_manifest(root)
        if all(manifest.get(name) == value for name, value in wanted.items()):
            return root

    labels = _balanced_labels(count)
    render = partial(_synthetic_sample, seed=seed, image_size=image_size)
    workers = min(os.cpu_count() or 1, count // IMAGES_PER_WORKER)
    if workers <= 1:
        samples = map(render, range(count), labels)
        return _write_dataset(root, CLASSES, samples, count, progress, "synthetic", seed, image_size)
    with ProcessPoolExecutor(workers) as pool:
        samples = pool.map(render, range(count), labels, chunksize=100)
        return _write_dataset(root, CLASSES, samples, count, progress, "synthetic", seed, image_size)


# --- exporting other datasets ---------------------------------------------------------------------


def _folder_names(classes):
    """Class names as folder names whose sorted order is label order (as ``ImageFolder`` expects)."""
    names = [str(name) for name in classes]
    for name in names:
        if name in ("", ".", "..") or "/" in name or os.sep in name:
            raise ValueError(f"class name {name!r} cannot be a folder name")
    if names == sorted(set(names)):
        return names
    width = len(str(len(names) - 1))
    return [f"{label:0{width}d}-{name}" for label, name in enumerate(names)]


def _jpeg_bytes(path):
    """The file's bytes if it is a JPEG already, else the image re-encoded as one."""
    data = path.read_bytes()
    try:
        with Image.open(io.BytesIO(data)) as image:
            return data if image.format == "JPEG" else encode_jpeg(image.convert("RGB"))
    except OSError as err:  # unidentified or truncated
        raise ValueError(f"{path} is not an image that PIL can read: {err}") from err


def export_image_folder(source, target, progress=True):
    """Copy an ``ImageFolder``-style tree (``source/<class>/<image>``) into the course layout."""
    source = Path(source)
    if not source.is_dir():
        raise FileNotFoundError(f"no folder at {source}")
    readable = {extension for extension, kind in Image.registered_extensions().items() if kind in Image.OPEN}
    classes = sorted(entry.name for entry in source.iterdir() if entry.is_dir())
    files = [
        (label, path)
        for label, name in enumerate(classes)
        for path in sorted((source / name).rglob("*"))
        if path.suffix.lower() in readable and path.is_file()
    ]
    if not files:
        raise ValueError(f"{source} has no images in class folders (expected {source}/<class>/<image>)")
    samples = ((label, _jpeg_bytes(path)) for label, path in files)
    return _write_dataset(target, classes, samples, len(files), progress, "image-folder")


def as_pil(image, index):
    """A PIL image or a uint8 CHW tensor/array as an RGB PIL image."""
    if isinstance(image, Image.Image):
        return image.convert("RGB")
    array = np.asarray(image)
    if array.dtype != np.uint8 or array.ndim != 3 or array.shape[0] not in (1, 3):
        raise ValueError(
            f"sample {index}: expected a PIL image or a uint8 CHW tensor, "
            f"got {type(image).__name__} of shape {array.shape} and dtype {array.dtype}"
        )
    return Image.fromarray(np.repeat(array, 3 // array.shape[0], axis=0).transpose(1, 2, 0))


def export_torchvision(dataset, target, classes=None, progress=True):
    """Write a map-style dataset of ``(image, label)`` pairs into the course layout; key = index.

    Class names come from ``classes``, else ``dataset.classes``, else ``dataset.num_classes``.
    """
    if classes is None:
        classes = getattr(dataset, "classes", None)
    if classes is None and hasattr(dataset, "num_classes"):
        width = len(str(dataset.num_classes - 1))
        classes = [f"{label:0{width}d}" for label in range(dataset.num_classes)]
    if classes is None:
        raise ValueError(f"{type(dataset).__name__} has no .classes or .num_classes: pass classes=[...]")
    folders = _folder_names(classes)

    def samples():
        for index in range(len(dataset)):
            image, given = dataset[index]
            try:
                label = operator.index(given)  # int, numpy int or a one-element integer tensor
            except TypeError:
                label = -1
            if not 0 <= label < len(folders):
                raise ValueError(f"sample {index} has label {given!r}; expected an int in 0..{len(folders) - 1}")
            yield label, encode_jpeg(as_pil(image, index))

    source = f"torchvision:{type(dataset).__name__}"
    return _write_dataset(target, folders, samples(), len(dataset), progress, source)


# --- looking at it --------------------------------------------------------------------------------


def show_samples(root, per_class=8, ax_size=1.0):
    """A grid of the first ``per_class`` images of every class, one row per class; returns the figure."""
    import matplotlib.pyplot as plt

    manifest = load_manifest(root)
    rows = {label: [] for label in range(len(manifest["classes"]))}
    for sample in manifest["samples"]:
        if len(rows[sample["label"]]) < per_class:
            rows[sample["label"]].append(sample)
    fig, axes = plt.subplots(len(rows), per_class, figsize=(per_class * ax_size, len(rows) * ax_size), squeeze=False)
    for label, samples in rows.items():
        for column, ax in enumerate(axes[label]):
            if column < len(samples):
                ax.imshow(Image.open(Path(root) / samples[column]["path"]))
            ax.set_xticks([])
            ax.set_yticks([])
        axes[label][0].set_ylabel(manifest["classes"][label], rotation=0, ha="right", va="center")
    fig.subplots_adjust(wspace=0.05, hspace=0.05)
    return fig
