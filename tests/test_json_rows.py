"""The row-by-row JSON reader of ``load_llava_json`` (``trainer/data/llava_json.py: iter_json_rows``, ijson's C backend): the
same rows as ``json.loads`` for every way a list can be laid out and cut into pieces, the whole-file error for anything
else, and memory that does not hold every row's objects at once."""

from __future__ import annotations

import codecs
import json
import os
import random
import subprocess
import sys
import textwrap

import pytest

from llava_normaligned.trainer.data import DataError
from llava_normaligned.trainer.data.llava_json import JSON_BUFFER, iter_json_rows, parse_json_rows_whole

TRICKY = [
    {"id": "a", "conversations": [{"from": "human", "value": "brackets ] [ } { and \"quotes\", commas, \\\\"}]},
    {"id": "\u00e9\u4e2d\U0001f600", "value": "multi-byte \u00e9\u4e2d\U0001f600 text cut anywhere" * 3},
    12345678901234567890,
    -1.5e-300,
    "a string row",
    [1, [2, [3, {"k": None}]]],
    True,
    None,
    {},
    [],
    {"escapes": "\\n\\t\\u00e9 \u2028 \\ud83d\\ude00", "empty": ""},
]


def _write(tmp_path, name: str, text: str | bytes) -> str:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    return str(path)


@pytest.mark.parametrize("layout", ["compact", "indented", "spaced"])
@pytest.mark.parametrize("block", [1, 2, 3, 7, 64, 1 << 20])
def test_rows_equal_json_loads_for_every_piece_size(tmp_path, layout, block):
    rng = random.Random(block)
    rows = TRICKY + [{"id": str(k), "n": rng.random(), "text": "w" * rng.randrange(0, 300)} for k in range(60)]
    text = {"compact": json.dumps(rows, separators=(",", ":")), "indented": json.dumps(rows, indent=2),
            "spaced": " \n\t[ " + " ,\r\n ".join(json.dumps(r, ensure_ascii=False) for r in rows) + " ] \n\n"}[layout]
    path = _write(tmp_path, "rows.json", text)
    assert list(iter_json_rows(path, block=block)) == json.loads(text)


@pytest.mark.parametrize("text", ["[]", " [ ] ", "[\n]\n", "[0]", "[ 7 ]", '["x"]', " " * 5000 + "[1, 2]",
                                  '[{"a": 1}, {"a": Infinity}, {"a": -Infinity}, {"a": 2}]'])
@pytest.mark.parametrize("block", [1, 3, 1 << 20])
def test_small_lists(tmp_path, text, block):
    path = _write(tmp_path, "rows.json", text)
    assert list(iter_json_rows(path, block=block)) == json.loads(text)


def test_byte_order_mark_and_utf16(tmp_path):
    rows = [{"id": "\u00e9"}, {"id": "2"}]
    bom = _write(tmp_path, "bom.json", codecs.BOM_UTF8 + json.dumps(rows).encode("utf-8"))
    assert list(iter_json_rows(bom, block=2)) == rows
    utf16 = _write(tmp_path, "utf16.json", json.dumps(rows).encode("utf-16"))
    assert list(iter_json_rows(utf16, block=2)) == rows


@pytest.mark.parametrize("text, why", [
    ('[{"a": 1}, {"a": 2}', "cut off"),
    ('[{"a": 1},]', "trailing comma"),
    ('[{"a": 1} {"a": 2}]', "missing comma"),
    ('[{"a": 1}] x', "text after the list"),
    ('[{"a": 1}][]', "two lists"),
    ('{"a": 1}', "an object, not a list"),
    ('{"item": {"a": 1}}', "an object whose key is ijson's name for a list's elements"),
    ('[1] /* comment */', "a comment"),
    ('', "empty file"),
    ('[{"a": "\x01"}]', "control character"),
    ('[{"a": 1}, {"a": nope}]', "bad value"),
])
@pytest.mark.parametrize("block", [2, 1 << 20])
def test_bad_files_give_the_whole_file_error(tmp_path, text, why, block):
    path = _write(tmp_path, "bad.json", text)
    with pytest.raises(DataError) as streamed:
        list(iter_json_rows(path, block=block))
    with pytest.raises(DataError) as whole:
        parse_json_rows_whole(path)
    assert str(streamed.value) == str(whole.value), why
    assert path in str(streamed.value)


def test_invalid_utf8_is_named(tmp_path):
    path = _write(tmp_path, "bad.json", b'[{"a": "\xff\xfe"}]')
    with pytest.raises(DataError, match="not valid JSON"):
        list(iter_json_rows(path, block=3))


def test_jsonl_lines_and_their_errors(tmp_path):
    rows = [{"id": str(k)} for k in range(5)]
    path = _write(tmp_path, "rows.jsonl", "\n".join(json.dumps(r) for r in rows) + "\n\n")
    assert list(iter_json_rows(path)) == rows
    bad = _write(tmp_path, "bad.jsonl", '{"id": 1}\n{"id": \n')
    with pytest.raises(DataError, match=r"bad\.jsonl, line 2: not valid JSON"):
        list(iter_json_rows(bad))


def test_memory_holds_rows_one_at_a_time(tmp_path):
    """A mix665k-like file (multi-turn rows, about 120 MB): ``json.loads`` holds every row's objects at once, above
    the file's size; the row-by-row reader one piece (64 KiB) with its parse events, and one row. Peak of the Python allocations
    (tracemalloc) while each reads the file, in a fresh process each."""
    path = tmp_path / "big.json"
    turns = [{"from": "human" if k % 2 == 0 else "gpt", "value": f"turn {k} " + "word " * 12} for k in range(8)]
    row = {"id": "x", "image": "coco/train2017/000000000009.jpg", "conversations": turns}
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("[")
        for k in range(150_000):
            handle.write(("," if k else "") + json.dumps(dict(row, id=str(k))))
        handle.write("]")
    size_mib = os.path.getsize(path) / 2**20
    probe = textwrap.dedent(f"""
        import json, sys, tracemalloc
        from llava_normaligned.trainer.data.llava_json import iter_json_rows
        tracemalloc.start()
        if sys.argv[1] == "whole":
            n = len(json.loads(open({str(path)!r}, "rb").read()))
        else:
            n = sum(1 for _ in iter_json_rows({str(path)!r}))
        print(n, tracemalloc.get_traced_memory()[1] / 2**20)
    """)
    peak = {}
    for how in ("whole", "rows"):
        out = subprocess.run([sys.executable, "-c", probe, how], capture_output=True, text=True, check=True,
                             stdin=subprocess.DEVNULL)
        count, peak[how] = out.stdout.split()
        assert int(count) == 150_000
    whole, rows = float(peak["whole"]), float(peak["rows"])
    print(f"file {size_mib:.0f} MiB: json.loads peak {whole:.0f} MiB, rows one by one {rows:.0f} MiB")
    assert whole > 2 * size_mib, (whole, size_mib)  # the bytes and every row's objects at once
    # a piece and the events parsed from it (a few times its size), not the file
    assert rows < 64 * JSON_BUFFER / 2**20 and rows < whole / 100, (rows, whole, size_mib)
