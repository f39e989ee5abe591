"""The loss at the labelled positions only: the LM head and the cross-entropy run on the positions whose next token
has a label, in the model's own forward (training mode with labels) and in ``train`` (TRL's fused LM head, compacted
on the CPU too). The loss, TRL's metrics and every gradient equal the full path within float32 round-off: padded
and padding-free, with GWC and without, for our model and each aligned family ``train`` takes here."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from llava_normaligned.cli import main as cli_main
from llava_normaligned.compat import fused_head_compacted_on_cpu
from llava_normaligned.families.processors import TRAINS_WITHOUT_TORCHVISION
from llava_normaligned.loading import load_model
from llava_normaligned.tiny import save_tiny_vlm
from modeling_llava_normaligned import LlavaNormAlignedForConditionalGeneration
from modeling_llava_normaligned.modeling_llava_normaligned import labelled_positions_loss
from tests.support.training import write_llava_dataset

pytestmark = pytest.mark.usefixtures("one_thread")


def _assert_same_gradients(got: dict, want: dict) -> None:
    """Every parameter's gradient equal within float32 round-off (cosine and relative difference, per tensor)."""
    assert got.keys() == want.keys() and want
    largest = max(reference.abs().max().item() for reference in want.values())
    for name, reference in want.items():
        if reference.abs().max().item() < 1e-7 * largest:  # round-off of a zero gradient (a key bias under softmax)
            assert (got[name] - reference).abs().max().item() < 1e-7 * largest, name
            continue
        a, b = got[name].flatten().double(), reference.flatten().double()
        relative = ((a - b).abs().max() / b.abs().max()).item()
        cosine = (a @ b / (a.norm() * b.norm())).item()
        assert relative < 1e-4 and cosine > 1 - 1e-6, (name, relative, cosine)


def _full_reference(hidden, weight, labels, num_items=None):
    logits = F.linear(hidden, weight).float()
    shift = F.pad(labels, (0, 1), value=-100)[..., 1:]
    if num_items is None:
        return F.cross_entropy(logits.flatten(0, 1), shift.flatten(), ignore_index=-100)
    return F.cross_entropy(logits.flatten(0, 1), shift.flatten(), ignore_index=-100, reduction="sum") / num_items


@pytest.mark.parametrize("chunk_rows", [3, 4096])  # chunks recomputed in backward; one chunk
@pytest.mark.parametrize("num_items", [None, 11])
def test_the_loss_equals_the_full_cross_entropy(chunk_rows, num_items):
    torch.manual_seed(0)
    hidden = torch.randn(2, 9, 16, requires_grad=True)
    head = torch.nn.Linear(16, 50, bias=False)
    labels = torch.randint(0, 50, (2, 9))
    labels[0, :4] = -100
    labels[1, 6:] = -100
    loss = labelled_positions_loss(hidden, head, labels, chunk_rows=chunk_rows, num_items_in_batch=num_items)
    grads = torch.autograd.grad(loss, [hidden, head.weight])
    want = _full_reference(hidden, head.weight, labels, num_items)
    want_grads = torch.autograd.grad(want, [hidden, head.weight])
    torch.testing.assert_close(loss, want, rtol=1e-6, atol=1e-6)
    _assert_same_gradients({"hidden": grads[0], "head": grads[1]}, {"hidden": want_grads[0], "head": want_grads[1]})


def test_a_batch_without_labels_is_a_connected_zero():
    """0, with the hidden states and the head in the graph: a rank whose batch holds no label still gives every
    parameter a gradient (DDP waits for each)."""
    hidden = torch.randn(1, 4, 8, requires_grad=True)
    head = torch.nn.Linear(8, 10, bias=False)
    loss = labelled_positions_loss(hidden, head, torch.full((1, 4), -100))
    loss.backward()
    assert loss.item() == 0.0 and torch.count_nonzero(hidden.grad) == 0
    assert head.weight.grad is not None and torch.count_nonzero(head.weight.grad) == 0


def _llava_batch(model, padding_free: bool):
    """Three rows (an image each; one text-only in the padded layout), answers labelled, prompts and images not."""
    torch.manual_seed(1)
    image_id, n_image = model.config.image_token_id, 16
    lengths = (40, 33, 27)
    rows, labels = [], []
    for i, length in enumerate(lengths):
        ids = torch.randint(5, 100, (length,))
        if i < 2:
            ids[1:1 + n_image] = image_id
        label = ids.clone()
        label[: length - 6] = -100  # the answer: the last 6 tokens
        rows.append(ids)
        labels.append(label)
    pixels = torch.randn(2, 3, 32, 32)
    if padding_free:
        return {"input_ids": torch.cat(rows)[None], "labels": torch.cat(labels)[None],
                "position_ids": torch.cat([torch.arange(n) for n in lengths])[None], "pixel_values": pixels}
    width = max(lengths)
    ids = torch.zeros(3, width, dtype=torch.long)
    lab = torch.full((3, width), -100)
    mask = torch.zeros(3, width, dtype=torch.long)
    for i, (r, label) in enumerate(zip(rows, labels)):
        ids[i, : len(r)], lab[i, : len(r)], mask[i, : len(r)] = r, label, 1
    return {"input_ids": ids, "labels": lab, "attention_mask": mask, "pixel_values": pixels}


