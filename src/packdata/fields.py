"""A sample's fields from bytes: which member is the image, and how each other member decodes.

A webdataset sample can hold more than an image and a label: ``.json`` metadata, a ``.txt``
caption, a ``.npy`` feature. Every reader decodes them the same way:

==========================  ===============================================================
member                      decoded as
==========================  ===============================================================
the image                   a ``uint8`` CHW tensor (``images.decode_image``)
``cls``                     an int
``json``                    the object it holds
``txt``                     a str (UTF-8)
``npy`` (not the image)     the numpy array as stored, any dtype and shape
anything else               its bytes
==========================  ===============================================================

The image is the first encoded image among the sample's members (``jpg``, ``jpeg``, ``png``); a
sample without one, whose pixels were packed raw (``packing``'s ``payload="raw"``), has ``npy`` as
its image when the array holds pixels (``uint8``, height × width × 3), else as a feature.
"""

import io
import json

import numpy as np

from .images import ENCODED_IMAGES, decode_image, is_pixels, pixels_as_tensor


def image_field(extensions):
    """Which of ``extensions`` (a sample's member extensions, or the keys asked for) is its image;
    None when none is."""
    encoded = [extension for extension in extensions if extension.lower() in ENCODED_IMAGES]
    if encoded:
        return encoded[0]
    return next((extension for extension in extensions if extension.lower() == "npy"), None)


def decode_field(value, key, is_image, decoder="pil"):
    """One member's bytes as the training loop wants them (see the table above)."""
    if key == "npy":
        array = np.load(io.BytesIO(value), allow_pickle=False)
        return pixels_as_tensor(array) if is_image and is_pixels(array) else array
    if is_image:
        return decode_image(value, decoder)
    if key == "cls":
        return int(value)
    if key == "json":
        return json.loads(value)
    if key == "txt":
        return value.decode("utf-8")
    return value
