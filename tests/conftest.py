"""Fixtures shared by the whole test suite."""

import io
import tarfile

import pytest

from packdata import data


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory):
    """Root of a 60-image synthetic dataset (6 per class), built once per session. Do not modify it."""
    return data.make_dataset(tmp_path_factory.mktemp("data") / "synthetic-60", size=60, progress=False)


@pytest.fixture(scope="session")
def write_tar():
    """``write_tar(path, [(name, bytes)])``: a ustar tar of those members in that order, written by Python's
    ``tarfile`` (a writer independent of ours); returns ``path`` as a string."""
    def write(path, members):
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
            for name, payload in members:
                info = tarfile.TarInfo(name)
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
        return str(path)
    return write
