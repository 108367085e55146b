"""Fixtures shared by the whole test suite."""

import io
import tarfile

import pytest

from packdata import synthetic

# Run in one pytest-xdist worker, in this order, before anything else (make test runs two): the
# lessons, then the browser test of the decks they leave, and the Slurm test, which must not run
# beside lesson 8's cluster (two one-node clusters on a host would give both jobs id 1, and with it
# the same rendezvous port and scratch folder). Every other file goes whole to one worker or the
# other, so that a notebook's cells share their kernel.
TOGETHER = ("tests/test_lessons.py", "tests/test_slides.py", "tests/test_slurm.py")


def file_of(nodeid):
    return nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: file_of(item.nodeid) not in TOGETHER)


def pytest_xdist_make_scheduler(config, log):
    """Work goes out a file at a time, in collection order, the files of ``TOGETHER`` as one."""
    from xdist.scheduler import LoadScopeScheduling

    class ByFile(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            file = file_of(nodeid)
            return "lessons" if file in TOGETHER else file

    config.option.loadscopereorder = False  # keep the order above
    return ByFile(config, log)


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
