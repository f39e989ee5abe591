"""Shared fixtures: tiny models built in code, written to disk once per session. Nothing is downloaded."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


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
