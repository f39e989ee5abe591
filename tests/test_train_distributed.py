"""Two-process DDP over gloo on the CPU (torchrun), as TRL runs by default (gradient checkpointing on), with a
text-only row on one process at every step: both ranks train and end with identical weights; the images are
checked and the rows rendered once, by the main process, and shared."""

from __future__ import annotations

import os
import textwrap

import torch

from tests.support.distributed import torchrun
from tests.support.training import write_llava_dataset

RANK_SCRIPT = textwrap.dedent('''
    import json, os, sys
    import torch, torch.distributed as dist
    from transformers import AutoProcessor
    from trl import SFTConfig
    from modeling_llava_normaligned import LlavaNormAlignedForConditionalGeneration
    from llava_normaligned.trainer.data import load_llava_json
    from llava_normaligned.trainer.train import StageConfig, shared_image_checker, train_stage

    model_dir, data, images, out = sys.argv[1:5]
    # one row per process and step over two rows, one of them text-only: at every step one process gives the vision
    # tower and the projector no gradient, under gradient checkpointing (TRL's default)
    args = SFTConfig(output_dir=out, use_cpu=True, bf16=False, report_to=[], gradient_checkpointing=True,
                     max_steps=3, per_device_train_batch_size=1, logging_steps=1, save_strategy="no",
                     learning_rate=1e-3, seed=0, disable_tqdm=True)
    dataset, report = load_llava_json(data, images, return_report=True, image_checker=shared_image_checker(args))
    model = LlavaNormAlignedForConditionalGeneration.from_pretrained(model_dir)
    result = train_stage(model, AutoProcessor.from_pretrained(model_dir), dataset, args=args,
                         stage=StageConfig(2, lr_vision=2e-4), data_report=report)
    rank = dist.get_rank()
    torch.save({n: p.detach() for n, p in result.model.named_parameters()}, os.path.join(out, f"rank{rank}.pt"))
    with open(os.path.join(out, f"rank{rank}.json"), "w") as handle:
        json.dump({"rank": rank, "world_size": dist.get_world_size(), "backend": dist.get_backend(),
                   "pid": os.getpid(), "parallel_mode": str(args.parallel_mode),
                   "find_unused": result.trainer.args.ddp_find_unused_parameters,  # set on train_stage's copy
                   "images_checked_here": report.images_checked_here,
                   "prepare": result.summary["data"]["prepare"]}, handle)
''')






def test_two_process_ddp_on_cpu_ends_with_identical_weights(tiny_model_dir, tmp_path):
    from safetensors.torch import load_file

    path, images = write_llava_dataset(tmp_path / "data", n_rows=1, text_only=1, multi_turn_every=0)
    ranks = torchrun(RANK_SCRIPT, tmp_path, tiny_model_dir, path, images)
    out = tmp_path / "out"
    assert [r["rank"] for r in ranks] == [0, 1] and ranks[0]["pid"] != ranks[1]["pid"]
    assert all(r["world_size"] == 2 and r["backend"] == "gloo" and r["parallel_mode"] == "ParallelMode.DISTRIBUTED"
               for r in ranks)
    assert all(r["find_unused"] is True and r["prepare"]["text_only_rows"] == 1 for r in ranks)
    # the one image was opened by the main process only; the rows were rendered there and read from its file
    assert [r["images_checked_here"] for r in ranks] == [1, 0]
    assert [r["prepare"]["read_from_cache"] for r in ranks] == [False, True]
    cache_file = ranks[0]["prepare"]["cache_file"]  # by its own name: the summary names no local path
    assert ranks[1]["prepare"]["cache_file"] == cache_file
    assert len(list((tmp_path / "datasets_cache").rglob(cache_file))) == 1  # one file, in the shared cache
    w0, w1 = torch.load(out / "rank0.pt"), torch.load(out / "rank1.pt")
    assert w0.keys() == w1.keys()
    for name in w0:
        assert torch.equal(w0[name], w1[name]), name
    initial = load_file(os.path.join(tiny_model_dir, "model.safetensors"))
    moved = [n for n in w0 if n in initial and not torch.equal(initial[n], w0[n])]
    assert any("language_model" in n for n in moved) and any("multi_modal_projector" in n for n in moved)
    assert any("vision_tower" in n for n in moved)  # the image row's process trained it
    assert (out / "model.safetensors").exists()  # rank 0 saved the final model


