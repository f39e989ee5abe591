"""The numerics-heavy tests pass on every CPU kernel set this machine has, not only on the one torch picked.

torch chooses its vectorised CPU kernels once per process (``ATEN_CPU_CAPABILITY``: ``default``, ``avx2``,
``avx512``); another vector width reduces in another order, so a tolerance that only holds for the kernels of the
machine it was written on fails on the next one. Each other supported set reruns the modules that compare gradients,
logits and KLs computed along two paths, in a fresh process with ``ATEN_CPU_CAPABILITY`` set, and the run must report
that set as the one it used (kernel_set_probe.py). ``torch.compile`` tests are left out there: inductor's generated
C++ does not build under a forced capability (``'at::vec' has not been declared``).
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
CAPABILITIES = ("default", "avx2", "avx512")
# fast modules that compare numbers reached by two computations: GWC's gradients (by hand, with checkpointing,
# scaled by the factor), sdpa vs eager, cached vs uncached and batched vs one-by-one generation, T by every command,
# log-likelihoods batched and padded, logits and KLs batched and unbatched (the LLaVA diagnostics, Qwen/SmolVLM).
# About 20 s per kernel set on 2 cores.
MODULES = ("test_model.py", "test_norm_target.py", "test_eval_loglik.py", "test_families_qwen_smolvlm.py",
           "test_diagnostics.py")


def _env(capability: str) -> dict[str, str]:
    env = dict(os.environ)
    env["ATEN_CPU_CAPABILITY"] = capability
    # tiny models: one thread is twice as fast as two on a 2-core machine, and splits the reductions another way
    env["OMP_NUM_THREADS"] = "1"
    return env


@functools.cache
def _effective(capability: str) -> str:
    """The kernel set torch really uses when ``capability`` is asked for (it falls back when the CPU lacks it)."""
    # some virtual machines report an instruction set to torch that the CPU then refuses (SIGILL): run a few kernels
    code = ("import torch; x = torch.randn(64, 64); (x @ x).softmax(-1).sum().item(); "
            "torch.nn.functional.layer_norm(x, (64,)).exp().sum().item(); print(torch.backends.cpu.get_cpu_capability())")
    run = subprocess.run([sys.executable, "-c", code], env=_env(capability), capture_output=True, text=True,
                         timeout=120, stdin=subprocess.DEVNULL)
    if run.returncode == -signal.SIGILL:
        return "refused by the CPU (illegal instruction)"
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("capability", CAPABILITIES)
def test_numerics_hold_on_another_kernel_set(capability, tmp_path):
    current = torch.backends.cpu.get_cpu_capability()
    if capability.upper() == current:
        pytest.skip(f"{current} is the kernel set this run uses: the suite itself covers it")
    effective = _effective(capability)
    if effective != capability.upper():
        pytest.skip(f"this CPU does not support the {capability} kernels (torch used {effective} when asked)")
    report = tmp_path / "kernel_set.txt"
    env = _env(capability)
    env["KERNEL_SET_REPORT"] = str(report)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS), env.get("PYTHONPATH")) if p)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "kernel_set_probe", "-x",
               "-k", "not compile", *(str(TESTS / m) for m in MODULES)]
    run = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
                         stdin=subprocess.DEVNULL)
    assert run.returncode == 0, f"ATEN_CPU_CAPABILITY={capability}:\n{run.stdout[-6000:]}\n{run.stderr[-2000:]}"
    assert report.read_text() == capability.upper(), f"asked for {capability}, the run used {report.read_text()}"
