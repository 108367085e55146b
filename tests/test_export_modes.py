"""Bring-your-own images in every mode Pillow opens come out as the picture a viewer shows: upright,
8-bit RGB, 16-bit values scaled rather than clipped, transparency on white; and the export says
what it changed."""

import io
import zlib

import numpy as np
import pytest
from PIL import Image

from packdata.export import export_image_folder
from packdata.imagefolder import load_manifest
from packdata.images import as_rgb, decode_image


def save(image, path, **options):
    image.save(path, **options)
    return path


@pytest.fixture
def odd_images(tmp_path):
    """One image per awkward mode, in class folders."""
    folder = tmp_path / "photos" / "things"
    folder.mkdir(parents=True)
    ramp = np.linspace(0, 65535, 64 * 16).reshape(16, 64).astype(np.uint16)
    save(Image.fromarray(ramp), folder / "a_16bit.png")
    save(Image.new("CMYK", (8, 8), (0, 255, 255, 0)), folder / "b_cmyk.jpg")  # red, in CMYK
    palette = Image.new("P", (8, 8), 1)
    palette.putpalette([0, 0, 0, 255, 0, 0] + [0] * 762)
    save(palette, folder / "c_palette.png", transparency=1)  # every pixel transparent
    save(Image.new("LA", (8, 8), (0, 0)), folder / "d_grey_alpha.png")  # black, fully transparent
    exif = Image.Exif()
    exif[0x0112] = 6  # the camera was turned: the picture is stored sideways
    save(Image.new("RGB", (40, 20), "blue"), folder / "e_rotated.jpg", exif=exif)
    save(Image.new("RGB", (8, 8), "green"), folder / "f_plain.jpg")
    return tmp_path / "photos"


def test_every_mode_is_exported_as_it_looks(odd_images, tmp_path):
    with pytest.warns(UserWarning, match=r"exporting .*photos: .*16-bit, scaled to 8 bits") as said:
        root = export_image_folder(odd_images, tmp_path / "out", progress=False)
    message = str(said[0].message)
    for change in ("turned upright", "transparency flattened onto white", "CMYK converted"):
        assert change in message
    images = {
        sample["path"].split("/")[-1]: decode_image((root / sample["path"]).read_bytes())
        for sample in load_manifest(root)["samples"]
    }
    ramp = images["000000.jpg"][0].float()
    assert ramp[0, 0] < 4 and ramp[-1, -1] > 250 and ramp.mean() == pytest.approx(128, abs=6)
    assert images["000001.jpg"][:, 4, 4].tolist()[0] > 200  # red stays red
    assert images["000002.jpg"].float().mean() > 250  # transparent: white
    assert images["000003.jpg"].float().mean() > 250
    assert images["000004.jpg"].shape[1:] == (40, 20)  # upright: taller than wide
    assert images["000005.jpg"].shape[1:] == (8, 8)


def test_a_plain_jpeg_is_copied_bit_for_bit(tmp_path):
    folder = tmp_path / "src" / "c"
    folder.mkdir(parents=True)
    original = save(Image.new("RGB", (8, 8), "green"), folder / "x.jpg").read_bytes()
    root = export_image_folder(tmp_path / "src", tmp_path / "out", progress=False)
    assert (root / load_manifest(root)["samples"][0]["path"]).read_bytes() == original


def test_as_rgb_leaves_an_rgb_image_alone():
    image = Image.new("RGB", (4, 4), "red")
    converted, change = as_rgb(image)
    assert change is None and converted.tobytes() == image.tobytes()
    assert as_rgb(Image.open(io.BytesIO(_png16())))[1] == "16-bit, scaled to 8 bits"


def _png16():
    buffer = io.BytesIO()
    Image.fromarray(np.full((2, 2), 40000, np.uint16)).save(buffer, format="PNG")
    return buffer.getvalue()


