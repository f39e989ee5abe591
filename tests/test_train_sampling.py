"""Length grouping (``--train_sampling_strategy group_by_length | group_by_modality_length``): every row once per
epoch, deterministic per seed and epoch, one modality per optimizer step, micro-batches of neighbours in length,
each rank's share of a step dealt as accelerate deals it, and a resumed run sees the uninterrupted run's rows."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from llava_normaligned.trainer.sampling import LengthGroupedOrder, grouped_order_for, padding_fraction
from tests.support.training import cpu_config, write_llava_dataset


def mix_like_lengths(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(lengths, has_image) shaped like llava_v1_5_mix665k at 729 image tokens a row: image rows of 1-5 turns
    (short VQA answers to long descriptions), ~6% text-only conversations with a long tail."""
    rng = np.random.default_rng(seed)
    has_image = rng.random(n) >= 0.06
    turns = rng.integers(1, 6, n)
    text = (turns * rng.lognormal(3.3, 0.8, n)).astype(np.int64) + 20
    tail = rng.random(n) < 0.1
    text[tail] *= rng.integers(2, 5, int(tail.sum()))
    lengths = np.where(has_image, 729 + text, 2 * text)
    return np.minimum(lengths, 4096), has_image


def test_every_row_once_and_the_same_order_for_the_same_seed_and_epoch():
    lengths, has_image = mix_like_lengths(1000)
    order = LengthGroupedOrder(lengths, has_image, micro_batch=4, accumulation=4, seed=3)
    first = order.order()
    assert sorted(first.tolist()) == list(range(1000))
    assert np.array_equal(first, LengthGroupedOrder(lengths, has_image, micro_batch=4, accumulation=4,
                                                    seed=3).order())
    order.set_epoch(1)
    second = order.order()
    assert sorted(second.tolist()) == list(range(1000)) and not np.array_equal(first, second)
    other_seed = LengthGroupedOrder(lengths, has_image, micro_batch=4, accumulation=4, seed=4).order()
    assert not np.array_equal(first, other_seed)
    assert list(iter(order)) == second.tolist() and len(order) == 1000


def test_each_step_is_one_modality_drawn_at_random_with_micro_batches_of_neighbours():
    lengths, has_image = mix_like_lengths(3000)
    order = LengthGroupedOrder(lengths, has_image, micro_batch=8, world_size=2, accumulation=8, seed=0)
    rows = order.order()
    per_step = order.rows_per_step  # 128, the paper's stage-2 global batch
    # whole steps of each modality, then the leftover rows of both
    whole = int(has_image.sum()) // per_step + int((~has_image).sum()) // per_step
    means, kinds = [], []
    for s in range(whole):
        step = rows[s * per_step:(s + 1) * per_step]
        assert len(set(has_image[step].tolist())) == 1, f"step {s} mixes image and text-only rows"
        kinds.append(bool(has_image[step[0]]))
        # the step's micro-batches are consecutive slices of its rows sorted by length, whatever rank holds them:
        # taken longest first, each one's shortest row is at least the next one's longest
        micro = sorted((lengths[m] for m in step.reshape(-1, 8)), key=lambda m: -m.max())
        assert all(a.min() >= b.max() for a, b in zip(micro, micro[1:])), f"step {s}"
        means.append(lengths[step].mean())
    assert sum(not k for k in kinds) >= 1 and sum(kinds) > 10
    # the steps come in random order, not sorted by length
    image_means = [m for m, k in zip(means, kinds) if k]
    assert image_means != sorted(image_means) and image_means != sorted(image_means, reverse=True)
    # which rows share a step is random: two seeds put row 0's step-mates apart
    other = LengthGroupedOrder(lengths, has_image, micro_batch=8, world_size=2, accumulation=8, seed=1).order()

    def mates(order_rows, row):
        at = int(np.flatnonzero(order_rows == row)[0]) // per_step
        return set(order_rows[at * per_step:(at + 1) * per_step].tolist())

    assert len(mates(rows, 0) & mates(other, 0)) < per_step // 2


