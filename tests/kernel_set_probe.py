"""A pytest plugin (``-p kernel_set_probe``, with tests/ on PYTHONPATH) that writes the ATen CPU kernel set the run
really used (``torch.backends.cpu.get_cpu_capability()``: DEFAULT, AVX2, AVX512, ...) to the file named by the
environment variable KERNEL_SET_REPORT, once the run is over. test_cpu_kernel_sets.py reads it back: a run under
ATEN_CPU_CAPABILITY=avx2 that silently fell back to another set would otherwise pass without proving anything."""

from __future__ import annotations

import os


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get("KERNEL_SET_REPORT")
    if path:
        import torch

        with open(path, "w") as out:
            out.write(torch.backends.cpu.get_cpu_capability())
