"""The course's dataset folder: torchvision's ``ImageFolder`` layout with a manifest.

Every dataset lives in ``root/<class>/<key>.jpg``, next to a ``manifest.json`` that lists each
sample's key, path, label, size in bytes and SHA-256. Keys are zero-padded global indices.
``write_dataset`` writes one (atomically: a failed run leaves the old folder as it was); the
synthetic generator (``synthetic``) and the exporters (``export``) both call it.
"""

import hashlib
import json
import os
from pathlib import Path

from PIL import Image
from tqdm import tqdm

from .atomic import replaced_folder
from .images import ENCODED_IMAGES

FORMAT = "packdata-imagefolder"
VERSION = 1


# --- where the data lives -------------------------------------------------------------------------


def data_dir():
    """``$PACKDATA_DATA_DIR``, else the repository's ``data/`` folder where this user may write to
    it, else ``~/.cache/packdata``: a course installed once for all the users of a hub (in a
    root-owned ``/srv/course``, say) leaves each learner a data folder of their own."""
    if os.environ.get("PACKDATA_DATA_DIR"):
        return Path(os.environ["PACKDATA_DATA_DIR"]).expanduser()
    repository_data = Path(__file__).resolve().parents[2] / "data"
    if repository_data.is_dir() and may_write(repository_data):
        return repository_data
    return Path.home() / ".cache" / "packdata"


def may_write(folder):
    """Whether this process may create files in ``folder``."""
    return os.access(folder, os.W_OK | os.X_OK)


# --- manifests ------------------------------------------------------------------------------------


def parse_versioned_json(data, where, format_name, version):
    """Decode a JSON document that names its ``format`` and ``version``; errors name ``where`` it
    came from."""
    try:
        document = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{where} is not a {format_name} document: {err}") from err
    if not isinstance(document, dict) or document.get("format") != format_name:
        raise ValueError(f'{where} is not a {format_name} document (no "format": "{format_name}")')
    if document.get("version") != version:
        raise ValueError(
            f"{where} has {format_name} version {document.get('version')!r}; this packdata reads "
            f"{version}"
        )
    return document


def load_manifest(root):
    """Read ``root/manifest.json``; fail clearly when it is missing or not a packdata manifest."""
    path = Path(root) / "manifest.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"no dataset at {root}: {path} is missing (for a folder of your own images, "
            f"<class>/<image>, run 'packdata export FOLDER {root}' first; for the course's data, "
            "'packdata make-data')"
        )
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


def is_dataset(root):
    """True when ``root`` holds a packdata manifest."""
    try:
        load_manifest(root)
    except (FileNotFoundError, ValueError):
        return False
    return True


# --- writing a dataset safely ---------------------------------------------------------------------


def write_dataset(target, classes, samples, count, progress, source, seed=None, image_size=None):
    """Write ``count`` ``(label, jpeg_bytes)`` pairs and their manifest into ``target``; return it.
    A folder that is not empty and holds no packdata manifest is refused: it is not ours to replace.
    """
    target = Path(target)
    if target.is_dir() and any(target.iterdir()) and not is_dataset(target):
        raise FileExistsError(
            f"{target} is not empty and holds no packdata manifest: refusing to replace it "
            "(choose another folder, or delete it yourself)"
        )
    key_width = max(6, len(str(count - 1)))
    entries = []
    with replaced_folder(target) as staging:
        for name in classes:
            (staging / name).mkdir()
        bar = tqdm(samples, total=count, desc=target.name, unit="img", disable=not progress)
        for index, (label, jpeg) in enumerate(bar):
            key = f"{index:0{key_width}d}"
            path = f"{classes[label]}/{key}.jpg"
            (staging / path).write_bytes(jpeg)
            digest = hashlib.sha256(jpeg).hexdigest()
            entries.append(
                {"key": key, "path": path, "label": label, "bytes": len(jpeg), "sha256": digest}
            )
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


# --- looking at it --------------------------------------------------------------------------------


def show_folder(root, per_class=8, ax_size=1.0):
    """A grid of the first ``per_class`` images of every class, one row per class; returns the
    figure."""
    import matplotlib.pyplot as plt

    manifest = load_manifest(root)
    rows = {label: [] for label in range(len(manifest["classes"]))}
    for sample in manifest["samples"]:
        if len(rows[sample["label"]]) < per_class:
            rows[sample["label"]].append(sample)
    fig, axes = plt.subplots(
        len(rows), per_class, figsize=(per_class * ax_size, len(rows) * ax_size), squeeze=False
    )
    for label, samples in rows.items():
        for column, ax in enumerate(axes[label]):
            if column < len(samples):
                ax.imshow(Image.open(Path(root) / samples[column]["path"]))
            ax.set_xticks([])
            ax.set_yticks([])
        axes[label][0].set_ylabel(manifest["classes"][label], rotation=0, ha="right", va="center")
    fig.subplots_adjust(wspace=0.05, hspace=0.05)
    return fig


def samples_from_manifest(manifest):
    """``(classes, rows)`` in manifest order, each row ``(relative path, label, bytes)``."""
    rows = [(sample["path"], sample["label"], sample["bytes"]) for sample in manifest["samples"]]
    return list(manifest["classes"]), rows


def samples_from_folders(root):
    """``(classes, rows)`` the way torchvision's ImageFolder sees ``root``: sorted class folders,
    sorted files."""
    root = Path(root)
    classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
    rows = [
        (f"{name}/{path.name}", label, path.stat().st_size)
        for label, name in enumerate(classes)
        for path in sorted((root / name).iterdir())
        if path.suffix.lower()[1:] in ENCODED_IMAGES
    ]
    return classes, rows
