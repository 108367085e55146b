"""Fixtures shared by the whole test suite."""

import pytest

from packdata import data


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory):
    """Root of a 60-image synthetic dataset (6 per class), built once per session. Do not modify it."""
    return data.make_dataset(tmp_path_factory.mktemp("data") / "synthetic-60", size=60, progress=False)
