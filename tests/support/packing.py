"""Helpers of the padding-free parity tests (no tests here): the same rows collated padded and packed by the real
collator, a forward-backward, and the agreement of two runs' gradients per parameter group."""

from __future__ import annotations

import torch

from llava_normaligned.families.anatomy import anatomy_of
from llava_normaligned.part_metrics import part_parameters
from llava_normaligned.trainer.collator import LlavaTrainingCollator
from llava_normaligned.trainer.data import load_llava_json
from llava_normaligned.trainer.preprocess import prepare_dataset


VARLEN = "varlen_rows_stand_in"


def varlen_stand_in_attention(module, query, key, value, attention_mask, dropout: float = 0.0,
                              scaling: float | None = None, is_causal: bool | None = None, **kwargs):
    """Flash attention's variable-length path as a CPU can run it: the rows are those transformers' flash attention
    finds in the ``position_ids`` the layer receives (``compat.flash_varlen_rows``: its own test and cu_seqlens),
    each attended alone by sdpa (``is_causal``); without packed rows, sdpa on the batch as it is."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from llava_normaligned.compat import flash_varlen_rows

    rows = None
    if attention_mask is None and kwargs.get("position_ids") is not None:
        rows = flash_varlen_rows(kwargs["position_ids"], query.shape[0])
    if rows is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    outputs = [sdpa_attention_forward(module, query[:, :, a:b], key[:, :, a:b], value[:, :, a:b], None,
                                      dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs)[0]
               for a, b in rows]
    return torch.cat(outputs, dim=1), None


def _varlen_stand_in_mask(*args, attention_mask=None, **kwargs):
    """No mask for a batch without padding, as flash attention gets (it then reads the rows from the positions);
    sdpa's mask for a padded batch (the reference the packed one is compared with)."""
    from transformers.masking_utils import sdpa_mask

    return None if attention_mask is None else sdpa_mask(*args, attention_mask=attention_mask, **kwargs)


def use_varlen_stand_in(model) -> None:
    """Switch ``model``'s LLM to ``VARLEN``, registered with transformers' attention and mask interfaces."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(VARLEN, varlen_stand_in_attention)
    AttentionMaskInterface.register(VARLEN, _varlen_stand_in_mask)
    model.set_attn_implementation({"text_config": VARLEN})


def set_attention(model, attn: str) -> None:
    """The LLM's attention for a parity test: ``VARLEN`` (the stand-in above), ``PACKED_SDPA`` (sdpa, switched to
    row by row by ``packed_attention`` around the packed forward) or a transformers implementation."""
    from llava_normaligned.trainer.padding_free import PACKED_SDPA

    if attn == VARLEN:
        use_varlen_stand_in(model)
    else:
        model.set_attn_implementation({"text_config": "sdpa" if attn == PACKED_SDPA else attn})


def padded_and_packed(model, processor, data) -> tuple[dict, dict]:
    """Four prepared rows of ``data`` (a ``write_llava_dataset`` pair), a text-only one among image rows, collated
    padded and packed."""
    rows, _ = prepare_dataset(load_llava_json(*data), processor, max_length=None)
    chosen = [rows[0], rows[1], rows[len(rows) - 1], rows[2]]
    images_per_text = anatomy_of(model).family.images_per_text
    padded = LlavaTrainingCollator(processor, images_per_text=images_per_text)(chosen)
    packed = LlavaTrainingCollator(processor, images_per_text=images_per_text, padding_free=True)(chosen)

    def strip(batch):
        return {k: v for k, v in batch.items() if not k.startswith("_")}

    return strip(padded), strip(packed)


def loss_and_grads(model, batch: dict) -> tuple[torch.Tensor, dict]:
    model.zero_grad(set_to_none=True)
    loss = model(**batch).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def group_agreement(model, got: dict, want: dict) -> dict[str, tuple[float, float]]:
    """Per parameter group (vision tower, projector, its norm, LLM): (cosine, relative difference) of the
    concatenated gradients of ``got`` against ``want``."""
    out = {}
    for part, params in part_parameters(model).items():
        names = [n for n, _ in params if n in want]
        if not names:
            continue
        a = torch.cat([got[n].flatten() for n in names]).double()
        b = torch.cat([want[n].flatten() for n in names]).double()
        out[part] = ((a @ b / (a.norm() * b.norm())).item(), ((a - b).norm() / b.norm()).item())
    return out


def aligned_folders(root, families) -> dict[str, str]:
    """family -> the folder `align` (through the CLI) wrote from a tiny stock model of that family; the stock folders
    under ``root/stock``, as ``stock_<family>`` in the result."""
    import os

    from llava_normaligned.cli import main as cli_main
    from llava_normaligned.tiny import save_tiny_vlm

    made = {}
    for family in families:
        made[f"stock_{family}"] = save_tiny_vlm(family, os.path.join(str(root), "stock", family))
        made[family] = os.path.join(str(root), "aligned", family)
        assert cli_main(["align", made[f"stock_{family}"], "--output-dir", made[family]]) == 0
    return made


def assert_packed_trains_as_padded(model, padded: dict, packed: dict, row_by_row: bool, parts=()) -> dict:
    """The packed batch's loss and every parameter group's gradient equal the padded batch's (loss within 1e-5,
    each group's cosine above 1 - 1e-9 and relative difference below 1e-5); ``row_by_row``: the packed forward runs
    under ``packed_attention`` (the row-by-row sdpa). ``parts``: groups that must be among those compared. Returns
    the agreement."""
    from llava_normaligned.trainer.padding_free import packed_attention

    for param in model.parameters():
        param.requires_grad_(True)
    model.train()
    loss_padded, grads_padded = loss_and_grads(model, padded)
    with packed_attention(model, enabled=row_by_row):
        loss_packed, grads_packed = loss_and_grads(model, packed)
    torch.testing.assert_close(loss_packed, loss_padded, rtol=1e-5, atol=1e-6)
    agreement = group_agreement(model, grads_packed, grads_padded)
    assert set(parts) <= set(agreement), agreement
    for part, (cosine, relative) in agreement.items():
        assert cosine > 1 - 1e-9 and relative < 1e-5, (part, cosine, relative)
    return agreement
