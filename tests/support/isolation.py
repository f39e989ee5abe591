"""Run Python in a fresh subprocess where this package cannot be imported: a "fresh machine" for remote code.

A thin test wrapper over the helper the publishing self-check itself uses
(``llava_normaligned.hub_cards.selfcheck.run_without_package``), so that the tests exercise the isolation that
ships: the same interpreter started with ``-I``, a meta-path finder that refuses ``modeling_llava_normaligned`` and
``llava_normaligned`` even when installed, and a working directory outside the repository.
"""

from __future__ import annotations

import os
import subprocess

from llava_normaligned.hub_cards.selfcheck import run_without_package


def run_isolated(code: str, *, cwd: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run ``code`` (dedented) in a fresh interpreter where this package is not importable; raise with its output on
    failure. ``env``: variables added to this process's environment (``HF_MODULES_CACHE`` defaults to
    ``cwd/hf_modules``, so that remote-code modules never land in the developer's cache)."""
    full_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    full_env.update({"HF_HUB_DISABLE_TELEMETRY": "1", "TOKENIZERS_PARALLELISM": "false"})
    full_env.setdefault("HF_MODULES_CACHE", os.path.join(cwd, "hf_modules"))
    full_env.update(env or {})
    result = run_without_package(code, cwd=cwd, env=full_env, timeout=timeout)
    if result.returncode != 0:
        raise AssertionError(f"isolated subprocess failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result
