"""Fixtures shared by the whole test suite."""

import io
import tarfile

import pytest

from packdata import synthetic


def pytest_collection_modifyitems(items):
    """The lessons and the browser test of their decks first (``xdist_group("lessons")``): they
    are the longest chain, and under ``make test``'s two pytest-xdist workers one worker runs them
    in turn while the other takes every other test."""
    items.sort(key=lambda item: item.get_closest_marker("xdist_group") is None)


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory):
    """Root of a 60-image synthetic dataset (6 per class), built once per session. Do not modify
    it."""
    return synthetic.make_dataset(
        tmp_path_factory.mktemp("data") / "synthetic-60", size=60, progress=False
    )


@pytest.fixture(scope="session")
def write_tar():
    """``write_tar(path, [(name, bytes)], tar_format=USTAR_FORMAT)``: a tar of those members in that
    order, written by Python's ``tarfile`` (a writer independent of ours); returns ``path`` as a
    string. A member may also be ``(tarfile.TarInfo, bytes or None)``, for other fields and member
    types (links, say)."""

    def write(path, members, tar_format=tarfile.USTAR_FORMAT):
        with tarfile.open(path, "w", format=tar_format) as tar:
            for member, payload in members:
                info = member if isinstance(member, tarfile.TarInfo) else tarfile.TarInfo(member)
                if payload is not None:
                    info.size = len(payload)
                tar.addfile(info, None if payload is None else io.BytesIO(payload))
        return str(path)

    return write
