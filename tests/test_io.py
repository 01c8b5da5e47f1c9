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


def test_a_damaged_state_file_is_set_aside_named_and_rebuilt_never_deleted(tmp_path):
    import json

    import yaml

    from distillery.io import read_state

    state = tmp_path / "changes.json"
    assert read_state(state) is None  # absent: a first run
    state.write_text('{"a": 1}')
    assert read_state(state) == {"a": 1}
    said = []
    for damage in ('{"a": 1', "[1, 2]", "\xff\xfe"):  # cut short, the wrong kind, not text
        state.write_bytes(damage.encode("latin-1"))
        assert read_state(state, say=said.append) is None and not state.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["changes.json.damaged", "changes.json.damaged.1",
                                                          "changes.json.damaged.2"]
    assert (tmp_path / "changes.json.damaged").read_text() == '{"a": 1'  # kept as it was
    assert len(said) == 3 and said[0] == (f"{state} was damaged (not readable as dict): set aside as "
                                          "changes.json.damaged, rebuilt from the outputs")
    lock = tmp_path / "dvc.lock"
    lock.write_text("schema: '2.0'\nstages: [\n")
    assert read_state(lock, yaml.safe_load) is None and (tmp_path / "dvc.lock.damaged").is_file()
    lock.write_text(json.dumps({"schema": "2.0", "stages": {}}))
    assert read_state(lock, yaml.safe_load) == {"schema": "2.0", "stages": {}}


def test_a_full_disk_is_one_line_naming_the_file_and_the_space_left_whoever_raised_it(tmp_path):
    import errno

    from distillery.errors import DiskFullError, UserError, disk_full

    full = disk_full(OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "data" / "task.arrow")), tmp_path)
    assert isinstance(full, DiskFullError) and isinstance(full, UserError)
    line = str(full)
    assert "\n" not in line and line.startswith(f"no space left on device writing {tmp_path / 'data' / 'task.arrow'} (")
    assert " MiB free on the filesystem of " in line and "run again" in line
    try:  # a checkpoint writer's error whose cause is the full disk
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as inner:
            raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 4480 vs 4368") from inner
    except RuntimeError as outer:
        assert disk_full(outer, tmp_path) is not None
        # the writer names no file: the line names what the stage was writing, when the caller says
        assert str(disk_full(outer, tmp_path, "models/teacher-mlm")).startswith(
            "no space left on device writing models/teacher-mlm (")
    # the same words on a disk with room: not a full disk (a bug keeps its traceback)
    assert disk_full(RuntimeError("unexpected pos 4480 vs 4368"), tmp_path) is None
    assert disk_full(OSError(errno.EACCES, "Permission denied", "x"), tmp_path) is None
    assert disk_full(ValueError("no"), tmp_path) is None
