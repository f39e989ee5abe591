"""The order rows are trained in: length grouping, as LLaVA-1.5's recipe trains stage 2.

``--train_sampling_strategy`` takes transformers' own values and two that group rows by length with the token counts
the preparation already computed (``num_tokens``, images expanded; ``preprocess.py``), so nothing is tokenized again:

* ``group_by_modality_length`` (LLaVA-1.5's fine-tuning recipe, ``llava/train/llava_trainer.py``): rows with an
  image and text-only rows never share a batch; each optimizer step draws its rows uniformly at random from one
  modality, and within the step the rows are sorted by length and cut into micro-batches, so that rows of similar
  length share a micro-batch. The steps are then shuffled. Only the micro-batch composition inside a step changes:
  which rows an optimizer step sees is as random as under ``random``.
* ``group_by_length`` (transformers' ``LengthGroupedSampler``): rows of every modality, sorted by length within
  mega-batches of ``LENGTH_MEGA_BATCHES`` per-device batches x accumulation steps, then the steps are shuffled.

Both are deterministic given ``(seed, epoch)`` (a NumPy generator seeded with both; no global random state is read),
so a resumed run, which rebuilds the order and skips the batches already trained (transformers'
``skip_first_batches``), sees exactly the rows of the uninterrupted run. Under DDP, FSDP and DeepSpeed, accelerate
deals the per-device batches of this one global order round-robin to the processes (batch ``i`` to rank
``i % world``), so the order is laid out per optimizer step as ``[accumulation 0: rank 0, rank 1, ..., accumulation
1: rank 0, ...]``; within a step the micro-batches go to the ranks in a snake order (longest, ..., shortest, then
back), so that every rank's share of the step holds about the same number of tokens.
"""

from __future__ import annotations

import logging
import math

import numpy as np
import torch

from .preprocess import unindexed

logger = logging.getLogger(__name__)

GROUPED_STRATEGIES = ("group_by_length", "group_by_modality_length")
LENGTH_MEGA_BATCHES = 50  # transformers' LengthGroupedSampler: mega-batches of 50 batches


class LengthGroupedOrder(torch.utils.data.Sampler):
    """Row indices in length-grouped order (see the module docstring).

    Args:
        lengths: (N,) token count of each row, images expanded.
        has_image: (N,) whether each row has an image; ``None``: one modality (``group_by_length``).
        micro_batch: rows per device per forward pass (``per_device_train_batch_size``).
        world_size: processes.
        accumulation: gradient accumulation steps.
        steps_per_group: optimizer steps whose rows are sorted together (1: LLaVA's, each step on its own).
        seed: with the epoch (``set_epoch``), everything random here.
    """

    def __init__(self, lengths, has_image=None, *, micro_batch: int, world_size: int = 1, accumulation: int = 1,
                 steps_per_group: int = 1, seed: int = 0):
        self.lengths = np.asarray(lengths, dtype=np.int64)
        if self.lengths.ndim != 1:
            raise ValueError(f"lengths: expected one length per row, got shape {self.lengths.shape}")
        self.has_image = None if has_image is None else np.asarray(has_image, dtype=bool)
        if self.has_image is not None and self.has_image.shape != self.lengths.shape:
            raise ValueError(f"has_image: {self.has_image.shape[0]} flags for {len(self.lengths)} rows")
        for name, value in (("micro_batch", micro_batch), ("world_size", world_size), ("accumulation", accumulation),
                            ("steps_per_group", steps_per_group)):
            if int(value) < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
        self.micro_batch, self.world_size, self.accumulation = int(micro_batch), int(world_size), int(accumulation)
        self.steps_per_group = int(steps_per_group)
        self.seed = int(seed)
        self.epoch = 0

    @property
    def micro_batches_per_step(self) -> int:
        return self.world_size * self.accumulation

    @property
    def rows_per_step(self) -> int:
        return self.micro_batch * self.micro_batches_per_step

    def set_epoch(self, epoch: int) -> None:
        """Called by the Trainer (through accelerate) before each epoch: a new order per epoch."""
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return len(self.lengths)

    def __iter__(self):
        return iter(self.order().tolist())

    def order(self) -> np.ndarray:
        """(N,) every row index once, in training order, for the current epoch."""
        rng = np.random.default_rng([self.seed, self.epoch])
        groups = [np.arange(len(self.lengths))] if self.has_image is None else [
            np.flatnonzero(self.has_image), np.flatnonzero(~self.has_image)]
        steps, rest = [], []
        for rows in groups:
            rows = rows[rng.permutation(len(rows))]
            whole = len(rows) - len(rows) % self.rows_per_step
            for start in range(0, whole, self.rows_per_step * self.steps_per_group):
                steps += self._steps(rows[start:min(start + self.rows_per_step * self.steps_per_group, whole)])
            rest.append(rows[whole:])
        steps = [steps[i] for i in rng.permutation(len(steps))]
        # the rows of no whole step (fewer than one step's rows per modality): one last, mixed step, still grouped
        leftover = np.concatenate(rest)
        if len(leftover):
            steps.append(self._last_step(leftover))
        return np.concatenate(steps) if steps else np.zeros(0, dtype=np.int64)

    def _sorted(self, rows: np.ndarray) -> np.ndarray:
        return rows[np.argsort(-self.lengths[rows], kind="stable")]  # longest first; ties keep the random order

    def _steps(self, rows: np.ndarray) -> list[np.ndarray]:
        """Whole steps from rows sorted together: micro-batches of neighbours in length, each step's micro-batches
        dealt to the ranks."""
        micro = self._sorted(rows).reshape(-1, self.micro_batch)  # (micro-batches, B), longest first
        per_step = self.micro_batches_per_step
        return [self._in_rank_order(micro[i:i + per_step]) for i in range(0, len(micro), per_step)]

    def _in_rank_order(self, micro: np.ndarray) -> np.ndarray:
        """One step's micro-batches (longest first) in the order accelerate deals them: position ``a * world + r``
        is rank ``r``'s ``a``-th micro-batch. The ranks take them in a snake order (0, 1, ..., W-1, W-1, ..., 0, ...)
        so that each rank's share of the step is about as long as the others'."""
        order = np.empty(len(micro), dtype=np.int64)
        for k in range(len(micro)):
            a, r = divmod(k, self.world_size)
            rank = r if a % 2 == 0 else self.world_size - 1 - r
            order[a * self.world_size + rank] = k
        return micro[order].reshape(-1)

    def _last_step(self, rows: np.ndarray) -> np.ndarray:
        """The leftover rows (< one step per modality): image rows, then text-only rows, each sorted by length."""
        if self.has_image is None:
            return self._sorted(rows)
        return np.concatenate([self._sorted(rows[self.has_image[rows]]), self._sorted(rows[~self.has_image[rows]])])


