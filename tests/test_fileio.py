"""hardware_profiles.fileio: atomic writes that leave the old file or the whole new one,
never a temporary, and report a failure in one line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hardware_profiles.errors import ConfigError
from hardware_profiles.fileio import atomic_write, prepare_file_out


def test_atomic_write_replaces_the_whole_file(tmp_path: Path) -> None:
    p = tmp_path / "sub" / "a.json"
    atomic_write(p, "old")
    atomic_write(p, b"new")
    assert p.read_text() == "new" and sorted(x.name for x in p.parent.iterdir()) == ["a.json"]


def test_a_failed_write_removes_its_temporary_and_keeps_the_old_file(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    p = tmp_path / "a.json"
    p.write_text("old")

    def full_disk(src: object, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    with pytest.raises(ConfigError, match=r"a\.json: --out: cannot write there: No space left on device$"):
        atomic_write(p, "new", "--out")
    assert p.read_text() == "old" and sorted(x.name for x in tmp_path.iterdir()) == ["a.json"]


def test_a_directory_or_a_file_in_the_way_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot write there: is a directory$"):
        atomic_write(tmp_path, "x")
    f = tmp_path / "f"
    f.write_text("")
    with pytest.raises(ConfigError, match=r"cannot write there: a file is in the way where a folder is needed$"):
        atomic_write(f / "a.json", "x")
    with pytest.raises(ConfigError, match=r": --out: is a directory \(give a file name\)$"):
        prepare_file_out(tmp_path)
    assert sorted(x.name for x in tmp_path.iterdir()) == ["f"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_an_unwritable_folder_is_one_line(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(ConfigError, match=r"cannot write there: Permission denied$"):
            atomic_write(ro / "a.json", "x")
        assert list(ro.iterdir()) == []
    finally:
        ro.chmod(0o700)