def _loss_and_gradients(model, batch, **forward):
    model.zero_grad(set_to_none=True)
    outputs = model(**batch, **forward)
    outputs.loss.backward()
    return outputs, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("padding_free", [False, True], ids=["padded", "padding-free"])
@pytest.mark.parametrize("gwc", [True, False], ids=["gwc", "no-gwc"])
def test_the_models_forward_trains_as_the_full_path(tiny_model_dir, padding_free, gwc):
    model = LlavaNormAlignedForConditionalGeneration.from_pretrained(tiny_model_dir).train()
    model.get_projector_norm().compensation = gwc
    model.config._attn_implementation = "sdpa"
    batch = _llava_batch(model, padding_free)
    assert model.config.loss_at_labels_only  # the default
    compact, compact_grads = _loss_and_gradients(model, batch)
    model.config.loss_at_labels_only = False
    full, full_grads = _loss_and_gradients(model, batch)
    assert compact.logits is None and full.logits.shape[-1] == model.config.text_config.vocab_size
    torch.testing.assert_close(compact.loss, full.loss, rtol=1e-6, atol=1e-6)
    _assert_same_gradients(compact_grads, full_grads)
    assert {n for n in compact_grads if "vision_tower" in n} and "model.multi_modal_projector.norm.weight" in \
        compact_grads  # the vision tower and the norm are among the parameters compared


def test_return_dict_false_gives_the_tuple(tiny_model_dir):
    model = LlavaNormAlignedForConditionalGeneration.from_pretrained(tiny_model_dir).train()
    batch = _llava_batch(model, padding_free=False)
    as_tuple = model(**batch, return_dict=False)
    as_output = model(**batch)
    assert isinstance(as_tuple, tuple) and torch.equal(as_tuple[0], as_output.loss)  # (loss, ...) without logits
    model.config.return_dict = False
    assert isinstance(model(**batch), tuple)


def test_evaluation_and_generation_keep_the_full_logits(tiny_model_dir):
    model = LlavaNormAlignedForConditionalGeneration.from_pretrained(tiny_model_dir)
    batch = _llava_batch(model, padding_free=False)
    model.eval()
    with torch.no_grad():
        evaluated = model(**batch)
    assert evaluated.logits.shape == (*batch["input_ids"].shape, model.config.text_config.vocab_size)
    model.train()
    without_labels = model(**{k: v for k, v in batch.items() if k != "labels"})
    assert without_labels.logits is not None and without_labels.loss is None


# ----------------------------------------------------------------------------------------- train: TRL's fused head


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_llava_dataset(tmp_path_factory.mktemp("loss_at_labels"), n_rows=6, text_only=1)


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory, tiny_model_dir):
    """family -> a folder train takes: our model, and each aligned family whose processor loads here."""
    root = tmp_path_factory.mktemp("loss_families")
    made = {"llava_normaligned": tiny_model_dir}
    for family in TRAINS_WITHOUT_TORCHVISION:
        stock = save_tiny_vlm(family, str(root / "stock" / family))
        made[family] = str(root / "aligned" / family)
        assert cli_main(["align", stock, "--output-dir", made[family]]) == 0
    return made


def _fused_outputs_and_gradients(model, batch, compacted: bool):
    model.zero_grad(set_to_none=True)
    if compacted:
        with fused_head_compacted_on_cpu():
            outputs = model(**batch, fused_lm_head=True)
    else:
        outputs = model(**batch, fused_lm_head=True)
    outputs.loss.backward()
    return outputs, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("padding_free", [False, True], ids=["padded", "padding-free"])