def test_grouping_removes_most_of_the_padding():
    lengths, has_image = mix_like_lengths(20000)
    random_order = np.random.default_rng(0).permutation(len(lengths))
    grouped = LengthGroupedOrder(lengths, has_image, micro_batch=8, accumulation=16, seed=0).order()
    by_length = LengthGroupedOrder(lengths, None, micro_batch=8, accumulation=16,
                                   steps_per_group=50).order()
    padded_random = padding_fraction(lengths, random_order, 8)
    assert padded_random > 0.15
    assert padding_fraction(lengths, grouped, 8) < padded_random / 3
    assert padding_fraction(lengths, by_length, 8) < padding_fraction(lengths, grouped, 8)


@pytest.mark.parametrize("world,accumulation", [(2, 2), (4, 1), (3, 2)])
def test_each_rank_gets_its_share_of_every_step_as_accelerate_deals_it(world, accumulation):
    from accelerate.data_loader import BatchSamplerShard

    lengths, has_image = mix_like_lengths(600)
    micro = 4
    order = LengthGroupedOrder(lengths, has_image, micro_batch=micro, world_size=world, accumulation=accumulation,
                               seed=0)
    batches = torch.utils.data.BatchSampler(order, batch_size=micro, drop_last=False)
    ranks = [list(BatchSamplerShard(batches, num_processes=world, process_index=r, split_batches=False,
                                    even_batches=True)) for r in range(world)]
    per_step = order.rows_per_step
    rows = order.order()
    steps = int(has_image.sum()) // per_step + int((~has_image).sum()) // per_step
    for s in range(steps):
        # rank r's s-th optimizer step: its micro-batches s * accumulation ... (s + 1) * accumulation - 1
        shares = [np.concatenate(ranks[r][s * accumulation:(s + 1) * accumulation]) for r in range(world)]
        assert sorted(np.concatenate(shares).tolist()) == sorted(rows[s * per_step:(s + 1) * per_step].tolist())
        assert len({bool(x) for share in shares for x in has_image[share]}) == 1
        tokens = [int(lengths[share].sum()) for share in shares]
        biggest_batch = max(int(lengths[b].sum()) for r in range(world)
                            for b in ranks[r][s * accumulation:(s + 1) * accumulation])
        # the snake deal: the ranks' token counts differ by at most one micro-batch
        assert max(tokens) - min(tokens) <= biggest_batch


def test_the_strategies_read_the_prepared_lengths(tiny_model_dir, tiny_processor, tmp_path):
    from llava_normaligned.commands.train import parse_train_args
    from llava_normaligned.trainer.data import load_llava_json
    from llava_normaligned.trainer.preprocess import prepare_dataset

    path, images = write_llava_dataset(tmp_path / "data", n_rows=8, text_only=3)
    prepared, _ = prepare_dataset(load_llava_json(path, images), tiny_processor, max_length=None)
    assert prepared["num_images"][:] == [1] * 8 + [0] * 3
    for strategy in ("group_by_length", "group_by_modality_length"):
        args = parse_train_args(["--stage", "2", "--model", tiny_model_dir, "--data-path", path,
                                 "--output-dir", str(tmp_path / "out"), "--train_sampling_strategy",
                                 strategy, "--per_device_train_batch_size", "2"]).sft_args
        sampler = grouped_order_for(prepared, args)
        assert np.array_equal(sampler.lengths, np.asarray(prepared["num_tokens"][:]))
        assert (sampler.has_image is None) == (strategy == "group_by_length")
        assert sampler.steps_per_group == (50 if strategy == "group_by_length" else 1)
    assert grouped_order_for(prepared, cpu_config(tmp_path / "o")) is None  # random: transformers' own sampler
    with pytest.raises(ValueError, match="group_by_modality_length.*num_images"):
        grouped_order_for(prepared.remove_columns(["num_images"]),
                          cpu_config(tmp_path / "o", train_sampling_strategy="group_by_modality_length"))


class _Recording:
    """The trainer's collator, recording the row ids of every batch it makes."""

    def __init__(self, collator):
        self.collator, self.ids = collator, []

    def __getattr__(self, name):
        return getattr(self.collator, name)

    def __call__(self, rows):
        self.ids.append([row["id"] for row in rows])
        return self.collator(rows)


