"""The tested set of dependency versions (constraints.txt) against what an environment has installed.

    python .ci/versions.py diff  [constraints.txt]   # which installed versions differ from the tested set
    python .ci/versions.py write [constraints.txt]   # the tested set := this environment's versions

Both read the distributions that `pip install -e ".[dev]"` brings (the package's requirements with the `dev` and
`all` extras, followed through every dependency's own requirements) from the running environment's metadata. torch is
left out: the README installs the build for the machine (a CPU wheel here, a CUDA build on a GPU) before the package,
and `pyproject.toml` asks only for a floor. `write` is what `.ci/newest --update` runs after the suite passed with
the newest releases.
"""

from __future__ import annotations

import sys
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from packaging.markers import UndefinedEnvironmentName
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "llava-normaligned"
EXTRAS = ("dev", "all")
# installed for the machine before the package, not pinned here
NOT_PINNED = {"torch", "triton", PACKAGE}
NOT_PINNED_PREFIXES = ("nvidia-",)
HEADER = """\
# The versions `python -m pytest -q` last passed with (the tested set), for `pip install -e ".[dev]" -c
# constraints.txt` (README, .ci/run). pyproject.toml's ranges say what is supported; this file says what was run.
# It moves forward only through `.ci/newest --update`, which rewrites it after the suite passed with the newest
# releases (then widen the hooks' checked ranges in llava_normaligned/compat.py: tests/test_dependencies.py holds
# the two together). torch is not here: install the build for your machine first, as the README does.
"""


def _wanted(requirement: Requirement, extras: tuple[str, ...]) -> bool:
    if requirement.marker is None:
        return True
    try:
        return any(requirement.marker.evaluate({"extra": extra}) for extra in ("", *extras))
    except UndefinedEnvironmentName:
        return False


def installed_closure(root: str = PACKAGE, extras: tuple[str, ...] = EXTRAS) -> dict[str, str]:
    """{distribution name: installed version} of what ``root[extras]`` requires, followed through every
    dependency's own requirements (their extras included where a requirement names them)."""
    found: dict[str, str] = {}
    todo: list[tuple[str, tuple[str, ...]]] = [(root, extras)]
    seen: set[tuple[str, tuple[str, ...]]] = set()
    while todo:
        name, wanted_extras = todo.pop()
        key = (canonicalize_name(name), tuple(sorted(wanted_extras)))
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = distribution(name)
        except PackageNotFoundError:
            continue  # a requirement for another platform or Python, not installed here
        found[canonicalize_name(dist.metadata["Name"])] = dist.version
        for text in dist.requires or ():
            requirement = Requirement(text)
            if _wanted(requirement, wanted_extras):
                todo.append((requirement.name, tuple(requirement.extras)))
    return {name: version for name, version in sorted(found.items()) if _pinned(name)}


def _pinned(name: str) -> bool:
    return name not in NOT_PINNED and not name.startswith(NOT_PINNED_PREFIXES)


def read_constraints(path: Path) -> dict[str, str]:
    """{distribution name: version} of a constraints file's ``name==version`` lines."""
    pins = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            requirement = Requirement(line)
            (spec,) = requirement.specifier
            pins[canonicalize_name(requirement.name)] = spec.version
    return pins


def differences(tested: dict[str, str], installed: dict[str, str]) -> list[str]:
    """One line per distribution whose installed version is not the tested one (or that only one side has)."""
    lines = []
    for name in sorted(set(tested) | set(installed)):
        before, now = tested.get(name), installed.get(name)
        if before != now:
            lines.append(f"{name}: tested {before or '-'}, installed {now or '-'}")
    return lines


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("diff", "write") or len(argv) > 2:
        print(__doc__.strip().split("\n\n")[1], file=sys.stderr)
        return 2
    path = Path(argv[1]) if len(argv) == 2 else ROOT / "constraints.txt"
    installed = installed_closure()
    if argv[0] == "write":
        path.write_text(HEADER + "".join(f"{name}=={version}\n" for name, version in installed.items()),
                        encoding="utf-8")
        print(f"wrote {path}: {len(installed)} versions")
        return 0
    lines = differences(read_constraints(path), installed)
    print("\n".join(lines) if lines else f"every installed version is the tested one ({path.name})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