GROUPED_RANK_SCRIPT = textwrap.dedent('''
    import json, os, sys
    import torch, torch.distributed as dist
    from transformers import AutoProcessor
    from trl import SFTConfig
    from modeling_llava_normaligned import LlavaNormAlignedForConditionalGeneration
    from llava_normaligned.trainer.data import load_llava_json
    from llava_normaligned.trainer.sampling import grouped_order_for
    from llava_normaligned.trainer.train import StageConfig, prepare_stage, run_stage, shared_image_checker

    model_dir, data, images, out = sys.argv[1:5]
    args = SFTConfig(output_dir=out, use_cpu=True, bf16=False, report_to=[], gradient_checkpointing=False,
                     max_steps=3, per_device_train_batch_size=2, gradient_accumulation_steps=2, logging_steps=1,
                     save_strategy="no", learning_rate=1e-3, seed=0, disable_tqdm=True, padding_free=True,
                     train_sampling_strategy="group_by_modality_length")
    dataset = load_llava_json(data, images, image_checker=shared_image_checker(args))
    model = LlavaNormAlignedForConditionalGeneration.from_pretrained(model_dir)
    prepared = prepare_stage(model, AutoProcessor.from_pretrained(model_dir), dataset, args=args,
                             stage=StageConfig(2))
    collator, seen = prepared.trainer.data_collator, []

    def recording(rows):
        seen.append([row["id"] for row in rows])
        return collator(rows)

    recording.padding_free = collator.padding_free
    prepared.trainer.data_collator = recording
    result = run_stage(prepared)
    rank = dist.get_rank()
    train_rows = result.trainer.train_dataset
    order = grouped_order_for(train_rows, result.trainer.args).order().tolist()
    torch.save({n: p.detach() for n, p in result.model.named_parameters()}, os.path.join(out, f"rank{rank}.pt"))
    with open(os.path.join(out, f"rank{rank}.json"), "w") as handle:
        json.dump({"seen": seen, "order": [train_rows[i]["id"] for i in order],
                   "padding_free": result.summary["training"]["padding_free"]}, handle)
''')


def test_two_process_ddp_deals_each_rank_its_share_of_every_grouped_step(tiny_model_dir, tmp_path):
    """``group_by_modality_length`` with padding-free batches under DDP: rank r's a-th micro-batch of step s is the
    one the order deals it (position ``(s x accumulation + a) x world + r``), every step holds one modality, and the
    ranks end with identical weights."""
    path, images = write_llava_dataset(tmp_path / "data", n_rows=16, text_only=8, multi_turn_every=2)
    ranks = torchrun(GROUPED_RANK_SCRIPT, tmp_path, tiny_model_dir, path, images)
    out = tmp_path / "out"
    order = ranks[0]["order"]
    assert ranks[1]["order"] == order and sorted(order) == sorted(
        [f"img-{i}" for i in range(16)] + [f"text-{i}" for i in range(8)])
    assert all(r["padding_free"] for r in ranks)
    world, accumulation, micro = 2, 2, 2
    for step in range(3):  # 24 rows, 8 a step: two image steps and one text-only step, in the order's sequence
        rows = []
        for rank in range(world):
            for a in range(accumulation):
                at = ((step * accumulation + a) * world + rank) * micro
                assert ranks[rank]["seen"][step * accumulation + a] == order[at:at + micro], (step, rank, a)
                rows += order[at:at + micro]
        assert len({row.startswith("img-") for row in rows}) == 1, rows
    assert {order[0].startswith("img-"), order[8].startswith("img-"), order[16].startswith("img-")} == {True, False}
    w0, w1 = torch.load(out / "rank0.pt"), torch.load(out / "rank1.pt")
    for name in w0:
        assert torch.equal(w0[name], w1[name]), name
