"""Padding-free batches (``--padding_free True``): the rows of a batch packed into one sequence without pad tokens
give the padded batch's loss and gradients, rows never attend to each other, gradient accumulation normalises over
the same answer tokens, and what cannot be packed is refused with one line."""

from __future__ import annotations

import pytest
import torch

from llava_normaligned.trainer.collator import LlavaTrainingCollator
from llava_normaligned.trainer.data import load_llava_json
from llava_normaligned.trainer.padding_free import (
    PACKED_SDPA,
    check_padding_free,
    packed_attention,
)
from llava_normaligned.trainer.preprocess import prepare_dataset
from llava_normaligned.trainer.train import StageConfig, train_stage
from tests.support.numerics import assert_close_scaled
from tests.support.training import cpu_config, write_llava_dataset

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def rows(tiny_model_dir, tmp_path_factory):
    """Prepared rows of different lengths: one-turn and two-turn image rows, and text-only rows."""
    from transformers import AutoProcessor

    folder = tmp_path_factory.mktemp("pf_data")
    path, images = write_llava_dataset(folder, n_rows=6, text_only=2, multi_turn_every=2)
    processor = AutoProcessor.from_pretrained(tiny_model_dir)
    prepared, _ = prepare_dataset(load_llava_json(path, images), processor, max_length=None)
    return [prepared[i] for i in range(len(prepared))], processor


def _model(tiny_model_dir, attn_implementation):
    from modeling_llava_normaligned import LlavaNormAlignedForConditionalGeneration

    return LlavaNormAlignedForConditionalGeneration.from_pretrained(
        tiny_model_dir, attn_implementation=attn_implementation).train()


def _loss_and_grads(model, batch):
    model.zero_grad(set_to_none=True)
    loss = model(**batch).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _close_gradients(actual: dict, expected: dict, rel: float) -> None:
    """Every gradient within ``rel`` of the largest gradient element of its part (vision tower, projector, LLM, LM
    head). Relative to the part, not the tensor: some tensors' exact gradient is zero (an attention key bias: softmax
    does not change when a constant is added to every logit), and what they hold is rounding of much larger terms."""
    assert actual.keys() == expected.keys() and len(expected) > 20

    def part(name):
        return ".".join(name.split(".")[:2])

    scales = {}
    for name, grad in expected.items():
        scales[part(name)] = max(scales.get(part(name), 0.0), float(grad.abs().max()))
    for name, grad in expected.items():
        assert_close_scaled(actual[name], grad, rtol=rel, what=name, scale=scales[part(name)])


@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager", PACKED_SDPA])
def test_packed_batch_gives_the_padded_loss_and_gradients(tiny_model_dir, rows, attn_implementation):
    batch_rows, processor = rows
    padded = LlavaTrainingCollator(processor)(batch_rows)
    packed = LlavaTrainingCollator(processor, padding_free=True)(batch_rows)
    lengths = padded["attention_mask"].sum(1)
    assert "attention_mask" not in packed
    assert packed["input_ids"].shape == (1, int(lengths.sum())) and lengths.min() < lengths.max()
    assert torch.equal(packed["input_ids"][0], padded["input_ids"][padded["attention_mask"].bool()])
    assert torch.equal(packed["position_ids"][0], torch.cat([torch.arange(int(n)) for n in lengths]))
    assert torch.equal(packed["pixel_values"], padded["pixel_values"])
    # the same answer tokens are trained on: the count the Trainer normalises by (labels[..., 1:]) is equal
    assert int((packed["labels"][..., 1:] != -100).sum()) == int((padded["labels"][..., 1:] != -100).sum()) > 0

    model = _model(tiny_model_dir, "sdpa" if attn_implementation == PACKED_SDPA else attn_implementation)
    loss_padded, grads_padded = _loss_and_grads(model, padded)
    vision = model.config.vision_config._attn_implementation
    with packed_attention(model, enabled=attn_implementation == PACKED_SDPA):
        assert model.config.text_config._attn_implementation == attn_implementation
        assert model.config.vision_config._attn_implementation == vision  # images are never packed
        loss_packed, grads_packed = _loss_and_grads(model, packed)
    assert model.config.text_config._attn_implementation != PACKED_SDPA  # restored
    assert_close_scaled(loss_packed, loss_padded, rtol=1e-5, what="loss")
    _close_gradients(grads_packed, grads_padded, 1e-5)


@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager", PACKED_SDPA])
def test_rows_never_attend_to_each_other(tiny_model_dir, rows, attn_implementation):
    batch_rows, processor = rows
    collator = LlavaTrainingCollator(processor, padding_free=True)
    packed = collator(batch_rows[:3])
    starts = (packed["position_ids"][0] == 0).nonzero().flatten().tolist() + [packed["input_ids"].shape[1]]
    first, second = slice(starts[0], starts[1]), slice(starts[1], starts[2])
    changed = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in packed.items()}
    text = changed["input_ids"][0, second] != processor.image_token_id
    vocab = [i for i in range(100, 200) if i != processor.image_token_id]
    changed["input_ids"][0, second][text] = torch.tensor(vocab[: int(text.sum())])  # row 2's text replaced
    assert not torch.equal(changed["input_ids"], packed["input_ids"])

    model = _model(tiny_model_dir, "sdpa" if attn_implementation == PACKED_SDPA else attn_implementation).eval()
    with torch.no_grad(), packed_attention(model, enabled=attn_implementation == PACKED_SDPA):
        a = model(**{k: v for k, v in packed.items() if k != "labels"}).logits
        b = model(**{k: v for k, v in changed.items() if k != "labels"}).logits
    assert torch.equal(a[0, first], b[0, first])  # bit-identical
    assert not torch.equal(a[0, second], b[0, second])  # row 2 itself did change