def grouped_order_for(dataset, args) -> LengthGroupedOrder | None:
    """The sampler ``args.train_sampling_strategy`` asks for over a prepared dataset (``num_tokens``,
    ``num_images``), or ``None`` when it is none of ``GROUPED_STRATEGIES`` (transformers' own samplers then)."""
    strategy = args.train_sampling_strategy
    if strategy not in GROUPED_STRATEGIES:
        return None
    columns = {"num_tokens", "num_images"} if strategy == "group_by_modality_length" else {"num_tokens"}
    missing = columns - set(dataset.column_names)
    if missing:
        raise ValueError(f"train_sampling_strategy={strategy!r} needs the prepared rows' {sorted(missing)} column(s): "
                         "give the dataset through train_stage/prepare_stage, which computes them")
    # the whole columns as numpy, then the selected rows (milliseconds for 665K rows; datasets' numpy formatting of
    # 2,600 chunks under an indices mapping took 9.5 s, and a Column read row by row, minutes)
    base, rows = unindexed(dataset)
    lengths = base.data.column("num_tokens").to_numpy()[rows]
    has_image = base.data.column("num_images").to_numpy()[rows] > 0 if "num_images" in columns else None
    micro = args.per_device_train_batch_size
    steps = 1
    if strategy == "group_by_length":  # transformers' mega-batches: 50 x (per-device batch x accumulation) rows
        steps = max(1, math.ceil(LENGTH_MEGA_BATCHES / max(1, args.world_size)))
    sampler = LengthGroupedOrder(lengths, has_image, micro_batch=micro, world_size=max(1, args.world_size),
                                 accumulation=args.gradient_accumulation_steps, steps_per_group=steps,
                                 seed=args.data_seed if args.data_seed is not None else args.seed)
    logger.info("%s: %d rows%s, %d rows per optimizer step (%d per device x %d processes x %d accumulation), sorted "
                "by length within groups of %d step(s)", strategy, len(lengths),
                f" ({int(has_image.sum())} with an image, {int((~has_image).sum())} text-only)"
                if has_image is not None else "", sampler.rows_per_step, micro, sampler.world_size,
                sampler.accumulation, steps)
    return sampler


def padding_fraction(lengths, order, micro_batch: int) -> float:
    """Pad tokens over all tokens when the rows are batched ``micro_batch`` at a time in ``order``, each batch padded
    to its longest row."""
    lengths = np.asarray(lengths, dtype=np.int64)[np.asarray(order, dtype=np.int64)]
    padded = real = 0
    for start in range(0, len(lengths), micro_batch):
        batch = lengths[start:start + micro_batch]
        padded += int(batch.max()) * len(batch)
        real += int(batch.sum())
    return 1.0 - real / padded if padded else 0.0


__all__ = ["GROUPED_STRATEGIES", "LengthGroupedOrder", "grouped_order_for", "padding_fraction"]
