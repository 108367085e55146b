"""Images in and out of bytes: JPEG encoding, decoding with PIL or TorchCodec, raw ``.npy`` pixels.

Every reader of the course (folders, archives, shards, over HTTP or not) hands a sample's bytes to
the same ``decode_image``, so formats differ only in how the bytes arrive, never in how they decode.
Every writer stores what ``encode_payload`` makes of a source JPEG: the JPEG itself, a resized
re-encoding, or the decoded pixels (``payload="raw"``).
"""

import io

import numpy as np
from PIL import Image, ImageOps

JPEG_QUALITY = 90
DECODERS = ("pil", "torchcodec")
ENCODED_IMAGES = ("jpg", "jpeg", "png")  # extensions of encoded images, which both decoders read
IMAGE_FIELDS = (*ENCODED_IMAGES, "npy")  # extensions of members that decode to an image tensor
NPY_MAGIC = b"\x93NUMPY"
PAYLOADS = {"jpeg": ".jpg", "raw": ".npy"}
RESIZE_FILTER = Image.Resampling.BICUBIC


def check_decoder(decoder):
    """Refuse a decoder name that is not one of ``DECODERS``."""
    if decoder == "torchvision":
        raise ValueError(
            "decoder='torchvision' is retired: torchvision's image decoding is deprecated since "
            "torchvision 0.29; use decoder='torchcodec', which replaces it"
        )
    if decoder not in DECODERS:
        raise ValueError(f"unknown decoder {decoder!r}; choose one of {DECODERS}")


# --- encoding -------------------------------------------------------------------------------------


def encode_jpeg(image):
    """A PIL image as JPEG bytes, at the course's quality."""
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=JPEG_QUALITY)
    return buffer.getvalue()


ORIENTATION = 0x0112  # the EXIF tag that says how a camera held the picture
WIDE_MODES = ("I", "I;16", "I;16B", "I;16L", "I;16N")  # integer pixels wider than a byte
ALPHA_MODES = ("RGBA", "LA", "PA", "La", "RGBa")


def as_rgb(image):
    """``(an 8-bit RGB image, what had to change or None)`` for a PIL image of any mode: the EXIF
    orientation applied, 16-bit values scaled (not clipped) to 8 bits, transparency flattened onto
    white, CMYK, palette and grey converted. An RGB image that needs none of it comes back as is."""
    changes = []
    if image.getexif().get(ORIENTATION, 1) != 1:
        image, changes = ImageOps.exif_transpose(image), ["turned upright by its EXIF orientation"]
    if image.mode in WIDE_MODES:
        array = np.asarray(image, dtype=np.float64)
        image = Image.fromarray(np.round(array * 255 / 65535).clip(0, 255).astype(np.uint8))
        image = image.convert("RGB")
        changes.append("16-bit, scaled to 8 bits")
    if image.mode in ALPHA_MODES or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        image = Image.alpha_composite(Image.new("RGBA", rgba.size, "white"), rgba).convert("RGB")
        changes.append("transparency flattened onto white")
    if image.mode != "RGB":
        changes.append(f"{image.mode} converted to RGB")
        image = image.convert("RGB")
    return image, "; ".join(changes) or None