@pytest.mark.parametrize("family", ["llava_normaligned", *TRAINS_WITHOUT_TORCHVISION])
def test_trls_fused_head_compacted_on_the_cpu_trains_as_before(family, padding_free, family_dirs, data):
    """What ``train`` runs: TRL's fused LM head (``SFTTrainer`` installs it) on the real collator's batch, with the
    positions compacted (``compat.fused_head_compacted_on_cpu``) and without: the same loss, entropy, top-1 hits
    and gradients."""
    from trl.trainer.utils import add_fused_lm_head

    from llava_normaligned.families.anatomy import anatomy_of
    from llava_normaligned.trainer.collator import LlavaTrainingCollator
    from llava_normaligned.trainer.data import load_llava_json
    from llava_normaligned.trainer.padding_free import check_padding_free, multimodal_positions
    from llava_normaligned.trainer.preprocess import prepare_dataset

    model, processor = load_model(family_dirs[family], for_training=True)
    if padding_free:
        try:
            check_padding_free(model)
        except ValueError as refused:
            pytest.skip(f"train refuses padding-free for {family}: {refused}")
    rows, _ = prepare_dataset(load_llava_json(*data), processor, max_length=None)
    collator = LlavaTrainingCollator(processor, images_per_text=anatomy_of(model).family.images_per_text,
                                     padding_free=padding_free)
    batch = collator([rows[0], rows[1], rows[len(rows) - 1]])  # the last row is text-only
    batch = {k: v for k, v in batch.items() if not k.startswith("_")}
    if padding_free:
        batch = multimodal_positions(model, batch)  # what train adds for multimodal RoPE (a no-op for 1-D RoPE)
    for param in model.parameters():
        param.requires_grad_(True)
    model.train()
    add_fused_lm_head(model, outputs=("log_probs", "entropy", "is_top1"))
    compact, compact_grads = _fused_outputs_and_gradients(model, batch, compacted=True)
    full, full_grads = _fused_outputs_and_gradients(model, batch, compacted=False)
    torch.testing.assert_close(compact.loss, full.loss, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(compact.log_probs, full.log_probs, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(compact.entropy, full.entropy, rtol=1e-5, atol=1e-6)
    assert torch.equal(compact.is_top1, full.is_top1) and torch.equal(compact.label_mask, full.label_mask)
    _assert_same_gradients(compact_grads, full_grads)


def test_the_compaction_is_undone_after_the_context():
    from trl.trainer import utils

    cpu = torch.device("cpu")
    before = utils._use_triton(cpu)
    with fused_head_compacted_on_cpu():
        assert utils._use_triton(cpu) is True
    assert utils._use_triton(cpu) == before is False  # a stock SFTTrainer in the same process is left as it was


NEEDS_TORCHVISION_TO_TRAIN = ("mistral3",)


@pytest.mark.parametrize("family", NEEDS_TORCHVISION_TO_TRAIN)
def test_the_compaction_trains_as_before_for_the_families_whose_train_processor_needs_torchvision(
        family, tmp_path, monkeypatch):
    """The family ``train`` takes where torchvision imports (Mistral3): its aligned
    model with TRL's fused head, compacted and not, on a padded batch of two rows of different lengths made by the
    family's processor built without torchvision (``load_model``'s): the same loss, metrics and gradients, and the
    compacted head scores the labelled positions only."""
    from PIL import Image
    from trl.trainer import utils as trl_utils
    from trl.trainer.utils import add_fused_lm_head

    from llava_normaligned.align import SUPPORTED_MODEL_TYPES

    assert set(NEEDS_TORCHVISION_TO_TRAIN) == set(SUPPORTED_MODEL_TYPES) - set(TRAINS_WITHOUT_TORCHVISION)
    stock = save_tiny_vlm(family, str(tmp_path / "stock"))
    assert cli_main(["align", stock, "--output-dir", str(tmp_path / "aligned")]) == 0
    model, processor = load_model(str(tmp_path / "aligned"))
    image = Image.new("RGB", (64, 48), (200, 30, 30))
    texts = [processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]},
         {"role": "assistant", "content": [{"type": "text", "text": answer}]}], tokenize=False)
        for answer in ("A red circle.", "A blue square at the top left of the picture.")]
    batch = dict(processor(text=texts, images=[image, image], return_tensors="pt", padding=True))
    labels = batch["input_ids"].clone()
    labels[:, :-8] = -100  # the answers and the template's end
    labels[batch["attention_mask"] == 0] = -100
    batch["labels"] = labels
    model.train()
    for param in model.parameters():
        param.requires_grad_(True)
    add_fused_lm_head(model, outputs=("log_probs", "entropy", "is_top1"))
    rows = []
    original = trl_utils._ChunkedLogProbFunction.apply
    monkeypatch.setattr(trl_utils._ChunkedLogProbFunction, "apply",
                        lambda hidden, *args: rows.append(hidden.shape[0]) or original(hidden, *args))
    compact, compact_grads = _fused_outputs_and_gradients(model, batch, compacted=True)
    full, full_grads = _fused_outputs_and_gradients(model, batch, compacted=False)
    assert rows[0] < rows[1] == batch["input_ids"].numel() - 2  # labelled positions only, then every shifted one
    torch.testing.assert_close(compact.loss, full.loss, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(compact.entropy, full.entropy, rtol=1e-5, atol=1e-6)
    assert torch.equal(compact.is_top1, full.is_top1)
    _assert_same_gradients(compact_grads, full_grads)
