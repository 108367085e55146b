"""Bring your own images: export an ``ImageFolder`` tree or a torchvision dataset into the course
layout.

    export_image_folder("~/photos", "data/photos")           # photos/<class>/<image>, any format
    export_torchvision(CIFAR10(root, download=False), "data/cifar10")

The result is a dataset folder like the synthetic one (``imagefolder``): JPEGs under class folders
and a manifest with every sample's SHA-256, so every lesson and tool of the course reads it.
"""

import io
import os
import warnings
from collections import Counter
from pathlib import Path

from PIL import Image

from .imagefolder import write_dataset
from .images import ORIENTATION, as_rgb, encode_jpeg
from .samples import DatasetSamples


def _folder_names(classes):
    """Class names as folder names whose sorted order is label order (as ``ImageFolder``
    expects)."""
    names = [str(name) for name in classes]
    for name in names:
        if name in ("", ".", "..") or "/" in name or os.sep in name:
            raise ValueError(f"class name {name!r} cannot be a folder name")
    if names == sorted(set(names)):
        return names
    width = len(str(len(names) - 1))
    return [f"{label:0{width}d}-{name}" for label, name in enumerate(names)]


def _jpeg_bytes(path, changes):
    """The file's bytes if it is a JPEG that every decoder reads as it looks (RGB or grey, upright),
    else the image made RGB (``images.as_rgb``) and encoded as a JPEG; what changed is counted in
    ``changes``. Every image is decoded whole once, so a truncated one fails here, named, and not
    in a training job."""
    data = path.read_bytes()
    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
            upright = image.getexif().get(ORIENTATION, 1) == 1
            if image.format == "JPEG" and image.mode in ("RGB", "L") and upright:
                return data
            rgb, change = as_rgb(image)
            changes[change or f"{image.format} re-encoded as JPEG"] += 1
            return encode_jpeg(rgb)
    except Image.DecompressionBombError as err:
        raise ValueError(
            f"{path}: {err} (PIL refuses images this large; raise PIL.Image.MAX_IMAGE_PIXELS "
            "first if it is one)"
        ) from err
    except (OSError, ValueError, SyntaxError) as err:  # unidentified, truncated, broken chunks
        raise ValueError(f"{path} is not an image that PIL can read: {err}") from err


def report_left_out(source, others):
    """Say, in one warning, which files of ``source`` were no images (by their extension)."""
    if others:
        names = ", ".join(str(path.relative_to(source)) for path in others[:5])
        more = f" and {len(others) - 5} more" if len(others) > 5 else ""
        warnings.warn(
            f"exporting {source}: left out {len(others)} file(s) that are no images PIL reads: "
            f"{names}{more}",
            stacklevel=3,
        )


def report_changes(source, changes):
    """Say, in one warning, what had to change in which share of the images of ``source``."""
    if changes:
        said = ", ".join(f"{count} {change}" for change, count in changes.most_common())
        warnings.warn(f"exporting {source}: {said}", stacklevel=3)


def export_image_folder(source, target, progress=True):
    """Copy an ``ImageFolder``-style tree (``source/<class>/<image>``) into the course layout."""
    source, target = Path(source).expanduser(), Path(target).expanduser()
    if not source.is_dir():
        raise FileNotFoundError(f"no folder at {source}")
    if target.resolve().is_relative_to(source.resolve()):
        raise ValueError(
            f"{target} is inside {source}: the next export would read it as a class of images; "
            "export into a folder outside it"
        )
    if source.resolve().is_relative_to(target.resolve()):
        raise ValueError(
            f"{source} is inside {target}, which the export replaces as a whole: the images "
            "would go with it; export into a folder outside it"
        )
    readable = {
        extension for extension, kind in Image.registered_extensions().items() if kind in Image.OPEN
    }
    classes = sorted(entry.name for entry in source.iterdir() if entry.is_dir())
    found = [
        (label, path)
        for label, name in enumerate(classes)
        for path in sorted((source / name).rglob("*"))
        if path.is_file()
    ]
    files = [(label, path) for label, path in found if path.suffix.lower() in readable]
    others = [path for _, path in found if path.suffix.lower() not in readable]
    if not files:
        raise ValueError(
            f"{source} has no images in class folders (expected {source}/<class>/<image>)"
        )
    changes = Counter()
    samples = ((label, _jpeg_bytes(path, changes)) for label, path in files)
    root = write_dataset(target, classes, samples, len(files), progress, "image-folder")
    report_left_out(source, others)
    report_changes(source, changes)
    return root


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
        raise ValueError(
            f"{type(dataset).__name__} has no .classes or .num_classes: pass classes=[...]"
        )
    folders = _folder_names(classes)

    samples = DatasetSamples(dataset, num_classes=len(folders))
    pairs = (samples(index)[1:] for index in range(len(samples)))
    source = f"torchvision:{type(dataset).__name__}"
    return write_dataset(target, folders, pairs, len(samples), progress, source)
