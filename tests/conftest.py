"""Shared fixtures: tiny models built in code, written to disk once per session. Nothing is downloaded.

The tests run in the environment of a fresh machine, whatever the shell that started them had exported: the
settings that change what the libraries under test do, read or write (the Hub's endpoint, token and offline switch,
their caches, progress bars, verbosity, warning filters, a launcher's rank variables) are removed here, before any
of those libraries is imported (torch too: it imports tqdm, which reads its settings then), and the caches they write
(``HF_HOME``: the datasets cache, remote-code modules, tokens; this package's ``--help`` cache) go to a folder of
this run, removed at its end. Child processes inherit the same. Kept: the transformers sdist that
tests/test_transformers_common.py fetches (``$LLAVA_NA_TEST_CACHE``, else ``$XDG_CACHE_HOME/llava-normaligned`` or
``~/.cache/llava-normaligned``: docs/DEVELOPING.md), and what changes only speed (``OMP_NUM_THREADS``) or which
hardware is used (``CUDA_VISIBLE_DEVICES``). Subprocesses get ``stdin=subprocess.DEVNULL``; those a test sends
signals to start through ``tests/support/processes.py``.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from tests.support.vllm_env import vllm_python  # noqa: F401 - a fixture of the vLLM tests (test_vllm, test_compat)

# a user's settings, by prefix and by name (see the module's docstring)
USER_SETTING_PREFIXES = ("HF_", "HUGGING_FACE_", "HUGGINGFACE_", "TQDM_", "ACCELERATE_")
USER_SETTINGS = ("TRANSFORMERS_OFFLINE", "TRANSFORMERS_CACHE", "TRANSFORMERS_VERBOSITY",
                 "TRANSFORMERS_NO_ADVISORY_WARNINGS", "DATASETS_VERBOSITY", "PYTHONWARNINGS", "LLAVA_NORMALIGNED_CACHE",
                 "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
for _name in [name for name in os.environ if name.startswith(USER_SETTING_PREFIXES) or name in USER_SETTINGS]:
    del os.environ[_name]
RUN_CACHES = tempfile.mkdtemp(prefix="llava-na-tests-")  # this run's caches, removed in pytest_unconfigure
os.environ.update(HF_HOME=os.path.join(RUN_CACHES, "hf_home"),
                  LLAVA_NORMALIGNED_CACHE=os.path.join(RUN_CACHES, "llava-normaligned"),
                  HF_HUB_DISABLE_TELEMETRY="1", TOKENIZERS_PARALLELISM="false")


def pytest_unconfigure(config):
    shutil.rmtree(RUN_CACHES, ignore_errors=True)


def _recorded_durations() -> tuple[dict[str, float], float]:
    import json

    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "durations.json"), encoding="utf-8") as handle:
        record = json.load(handle)
    return record["tests"], record["slow_seconds"]


def pytest_collection_modifyitems(config, items):
    """The tiers: a test whose recorded duration (tests/durations.json, .ci/durations.py) is at least its
    ``slow_seconds`` is marked ``slow``, so ``-m "not slow"`` is the fast tier (docs/DEVELOPING.md, Tests)."""
    seconds, slow_seconds = _recorded_durations()
    root = str(config.rootpath)
    for item in items:
        path = os.path.relpath(str(item.path), root).replace(os.sep, "/")
        name = f"{path}::{item.originalname if hasattr(item, 'originalname') else item.name}"
        if seconds.get(name, 0.0) >= slow_seconds:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def tiny_parts(tmp_path_factory):
    """(vision_dir, text_dir): a tiny SigLIP vision model and a tiny Llama with its tokenizer, as folders."""
    from llava_normaligned.tiny import save_tiny_parts

    return save_tiny_parts(tmp_path_factory.mktemp("tiny_parts"))


@pytest.fixture(scope="session")
def tiny_model_dir(tiny_parts, tmp_path_factory):
    """A norm-aligned model composed from the tiny parts and saved with its processor (read-only: copy to modify)."""
    from llava_normaligned.compose import compose, save

    out = str(tmp_path_factory.mktemp("tiny_model"))
    model, processor = compose(*tiny_parts)
    save(model, processor, out)
    return out


@pytest.fixture
def tiny_model(tiny_model_dir):
    from modeling_llava_normaligned import LlavaNormAlignedForConditionalGeneration

    return LlavaNormAlignedForConditionalGeneration.from_pretrained(tiny_model_dir).eval()


@pytest.fixture
def tiny_processor(tiny_model_dir):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(tiny_model_dir)


@pytest.fixture
def seed():
    import torch

    torch.manual_seed(0)
    return 0


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models run fastest on one thread; two threads on a busy 2-core box spend most of their time waiting.
    A module that wants it: ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def stock_model_dir(tiny_parts, tmp_path_factory):
    """A stock transformers ``LlavaForConditionalGeneration`` folder holding the same tiny parts and the same
    projector MLP as the aligned model, without the norm (paper: w/o Norm)."""
    from llava_normaligned.compose import compose, stock_llava_like

    out = str(tmp_path_factory.mktemp("tiny_stock"))
    composed, processor = compose(*tiny_parts, projector_norm=None)
    stock_llava_like(composed).save_pretrained(out)
    processor.save_pretrained(out)
    return out
