"""No reach into another library's private names, and no ``__class__`` swap, outside compat.py
(``tests/support/private_reaches.py`` says what counts); and no test reaching into this package's private names
(``tests/support/own_private_names.py``). A planted reach of each kind is found."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tests.support import own_private_names
from tests.support.private_reaches import ROOT, SOURCES, private_reaches

def test_no_private_reach_outside_compat():
    reaches = private_reaches()
    assert reaches == [], "\n".join(reaches)


@pytest.mark.parametrize(
    ("module", "code", "says"),
    [
        ("llava_normaligned/loading.py", "def f(model):\n    return model._orig_mod", "._orig_mod"),
        ("trainer/train.py", "def f(trainer):\n    return getattr(trainer, '_load_rng_state')", "_load_rng_state"),
        ("llava_normaligned/diagnostics/taps.py", "from transformers.trainer import _is_peft_model", "_is_peft_model"),
        ("llava_normaligned/commands/generate.py", "import torch._dynamo", "import torch._dynamo"),
        ("hub_cards/card.py", "def f(module, cls):\n    module.__class__ = cls", "assigns __class__"),
        ("modeling_llava_normaligned/modeling_normaligned_vlm.py", "def f(p):\n    return p._is_hf_initialized",
         "._is_hf_initialized"),
        ("llava_normaligned/compose.py", "def f(model, m):\n    model._init_weights(m)", "._init_weights"),
    ],
)
def test_a_planted_reach_is_found(tmp_path, module, code, says):
    for folder in SOURCES:
        shutil.copytree(ROOT / folder, tmp_path / folder, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__", "assets", "recipes", "templates"))
    with open(tmp_path / module, "a", encoding="utf-8") as f:
        f.write(f"\n\n{code}\n")
    reaches = private_reaches(tmp_path)
    assert len(reaches) == 1 and reaches[0].startswith(module) and says in reaches[0], reaches


def test_the_scan_runs_as_a_command():
    result = subprocess.run([sys.executable, "-m", "tests.support.private_reaches"], cwd=ROOT, capture_output=True,
                            text=True, stdin=subprocess.DEVNULL, timeout=120)
    assert result.returncode == 0 and "no reach" in result.stdout, result.stdout + result.stderr


def test_no_test_reaches_a_private_name_of_the_package():
    reaches = own_private_names.reaches()
    assert reaches == [], "\n".join(reaches)


PACKAGE = "llava_normaligned"  # the planted sources name it through this, so that this file holds no reach itself


@pytest.mark.parametrize(("code", "says"), [
    (f"from {PACKAGE}.loading import _connect\n", f"from {PACKAGE}.loading import _connect"),
    (f"from {PACKAGE} import compat\ncompat._probe_vllm_llava()\n", "compat._probe_vllm_llava"),
    (f"import {PACKAGE}.loading as loading\nloading._HUB_REACHED.clear()\n", "loading._HUB_REACHED"),
    (f'SCRIPT = """\nfrom {PACKAGE}.evaluation.loglik import _judged\n"""\n', "import _judged"),
])
def test_a_planted_reach_in_a_test_is_found(tmp_path, code, says):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_planted.py").write_text("import os\n" + code)
    (tmp_path / "tests" / "test_clean.py").write_text(f"from {PACKAGE}.loading import load_model\n"
                                                     "x = os._exit  # another library's: not this check's\n")
    reaches = own_private_names.reaches(tmp_path)
    assert len(reaches) == 1 and reaches[0].startswith("tests/test_planted.py:") and says in reaches[0], reaches