def as_pil(image, index):
    """A PIL image or a uint8 CHW tensor/array as an RGB PIL image."""
    if isinstance(image, Image.Image):
        return as_rgb(image)[0]
    array = np.asarray(image)
    if array.dtype != np.uint8 or array.ndim != 3 or array.shape[0] not in (1, 3):
        raise ValueError(
            f"sample {index}: expected a PIL image or a uint8 CHW tensor, "
            f"got {type(image).__name__} of shape {array.shape} and dtype {array.dtype}"
        )
    return Image.fromarray(np.repeat(array, 3 // array.shape[0], axis=0).transpose(1, 2, 0))


def checked_suffix(payload, resize):
    """The member suffix of ``payload``; refuses unknown payloads and sizes that are not positive
    ints."""
    if payload not in PAYLOADS:
        raise ValueError(f"unknown payload {payload!r}; choose one of {tuple(PAYLOADS)}")
    if resize is not None and (
        not isinstance(resize, int) or isinstance(resize, bool) or resize < 1
    ):
        raise ValueError(f"resize must be None or a positive number of pixels, got {resize!r}")
    return PAYLOADS[payload]


def encode_payload(jpeg, payload="jpeg", resize=None):
    """The bytes to store for one source JPEG: the JPEG itself; or, resized to
    ``resize``×``resize``, re-encoded at the dataset's JPEG quality; or (``payload="raw"``) the
    decoded ``uint8`` HWC array as ``.npy`` bytes."""
    if payload == "jpeg" and resize is None:
        return jpeg
    with Image.open(io.BytesIO(jpeg)) as image:
        image = image.convert("RGB")
    if resize is not None:
        image = image.resize((resize, resize), RESIZE_FILTER)
    if payload == "jpeg":
        return encode_jpeg(image)
    buffer = io.BytesIO()
    np.save(buffer, np.asarray(image))
    return buffer.getvalue()


def resize_short_side(jpeg, size):
    """The JPEG resized, up or down, so that its shorter side is ``size`` pixels and its aspect
    ratio is kept (the longer side as ``torchvision``'s ``Resize(size)`` computes it), re-encoded
    at the dataset's JPEG quality."""
    if size < 1:
        raise ValueError(f"size must be at least 1 pixel, got {size}")
    with Image.open(io.BytesIO(jpeg)) as image:
        image = image.convert("RGB")
    short, long = sorted(image.size)
    long = int(size * long / short)
    width, height = (size, long) if image.width <= image.height else (long, size)
    return encode_jpeg(image.resize((width, height), RESIZE_FILTER))


# --- decoding -------------------------------------------------------------------------------------


def decode_image(data, decoder="pil"):
    """Decode JPEG bytes into an RGB ``uint8`` tensor of shape (3, H, W); ``.npy`` bytes (a
    ``uint8`` HWC array saved by numpy, what ``packing`` stores for ``payload="raw"``) need no
    decoder and ignore it.

    Both turn a photo upright by its EXIF orientation, and give an animation's first frame. Both
    keep the pixels channels last in memory (PIL's tensor is a view of its array,
    ``pixels_as_tensor``; TorchCodec's comes so): no copy into channels-first order, and the resize
    of a crop reads this layout faster than that one. ``.contiguous()`` makes the copy when code
    needs it. TorchCodec replaces ``torchvision.io``'s decoders (deprecated in torchvision 0.29)."""
    check_decoder(decoder)
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(
            f"decode_image takes an image file's bytes, not a {type(data).__name__}: read them "
            "first (Path.read_bytes(), ZipFile.read(name))"
        )
    if data[: len(NPY_MAGIC)] == NPY_MAGIC:
        return decode_array(data)
    if decoder == "pil":
        with Image.open(io.BytesIO(data)) as image:
            upright = upright_image(image)
            rgb = upright if upright.mode == "RGB" else upright.convert("RGB")
            return pixels_as_tensor(np.array(rgb))
    # on first use: importing it slows every worker's start
    from torchcodec.decoders import decode_image as decode

    image = decode(bytes(data), mode="RGB")
    return image[0] if image.ndim == 4 else image  # an animation's first frame, as PIL gives


def upright_image(image):
    """A PIL ``image`` turned upright by its EXIF orientation, as TorchCodec decodes it. The EXIF
    is parsed only when the file has one: parsing costs about 17 µs, every decode would pay it."""
    if "exif" in image.info and image.getexif().get(ORIENTATION, 1) != 1:
        return ImageOps.exif_transpose(image)
    return image


def is_pixels(array):
    """True for an array that holds an RGB image as ``payload="raw"`` stores it: ``uint8`` HWC."""
    return array.dtype == np.uint8 and array.ndim == 3 and array.shape[2] == 3


def pixels_as_tensor(array):
    """A ``uint8`` (H, W, 3) array as a (3, H, W) tensor: a view of the array, its channels
    still last in memory."""
    import torch  # on first use: a pool that only encodes starts without it (about 1.5 s each)

    return torch.from_numpy(array).permute(2, 0, 1)


def decode_array(data):
    """A ``uint8`` (H, W, 3) array in ``.npy`` bytes as a (3, H, W) tensor."""
    array = np.load(io.BytesIO(data), allow_pickle=False)
    if not is_pixels(array):
        raise ValueError(
            f"expected a uint8 array of shape (H, W, 3), got {array.dtype} of shape {array.shape}"
        )
    return pixels_as_tensor(array)
