"""Atomic writes: nothing half-written, and the outputs get ordinary permissions."""

import stat

import pytest

from distillery import io
from distillery.io import atomic_dir, atomic_path, write_text


def _mode(path):
    return stat.S_IMODE(path.stat().st_mode)


def test_atomic_file_is_readable_like_any_output_and_keeps_an_existing_mode(tmp_path):
    out = write_text(tmp_path / "a" / "table.md", "x")
    assert out.read_text() == "x" and _mode(out) == 0o666 & ~io._UMASK  # 0644 under the usual umask 022
    out.chmod(0o640)
    write_text(out, "y")
    assert out.read_text() == "y" and _mode(out) == 0o640
    with atomic_dir(tmp_path / "model") as tmp:
        (tmp / "config.json").write_text("{}")
    assert _mode(tmp_path / "model") == 0o777 & ~io._UMASK


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    out = write_text(tmp_path / "m.json", "old")
    with pytest.raises(RuntimeError):
        with atomic_path(out) as tmp:
            tmp.write_text("half")
            raise RuntimeError("crash")
    assert out.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["m.json"]
