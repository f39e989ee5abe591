"""The README and docs followed literally, as a new user does: every tool a command line runs is installed by the
line itself or the one it says it follows; the README's offline training recipe runs as written; and the pages do
not create one folder name with different commands (following two pages in one folder would end in "the folder is
not empty")."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]


def _blocks(text: str) -> list[str]:
    """The shell blocks of a Markdown text, continuation lines joined."""
    return [body.replace("\\\n", " ") for lang, body in re.findall(r"```(\w*)\n(.*?)```", text, flags=re.S)
            if lang in ("bash", "sh", "")]


def _extras() -> dict[str, set[str]]:
    """pyproject's extras -> the distribution names they install (extras of this package followed)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    raw = project["optional-dependencies"]
    name = project["name"]

    def names(extra: str, seen=()) -> set[str]:
        out = set()
        for requirement in raw[extra]:
            dist = re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower()
            if dist == name:
                for inner in re.search(r"\[(.*?)\]", requirement).group(1).split(","):
                    if inner.strip() not in seen:
                        out |= names(inner.strip(), (*seen, extra))
            else:
                out.add(dist)
        return out

    return {extra: names(extra) for extra in raw}


# what a command line runs -> the distribution
TOOLS = {"pytest": "pytest", "lint-imports": "import-linter", "tests.support.layers": "import-linter"}


def _tool_lines(text: str):
    for block in _blocks(text):
        for line in block.splitlines():
            line = line.split(" #")[0]
            for tool, dist in TOOLS.items():
                if re.search(rf"(^|&&|\s)(python -m )?{re.escape(tool)}\b", line):
                    yield line.strip(), dist


def _installed_by(line: str, extras: dict[str, set[str]]) -> set[str]:
    found = set()
    for extra in re.findall(r'pip install [^&]*-e "?\.\[([\w,]+)\]', line):
        for name in extra.split(","):
            found |= extras[name]
    return found


def test_every_readme_line_that_runs_a_test_tool_installs_it():
    """The fast tier sat under the install commands, but after the first one (``.[all]``) pytest was not there."""
    extras = _extras()
    assert "pytest" not in extras["all"]  # why a line must install .[dev] itself
    lines = list(_tool_lines((ROOT / "README.md").read_text()))
    assert any('-m "not slow"' in line for line, _ in lines)  # the fast tier is among them
    for line, dist in lines:
        assert dist in _installed_by(line, extras), f"README: `{line}` runs {dist} without installing it"


def test_the_tool_check_catches_the_old_fast_tier_line():
    extras = _extras()
    old = '```bash\npython -m pytest -q -m "not slow"\n```\n'
    (line, dist), = _tool_lines(old)
    assert dist not in _installed_by(line, extras)


def _created_folders(pages: dict[str, str]) -> dict[str, dict[str, set[str]]]:
    """folder -> page -> the command lines (normalised) that create it there."""
    made: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    pattern = re.compile(r"--(?:output-dir|output_dir|local-dir|output)[ =](\S+)"
                         r"|save_tiny_parts\(['\"]([^'\"]+)|save\(model, processor, ['\"]([^'\"]+)")
    for page, text in pages.items():
        blocks = _blocks(text) + re.findall(r"```python\n(.*?)```", text, flags=re.S)
        for block in blocks:
            for line in block.splitlines():
                for step in line.split(" #")[0].split("&&"):  # the command that makes it, not the set-up before
                    step = " ".join(step.split())
                    for match in pattern.finditer(step):
                        folder = next(g for g in match.groups() if g).removeprefix("./").rstrip("/")
                        made[folder][page].add(step)
    return made


def _collisions(pages: dict[str, str]) -> list[str]:
    out = []
    for folder, by_page in _created_folders(pages).items():
        commands = set().union(*by_page.values())
        if len(commands) > 1:
            out.append(f"{folder}: {dict((p, sorted(c)) for p, c in by_page.items())}")
    return out


def test_no_folder_is_created_by_two_different_commands_across_the_pages():
    pages = {page: (ROOT / page).read_text() for page in PAGES}
    assert _collisions(pages) == []


def test_the_folder_check_catches_the_pages_as_they_were():
    """README, docs/align.md and docs/chat.md all wrote `shapes` and `llava-na-tiny`."""
    pages = {
        "README.md": "```bash\nllava-normaligned make-data --output-dir shapes\n```\n"
                     "```python\nsave(model, processor, \"llava-na-tiny\")\n```\n",
        "docs/align.md": "```bash\nllava-normaligned make-data --output-dir shapes --train-per-template 16\n```\n",
        "docs/chat.md": "```bash\nllava-normaligned compose --vision-model v --text-model t --output-dir llava-na-tiny\n```",
        "docs/demo.md": "```bash\nllava-normaligned demo --output-dir demo_out\n```\n",
        "docs/other.md": "```bash\npip install x && llava-normaligned demo --output-dir demo_out   # the same step\n```",
    }
    found = _collisions(pages)
    assert [c.split(":")[0] for c in found] == ["shapes", "llava-na-tiny"]


def _offline_recipe() -> str:
    text = (ROOT / "README.md").read_text()
    after = text[text.index("**Train one yourself, offline**"):]
    return _blocks(after)[0]


@pytest.mark.slow
def test_the_readme_offline_training_recipe_runs_as_written(tmp_path):
    recipe = _offline_recipe()
    assert "make-data" in recipe and "train --stage 1" in recipe and "train --stage 2" in recipe
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PATH=os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]))
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", recipe], cwd=tmp_path, env=env, text=True,
                          capture_output=True, stdin=subprocess.DEVNULL, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "stage 1 done: shapes-s1" in done.stdout and "stage 2 done: shapes-s2" in done.stdout
    with open(tmp_path / "shapes-s2" / "training_summary.json") as handle:
        summary = json.load(handle)
    assert summary["stage"] == 2 and summary["training"]["global_steps"] == 30
    with open(tmp_path / "shapes-s2-eval" / "results.json") as handle:
        results = json.load(handle)
    score = json.dumps(results)
    assert "synthetic" in score
