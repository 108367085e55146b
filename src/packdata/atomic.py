"""Files and folders that appear under their name only once they are complete.

A crash, an error or a Ctrl-C part-way leaves the old file (or folder) as it was and no partial one
beside it: the new content is written under a hidden temporary name in the same folder, then renamed
over the target, which POSIX makes atomic within one filesystem. A folder takes two renames (the old
one aside, the new one in): a process killed outright between them leaves the old folder under a
hidden ``-old`` name.

    with written_atomically("train.tar") as file:     # a binary file
        file.write(data)
    with replaced_folder("data/shapes") as staging:   # an empty folder that becomes data/shapes
        (staging / "a.jpg").write_bytes(jpeg)
"""

import filecmp
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path


def temporary_prefix(name):
    """The prefix of a temporary name beside ``name``: hidden, and short enough for any file name
    (a name may have 255 bytes, and mkstemp adds 8 characters)."""
    return f".{name.encode()[:200].decode(errors='ignore')}.partial-"


@contextmanager
def written_atomically(path, keep_same=False):
    """Yield a binary file that becomes ``path`` only when the block succeeds; otherwise nothing is
    left. ``keep_same``: when ``path`` already holds the very bytes written, it stays as it was
    (its inode and time too), so that a reader that checks them, opened on it elsewhere, is not
    told it changed."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a folder: give the name of the file to write")
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=temporary_prefix(path.name), dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as file:
            yield file
            file.flush()
            # on disk before the rename: after a crash the name never holds a partial file
            os.fsync(file.fileno())
        if keep_same and same_bytes(temporary, path):
            os.unlink(temporary)
            return
        # mkstemp makes it private; an archive should be readable like any file
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def same_bytes(one, other):
    """True when the files ``one`` and ``other`` both exist and hold the same bytes."""
    return os.path.isfile(other) and filecmp.cmp(one, other, shallow=False)


@contextmanager
def replaced_folder(target):
    """Yield an empty sibling of ``target`` that replaces it (a folder, or nothing yet) only if the
    block succeeds. The caller decides beforehand whether ``target`` may be replaced."""
    target = Path(os.path.abspath(target))  # so that "." or "x/.." have a real name and parent
    if target.exists() and not target.is_dir():
        raise FileExistsError(f"{target} exists and is not a folder")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=temporary_prefix(target.name), dir=target.parent))
    except PermissionError as err:
        raise PermissionError(f"cannot write to {target}: {err.strerror}") from err
    retired = staging.with_name(staging.name + "-old")  # the old folder, while it is replaced
    try:
        # mkdtemp makes it private; a dataset should be readable like any folder
        staging.chmod(0o755)
        yield staging
        if target.exists():
            target.rename(retired)
        staging.rename(target)
    except BaseException:
        if retired_only(retired, target):  # stopped between the two renames: the old one back
            retired.rename(target)
        shutil.rmtree(staging, ignore_errors=True)
        raise
    shutil.rmtree(retired, ignore_errors=True)


def retired_only(retired, target):
    """Whether the old folder was moved aside (to ``retired``) and none took its place."""
    return retired.exists() and not target.exists()
