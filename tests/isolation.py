"""Run Python in a fresh subprocess where this package cannot be imported: a "fresh machine" for remote code.

The interpreter is the same (so transformers and torch are there), but a meta-path finder placed first refuses
``modeling_llava_normaligned`` and ``llava_normaligned``, whether they are installed editable or not, and the
working directory is outside the repository.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

BLOCKED = ("modeling_llava_normaligned", "llava_normaligned")

_PRELUDE = f"""
import sys
class _Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {BLOCKED!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked: fresh-machine check)")
        return None
sys.meta_path.insert(0, _Blocked())
try:
    import modeling_llava_normaligned  # noqa: F401
except ModuleNotFoundError:
    pass
else:
    raise SystemExit("isolation failed: modeling_llava_normaligned is importable")
"""


def run_isolated(code: str, *, cwd: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter where this package is not importable; raise with its output on failure."""
    full_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    full_env.update({"HF_HUB_DISABLE_TELEMETRY": "1", "TOKENIZERS_PARALLELISM": "false"})
    full_env.setdefault("HF_MODULES_CACHE", os.path.join(cwd, "hf_modules"))
    full_env.update(env or {})
    script = _PRELUDE + textwrap.dedent(code)
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout
    )
    if result.returncode != 0:
        raise AssertionError(f"isolated subprocess failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result
