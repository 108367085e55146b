"""Where samples come from when something writes them: one source per kind of input.

A source is a picklable callable over sample indices: ``source(i)`` gives ``(key, label, payload
bytes)``, and ``len(source)`` the number of samples. Packing, shard writing and exporting all read
through one, so an input is read, checked and encoded the same way whatever it is written into; and
a process pool can call the same source in every worker (``perprocess.map_in_processes``).

    FolderSamples("data/synthetic-small")          # a dataset folder with a manifest, in key order
    DatasetSamples(torchvision_dataset)            # any map-style dataset of (image, label)
"""

import operator
from pathlib import Path

from .imagefolder import load_manifest
from .images import as_pil, encode_jpeg, encode_payload


class FolderSamples:
    """Sample ``i`` of a dataset folder (its manifest, in key order) as ``(key, label,
    payload)``."""

    def __init__(self, root, payload="jpeg", resize=None):
        self.root, self.payload, self.resize = Path(root), payload, resize
        self.manifest = load_manifest(root)
        self.samples = sorted(self.manifest["samples"], key=operator.itemgetter("key"))

    def __len__(self):
        return len(self.samples)

    def __call__(self, index):
        sample = self.samples[index]
        path = self.root / sample["path"]
        try:
            payload = encode_payload(path.read_bytes(), self.payload, self.resize)
        except OSError as error:  # unreadable, or an image PIL cannot decode
            raise ValueError(f"sample {sample['key']!r} ({path}): {error}") from error
        return sample["key"], sample["label"], payload


class DatasetSamples:
    """Sample ``i`` of a map-style dataset of ``(image, label)`` as ``(zero-padded index, label,
    payload)``.

    A label must be an integer (a Python or numpy int, or a one-element integer tensor), and below
    ``num_classes`` when that is given; anything else raises ``ValueError`` naming the sample."""

    def __init__(self, dataset, payload="jpeg", resize=None, num_classes=None):
        self.dataset, self.payload, self.resize = dataset, payload, resize
        self.num_classes = num_classes
        self.width = max(6, len(str(len(dataset) - 1)))

    def __len__(self):
        return len(self.dataset)

    def __call__(self, index):
        image, given = self.dataset[index]
        label = self.checked_label(index, given)
        jpeg = encode_jpeg(as_pil(image, index))
        return f"{index:0{self.width}d}", label, encode_payload(jpeg, self.payload, self.resize)

    def checked_label(self, index, given):
        """``given`` as an int, or ``ValueError`` naming sample ``index``."""
        try:
            label = operator.index(given)
        except TypeError:
            label = None
        if self.num_classes is None and label is None:
            raise ValueError(f"sample {index} has label {given!r}; expected an int")
        if self.num_classes is not None and (label is None or not 0 <= label < self.num_classes):
            raise ValueError(
                f"sample {index} has label {given!r}; expected an int in 0..{self.num_classes - 1}"
            )
        return label


def sample_source(source, payload="jpeg", resize=None):
    """The source for ``source``: a dataset folder (a path) or a map-style dataset of ``(image,
    label)``."""
    kind = FolderSamples if isinstance(source, (str, Path)) else DatasetSamples
    return kind(source, payload, resize)