def test_gradient_accumulation_normalises_over_the_same_tokens(tiny_model_dir, tiny_processor, tmp_path):
    """One optimizer step over two accumulated batches of three rows (SGD, lr 1): the update is minus the gradient
    the Trainer computed, loss normalised over the answer tokens of both batches, TRL's fused LM head included."""
    from modeling_llava_normaligned import LlavaNormAlignedForConditionalGeneration

    path, images = write_llava_dataset(tmp_path / "data", n_rows=4, text_only=2, multi_turn_every=2)
    dataset = load_llava_json(path, images)
    updates = {}
    for padding_free in (False, True):
        model = LlavaNormAlignedForConditionalGeneration.from_pretrained(tiny_model_dir)
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        args = cpu_config(tmp_path / f"out{padding_free}", max_steps=1, per_device_train_batch_size=3,
                          gradient_accumulation_steps=2, optim="sgd", learning_rate=1.0, lr_scheduler_type="constant",
                          max_grad_norm=0.0, padding_free=padding_free, train_sampling_strategy="sequential")
        result = train_stage(model, tiny_processor, dataset, args=args, stage=StageConfig(2))
        assert result.summary["training"]["padding_free"] is padding_free
        updates[padding_free] = {n: p.detach() - before[n] for n, p in result.model.named_parameters()}
    _close_gradients(updates[True], updates[False], 1e-5)


def test_multimodal_rope_is_taken_where_the_model_computes_its_positions():
    """Qwen2-VL's 3-D positions come from its own ``get_rope_index`` row by row (tests/test_padding_free_mrope.py);
    a model without one is refused there."""
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    text = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
            "num_key_value_heads": 1, "vocab_size": 128,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}}
    config = Qwen2VLConfig(text_config=text, vision_config={"depth": 1, "embed_dim": 16, "hidden_size": 32,
                                                            "num_heads": 2, "patch_size": 8})
    model = Qwen2VLForConditionalGeneration(config)
    check_padding_free(model)  # no error
    from llava_normaligned.trainer.padding_free import uses_multimodal_rope

    assert uses_multimodal_rope(model)


def test_an_attention_implementation_that_ignores_packed_positions_is_refused(tiny_model_dir):
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    AttentionInterface.register("test_rows_unaware", sdpa_attention_forward)
    model = _model(tiny_model_dir, "sdpa")
    model.set_attn_implementation({"text_config": "test_rows_unaware"})
    with pytest.raises(ValueError, match=r"--padding_free: .*'test_rows_unaware' ignores packed positions"):
        check_padding_free(model)
    for ok in ("sdpa", "eager"):
        model.set_attn_implementation({"text_config": ok})
        check_padding_free(model)


def test_packing_and_pad_to_multiple_of_are_refused(tiny_model_dir, tiny_processor, tmp_path):
    from modeling_llava_normaligned import LlavaNormAlignedForConditionalGeneration

    path, images = write_llava_dataset(tmp_path / "data", n_rows=2, text_only=0)
    dataset = load_llava_json(path, images)
    model = LlavaNormAlignedForConditionalGeneration.from_pretrained(tiny_model_dir)
    with pytest.raises(ValueError, match="--packing: .*--padding_free True"):
        train_stage(model, tiny_processor, dataset, args=cpu_config(tmp_path / "a", packing=True), stage=2)
    with pytest.raises(ValueError, match="pad_to_multiple_of .* padding_free"):
        train_stage(model, tiny_processor, dataset, args=cpu_config(tmp_path / "b", padding_free=True,
                                                                    pad_to_multiple_of=8), stage=2)


def test_a_batch_without_padding_stays_as_the_padded_batch(rows):
    """Nothing to remove (rows of one length, as stage-1 rows at the paper's shape nearly are): the batch is the
    padded collator's, so it runs the padded path and costs what padded costs; one row of another length packs."""
    batch_rows, processor = rows
    same = [batch_rows[0]] * 3
    padded = LlavaTrainingCollator(processor)(same)
    free = LlavaTrainingCollator(processor, padding_free=True)(same)
    assert bool(padded["attention_mask"].all())  # no padding in it
    assert free.keys() == padded.keys() and "position_ids" not in free
    assert all(torch.equal(free[k], padded[k]) for k in padded if isinstance(padded[k], torch.Tensor))
    lengths = LlavaTrainingCollator(processor)(batch_rows[:2])["attention_mask"].sum(1)
    assert lengths[0] != lengths[1]
    assert "position_ids" in LlavaTrainingCollator(processor, padding_free=True)(batch_rows[:2])  # packed