def test_a_truncated_jpeg_is_named_when_exported_not_when_trained_on(tmp_path):
    folder = tmp_path / "src" / "c"
    folder.mkdir(parents=True)
    whole = save(Image.effect_noise((64, 64), 60).convert("RGB"), folder / "a.jpg", quality=95)
    (folder / "b.jpg").write_bytes(whole.read_bytes()[:-400])  # opens, fails to decode
    with pytest.raises(ValueError, match=r"b\.jpg is not an image that PIL can read: .*truncated"):
        export_image_folder(tmp_path / "src", tmp_path / "out", progress=False)


def test_files_that_are_no_images_are_left_out_with_a_warning(tmp_path):
    folder = tmp_path / "src" / "c"
    folder.mkdir(parents=True)
    save(Image.new("RGB", (8, 8), "green"), folder / "x.jpg")
    (folder / "Thumbs.db").write_bytes(b"\0" * 16)
    (folder / "notes.txt").write_text("taken in May")
    with pytest.warns(UserWarning, match=r"left out 2 file\(s\) .*c/Thumbs\.db, c/notes\.txt"):
        root = export_image_folder(tmp_path / "src", tmp_path / "out", progress=False)
    assert len(load_manifest(root)["samples"]) == 1


def test_a_folder_without_a_manifest_points_to_export(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"run 'packdata export FOLDER .*' first"):
        load_manifest(tmp_path)


def test_an_export_into_its_own_source_is_refused(tmp_path):
    (tmp_path / "photos" / "cat").mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(tmp_path / "photos" / "cat" / "0.jpg")
    with pytest.raises(ValueError, match="course is inside .*photos: the next export would read"):
        export_image_folder(tmp_path / "photos", tmp_path / "photos" / "course", progress=False)


def test_an_export_over_the_folder_that_holds_its_source_is_refused(tmp_path):
    (tmp_path / "course" / "raw" / "cat").mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(tmp_path / "course" / "raw" / "cat" / "0.jpg")
    with pytest.raises(ValueError, match="raw is inside .*course, which the export replaces"):
        export_image_folder(tmp_path / "course" / "raw", tmp_path / "course", progress=False)
    assert (tmp_path / "course" / "raw" / "cat" / "0.jpg").exists()


def test_a_source_in_the_home_folder_may_be_named_with_a_tilde(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "photos" / "cat").mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(tmp_path / "photos" / "cat" / "0.jpg")
    root = export_image_folder("~/photos", "~/course", progress=False)
    assert root == tmp_path / "course" and len(load_manifest(root)["samples"]) == 1


def png_bytes(changes=(), cut=None):
    """A small PNG with bytes changed at ``(offset, value)`` in ``changes``, cut at ``cut``."""
    out = io.BytesIO()
    Image.new("RGB", (40, 30), "teal").save(out, format="PNG")
    data = bytearray(out.getvalue())
    for offset, value in changes:
        data[offset] = value
    return bytes(data[:cut])


def png_chunk(kind, data):
    return len(data).to_bytes(4) + kind + data + zlib.crc32(kind + data).to_bytes(4)


def png_header(width, height):
    """A PNG that claims ``width`` × ``height`` pixels and holds none."""
    shape = width.to_bytes(4) + height.to_bytes(4) + bytes([8, 2, 0, 0, 0])
    chunks = png_chunk(b"IHDR", shape) + png_chunk(b"IDAT", zlib.compress(b""))
    return b"\x89PNG\r\n\x1a\n" + chunks + png_chunk(b"IEND", b"")


@pytest.mark.parametrize(
    "data, said",
    [
        (png_bytes([(49, 76), (79, 229), (36, 10)]), "broken PNG"),  # PIL's SyntaxError
        (png_bytes([(58, 225), (52, 211), (11, 4), (27, 158)], cut=74), "Truncated IHDR"),
        (png_header(20_000, 20_000), "PIL refuses images this large"),  # its bomb guard
    ],
    ids=["syntax-error", "value-error", "decompression-bomb"],
)
def test_an_image_pil_refuses_in_any_way_is_named(tmp_path, data, said):
    (tmp_path / "photos" / "a").mkdir(parents=True)
    (tmp_path / "photos" / "a" / "x.png").write_bytes(data)
    with pytest.raises(ValueError, match=f"a/x.png.*{said}"):
        export_image_folder(tmp_path / "photos", tmp_path / "out", progress=False)
