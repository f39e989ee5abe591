"""What machine a benchmark ran on, and its matmul peak: one home for every benchmark's record of the CPU.

``describe()`` names the CPU (model, the instruction-set flags that decide torch's CPU speed: AVX2, AVX-512,
AVX512-BF16, AMX; the model and the flags are read by ``trainer.engines.cpu_model`` and ``cpu_flags``, which ``train``
and the demo use too), torch's kernel set
and threads, and the load; ``matmul_peak()`` measures the best large-GEMM rate in a dtype, the denominator of a CPU's
MFU.
"""

from __future__ import annotations

import os
import platform
import time

import torch

FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "amx_int8")  # what decides torch's CPU speed


def describe() -> dict:
    from llava_normaligned.trainer.engines import cpu_flags, cpu_has_bf16_matmul, cpu_model

    flags = cpu_flags()
    return {"cpu": cpu_model(), "cpu_flags": [flag for flag in FLAGS if flag in flags],
            "bf16_matmul_instructions": cpu_has_bf16_matmul(),
            "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "torch": torch.__version__, "platform": platform.platform(),
            "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}


def matmul_peak(dtype: torch.dtype = torch.float32, size: int = 2048, repeats: int = 5) -> float:
    """Best GFLOP/s of a (size x size) @ (size x size) product in ``dtype`` on this process's threads."""
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=generator).to(dtype)
    b = torch.randn(size, size, generator=generator).to(dtype)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2.0 * size**3 / best / 1e9


__all__ = ["FLAGS", "describe", "matmul_peak"]
