"""llava_normaligned.atomic_files: atomic writes keep the previous file on failure, leave no temporary file, and write exactly
what json.dump writes."""

import json
import os

import pytest

from llava_normaligned.atomic_files import write_bytes_atomic, write_json_atomic, write_text_atomic

DATA = {"b": [1, 2.5, None, True], "a": {"é": "ünïcode", "z": 0}, "path": "x"}


@pytest.mark.parametrize("kwargs", [{}, {"indent": 1, "default": str}, {"indent": 2, "ensure_ascii": False},
                                    {"indent": 2, "sort_keys": True, "ensure_ascii": False, "default": str}])
def test_json_is_byte_identical_to_json_dump(tmp_path, kwargs):
    expected = tmp_path / "expected.json"
    with open(expected, "w", encoding="utf-8") as handle:
        json.dump(DATA, handle, **kwargs)
    written = write_json_atomic(tmp_path / "written.json", DATA, **kwargs)
    assert written == str(tmp_path / "written.json")
    assert (tmp_path / "written.json").read_bytes() == expected.read_bytes()
    assert sorted(os.listdir(tmp_path)) == ["expected.json", "written.json"]


def test_text_and_bytes(tmp_path):
    write_text_atomic(tmp_path / "a.md", "line one\nlíne two\n", fsync=True)
    assert (tmp_path / "a.md").read_bytes() == "line one\nlíne two\n".encode("utf-8")
    write_bytes_atomic(str(tmp_path / "b.bin"), b"\x00\x01")
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\x01"
    write_text_atomic(tmp_path / "new" / "deeper" / "c.txt", "x", make_folder=True)
    assert (tmp_path / "new" / "deeper" / "c.txt").read_text() == "x"
    with pytest.raises(FileNotFoundError):
        write_text_atomic(tmp_path / "missing" / "d.txt", "x")
    assert sorted(os.listdir(tmp_path)) == ["a.md", "b.bin", "new"]


def test_replaces_an_existing_file(tmp_path):
    path = tmp_path / "results.json"
    path.write_text("old")
    write_json_atomic(path, [1], indent=1)
    assert json.loads(path.read_text()) == [1]
    assert os.listdir(tmp_path) == ["results.json"]


def test_a_failed_write_keeps_the_previous_file_and_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "results.json"
    write_json_atomic(path, {"kept": 1}, indent=2)
    before = path.read_bytes()
    with pytest.raises(TypeError):
        write_json_atomic(path, {"bad": object()}, indent=2)  # not serialisable
    with pytest.raises(UnicodeEncodeError):
        write_text_atomic(path, "half \ud800 a lone surrogate")
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["results.json"]


def test_a_failure_mid_write_removes_the_temporary_file(tmp_path, monkeypatch):
    path = tmp_path / "card.md"
    path.write_text("previous")

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        write_text_atomic(path, "new text")
    monkeypatch.undo()
    assert path.read_text() == "previous"
    assert os.listdir(tmp_path) == ["card.md"]