def test_a_resumed_run_sees_the_rows_of_the_uninterrupted_run(tiny_model_dir, tiny_processor, tmp_path):
    """Over two epochs (the resume falls in the second), with gradient accumulation and padding-free batches."""
    from llava_normaligned.trainer.data import load_llava_json
    from llava_normaligned.trainer.train import StageConfig, prepare_stage, run_stage
    from modeling_llava_normaligned import LlavaNormAlignedForConditionalGeneration
    from tests.support.training import StopAfter

    path, images = write_llava_dataset(tmp_path / "data", n_rows=12, text_only=4, multi_turn_every=2)
    dataset = load_llava_json(path, images)

    def run(output_dir, callbacks=None, **overrides):
        model = LlavaNormAlignedForConditionalGeneration.from_pretrained(tiny_model_dir)
        args = cpu_config(output_dir, max_steps=6, per_device_train_batch_size=2, gradient_accumulation_steps=2,
                          train_sampling_strategy="group_by_modality_length", padding_free=True, **overrides)
        prepared = prepare_stage(model, tiny_processor, dataset, args=args, stage=StageConfig(2),
                                 callbacks=callbacks)
        prepared.trainer.data_collator = recorder = _Recording(prepared.trainer.data_collator)
        return run_stage(prepared), recorder.ids

    # 16 rows, 4 a step: an epoch is 3 image steps and 1 text-only step, so steps 5 and 6 are in the second epoch
    straight, seen = run(tmp_path / "straight")
    assert len(seen) == 13  # 6 steps x 2 micro-batches, and the one accelerate's loader fetches ahead
    steps = [seen[2 * k] + seen[2 * k + 1] for k in range(6)]
    assert sorted(sum(steps[:4], [])) == sorted(row["id"] for row in dataset)  # the first epoch: every row once
    assert steps[4:] != steps[:2]  # the second epoch is ordered anew
    for ids in steps:
        assert len({i.startswith("img-") for i in ids}) == 1, ids  # one modality a step
    run(tmp_path / "resumed", callbacks=[StopAfter(5)], save_strategy="steps", save_steps=5)
    resumed, seen_after = run(tmp_path / "resumed", resume_from_checkpoint=str(tmp_path / "resumed" / "checkpoint-5"))
    assert seen_after == seen[10:]
    for name, param in resumed.model.named_parameters():
        torch.testing.assert_close(param, dict(straight.model.named_parameters())[name], rtol=0, atol=1e-6,
                                   msg=name)


def _prepared_like(n: int):
    """Prepared-row columns of ``n`` rows laid out as ``prepare_dataset`` leaves them: many Arrow chunks (its map
    writes 256 rows at a time) under a ``select`` indices mapping (its length filter)."""
    import datasets
    import pyarrow as pa

    lengths, has_image = mix_like_lengths(n)
    table = pa.table({"num_tokens": lengths, "num_images": has_image.astype(np.int64)})
    rows = datasets.Dataset(pa.Table.from_batches(table.to_batches(max_chunksize=256)))
    return rows.select(np.flatnonzero(lengths < 4096))


def test_the_order_of_a_mix665k_sized_epoch_is_built_in_seconds_and_grows_linearly(tmp_path):
    """Reading the prepared lengths and building the order (at every epoch and resume) at 66,530 and 665,298 rows:
    one Arrow read, then numpy; the time grows with the rows, not faster."""
    import datasets

    datasets.disable_progress_bars()
    args = cpu_config(tmp_path, train_sampling_strategy="group_by_modality_length", per_device_train_batch_size=4,
                      gradient_accumulation_steps=4)
    timings = {}
    for n in (66_530, 665_298):
        rows = _prepared_like(n)
        best = float("inf")
        for _ in range(2):
            start = time.perf_counter()
            grouped_order_for(rows, args).order()
            best = min(best, time.perf_counter() - start)
        timings[n] = best
    assert timings[665_298] / timings[66_530] < 20, timings  # 10x the rows
    assert timings[665_298] < 5, timings  # measured 0.5 s
