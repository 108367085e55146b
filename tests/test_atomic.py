"""A folder replaced with ``atomic.replaced_folder`` is the old one or the new one, whatever stops
the block or the renames after it."""

from pathlib import Path

import pytest

from packdata.atomic import replaced_folder


@pytest.fixture
def old(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "old.txt").write_text("old")
    return folder


def contents(folder):
    """Every name in ``folder``'s parent, and what the folder holds."""
    return sorted(path.name for path in folder.parent.iterdir()), sorted(
        path.name for path in folder.iterdir()
    )


def test_a_block_that_succeeds_replaces_the_folder(old):
    with replaced_folder(old) as staging:
        (staging / "new.txt").write_text("new")
    assert contents(old) == (["data"], ["new.txt"])


def test_a_block_that_fails_leaves_the_old_folder_and_nothing_beside_it(old):
    with pytest.raises(KeyboardInterrupt), replaced_folder(old) as staging:
        (staging / "new.txt").write_text("new")
        raise KeyboardInterrupt
    assert contents(old) == (["data"], ["old.txt"])


def test_a_stop_between_the_two_renames_puts_the_old_folder_back(old, monkeypatch):
    renames = []
    rename = Path.rename

    def second_fails(self, target):
        renames.append(self)
        if len(renames) == 2:  # the old folder is aside, the new one not yet in
            raise KeyboardInterrupt
        return rename(self, target)

    monkeypatch.setattr(Path, "rename", second_fails)
    with pytest.raises(KeyboardInterrupt), replaced_folder(old) as staging:
        (staging / "new.txt").write_text("new")
    monkeypatch.undo()
    assert contents(old) == (["data"], ["old.txt"])
