"""The clip coefficient and the update size ||delta theta|| / ||theta|| that the norm tracking logs per part, checked
against a one-step run of the real trainer with plain SGD (where the step is lr * coefficient * gradient, so both
are known by hand), and the per-part clipping rule (``StageConfig.clip_per_part``)."""

from __future__ import annotations

import math

import pytest
import torch

from llava_normaligned.part_metrics import clip_coefficient, part_parameters
from llava_normaligned.trainer.data import load_llava_json
from llava_normaligned.trainer.train import StageConfig, clip_parts, train_stage
from tests.support.training import cpu_config, snapshot, write_llava_dataset

LR = 0.05


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    path, images = write_llava_dataset(tmp_path_factory.mktemp("norm_logging_data"), n_rows=8, text_only=0)
    return load_llava_json(path, images)


def test_clip_coefficient_is_torchs_rule():
    assert clip_coefficient(5.0, 1.0) == pytest.approx(1 / (5 + 1e-6), rel=1e-12)
    assert clip_coefficient(0.5, 1.0) == 1.0
    assert clip_coefficient(5.0, None) == 1.0 and clip_coefficient(5.0, 0.0) == 1.0
    # the same factor torch applies
    grads = [torch.full((3,), 2.0), torch.full((4,), -1.0)]
    params = [torch.zeros(3, requires_grad=True), torch.zeros(4, requires_grad=True)]
    for p, g in zip(params, grads):
        p.grad = g.clone()
    total = float(torch.nn.utils.clip_grad_norm_(params, 0.7))
    assert float(params[0].grad[0]) == pytest.approx(2.0 * clip_coefficient(total, 0.7), rel=1e-6)


def _part_norms(before: dict, model) -> dict[str, float]:
    """||theta_before|| and ||theta_after - theta_before|| per part, computed from the snapshots."""
    sizes, moved = {}, {}
    for part, params in part_parameters(model).items():
        named = [(n, p) for n, p in params if p.requires_grad]
        if named:
            sizes[part] = math.sqrt(sum(float(before[n].pow(2).sum()) for n, _ in named))
            moved[part] = math.sqrt(sum(float((p.detach() - before[n]).pow(2).sum()) for n, p in named))
    return sizes, moved


def _one_sgd_step(model, processor, dataset, tmp_path, **stage):
    before = snapshot(model)
    args = cpu_config(tmp_path, max_steps=1, optim="sgd", learning_rate=LR, lr_scheduler_type="constant",
                      warmup_steps=0, weight_decay=0.0, max_grad_norm=0.05)
    result = train_stage(model, processor, dataset, stage=StageConfig(2, **stage), args=args)
    entry = next(e for e in result.trainer.state.log_history if "loss" in e and e.get("step") == 1)
    return before, result, entry


def test_clip_coefficient_and_update_size_match_a_hand_made_sgd_step(tiny_model, tiny_processor, dataset, tmp_path):
    before, result, entry = _one_sgd_step(tiny_model, tiny_processor, dataset, tmp_path / "global")
    model = result.model
    parts = ("vision_tower", "projector", "projector_norm", "llm")
    pre = {p: entry[f"grad_norm/{p}"] for p in parts}
    total = math.sqrt(sum(v * v for v in pre.values()))
    assert entry["grad_norm"] == pytest.approx(total, rel=1e-4)
    coefficient = 0.05 / (total + 1e-6)
    assert coefficient < 0.5  # clipping was active
    assert entry["norm/clip_coef"] == pytest.approx(coefficient, rel=1e-4)
    sizes, moved = _part_norms(before, model)
    for part in parts:
        # SGD: delta = -lr * c * g, so ||delta|| = lr * c * ||g_part||
        assert moved[part] == pytest.approx(LR * coefficient * pre[part], rel=1e-3), part
        assert entry[f"norm/update_size/{part}"] == pytest.approx(moved[part] / sizes[part], rel=1e-4), part
    # the records the demo reads carry them too
    record = next(r for r in result.norm_tracking if r["step"] == 1)
    assert record["clip_coef"] == entry["norm/clip_coef"] and record["grad_norm/llm"] == pre["llm"]


def test_clip_parts_rule(tiny_model):
    model = tiny_model
    wanted = {"vision_tower": 20.0, "projector": 0.2, "llm": 3.0}
    for part, params in part_parameters(model).items():
        for _, p in params:
            p.grad = torch.ones_like(p) if part in wanted else None
    for part, params in part_parameters(model).items():  # scale each part's gradient to its wanted norm
        if part in wanted:
            n = math.sqrt(sum(p.grad.numel() for _, p in params))
            for _, p in params:
                p.grad.mul_(wanted[part] / n)
    factors = clip_parts(model, wanted, 1.5)
    share = 1.5 / math.sqrt(3)
    assert factors == pytest.approx({"vision_tower": share / (20 + 1e-6), "projector": 1.0, "llm": share / (3 + 1e-6)})
    after = {part: math.sqrt(sum(float(p.grad.pow(2).sum()) for _, p in params))
             for part, params in part_parameters(model).items() if part in wanted}
    assert after == pytest.approx({"vision_tower": share, "projector": 0.2, "llm": share}, rel=1e-5)
    assert math.sqrt(sum(v * v for v in after.values())) <= 1.5  # the global clipping that follows is a no-op
    assert clip_parts(model, wanted, None) == {p: 1.0 for p in wanted}


def test_per_part_clipping_in_the_trainer(tiny_model, tiny_processor, dataset, tmp_path):
    before, result, entry = _one_sgd_step(tiny_model, tiny_processor, dataset, tmp_path / "parts", clip_per_part=True)
    parts = ("vision_tower", "projector", "projector_norm", "llm")
    pre = {p: entry[f"grad_norm/{p}"] for p in parts}
    share = 0.05 / 2.0  # four parts
    sizes, moved = _part_norms(before, result.model)
    for part in parts:
        factor = min(1.0, share / (pre[part] + 1e-6))
        assert entry[f"clip_coef/{part}"] == pytest.approx(factor, rel=1e-6)
        assert moved[part] == pytest.approx(LR * factor * pre[part], rel=1e-3), part
    record = next(r for r in result.norm_tracking if r["step"] == 1)
    assert record["clip_coef/llm"] == entry["clip_coef/llm"]  # in the records the demo reads
    assert entry["grad_norm"] <= 0.05 * (1 + 1e-5) and entry["norm/clip_coef"] == pytest.approx(1.0, rel=1e-4)
