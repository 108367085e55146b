"""Fixtures shared by the whole test suite."""

import io
import re
import tarfile

import pytest

from packdata import synthetic
from packdata.shardwrite import write_shards

# make test runs pytest in two pytest-xdist workers. Work goes out a scope at a time: a file (so
# that a notebook's cells share their kernel), or a set of lessons with the browser tests of their
# decks, which measure the decks the lessons leave (so each lesson runs first, in that worker).
# Lessons that write the same files form one set, run one after the other; the Slurm test joins
# lesson 8, which starts a cluster too (two one-node clusters on one host would both number their
# first job 1, and so share its rendezvous port and scratch folder). The lessons go out first.
LESSON_FILES = ("tests/test_lessons.py", "tests/test_slides.py", "tests/test_slurm.py")
LESSON_SETS = ("04 05", "00 01 02 03", "08", "06", "07")
LESSON = re.compile(r"\[(\d\d)_")


def scope_of(nodeid):
    """The unit of work ``nodeid`` goes out in: its file, or its set of lessons."""
    file = nodeid.split("::", 1)[0]
    if file == "tests/test_slurm.py":
        return "lessons 08"
    found = LESSON.search(nodeid) if file in LESSON_FILES else None
    number = found and found[1]
    return next((f"lessons {s}" for s in LESSON_SETS if number in s.split()), file)


def pytest_collection_modifyitems(items):
    def first(item):
        scope = scope_of(item.nodeid)
        sets = [f"lessons {s}" for s in LESSON_SETS]
        return sets.index(scope) if scope in sets else len(sets)

    items.sort(key=first)


def pytest_xdist_make_scheduler(config, log):
    """The scheduler of the scopes above, in collection order."""
    from xdist.scheduler import LoadScopeScheduling

    class ByScope(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            return scope_of(nodeid)

    config.option.loadscopereorder = False  # keep the order above
    return ByScope(config, log)


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory):
    """Root of a 60-image synthetic dataset (6 per class), built once per session. Do not modify
    it."""
    return synthetic.make_dataset(
        tmp_path_factory.mktemp("data") / "synthetic-60", size=60, progress=False
    )


@pytest.fixture(scope="session")
def tiny_shards(tiny_dataset, tmp_path_factory):
    """``tiny_dataset`` written as 7 shards (six of 9 samples, one of 6): their paths, in order."""
    out = tmp_path_factory.mktemp("tiny-shards")
    written = write_shards(tiny_dataset, out, maxcount=9, progress=False)
    return [str(info.path) for info in written]


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
