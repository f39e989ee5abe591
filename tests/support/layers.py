"""``python -m tests.support.layers``: import-linter's contracts (``[tool.importlinter]`` in pyproject.toml) on the
package laid out as an install lays it out. In the checkout ``trainer/`` and ``hub_cards/`` sit at the top level
(pyproject.toml's package-dir installs them as ``llava_normaligned.trainer`` and ``llava_normaligned.hub_cards``),
and import-linter reads a package from its one folder, so the contracts run on a copy (``layout.copy_as_installed``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.support.layout import ROOT, copy_as_installed


def lint_imports(tree: Path) -> subprocess.CompletedProcess:
    """``lint-imports --no-cache`` run in ``tree`` (a copy laid out as installed), with ``tree`` first on the
    import path, so the graph is the copy's, not the checkout the editable install points at."""
    program = shutil.which("lint-imports", path=os.path.dirname(sys.executable))
    if program is None:
        raise FileNotFoundError("lint-imports is not installed: `pip install -e .[dev]` installs import-linter")
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run([program, "--no-cache"], check=False, cwd=tree, env=env, capture_output=True, text=True,
                          timeout=300, stdin=subprocess.DEVNULL)


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="layers-") as folder:
        result = lint_imports(copy_as_installed(Path(folder), ROOT))
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
