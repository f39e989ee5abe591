"""Run by tests/test_trl_floor.py (and tests/transformers_floor_check.py) in a subprocess whose PYTHONPATH puts
another trl (or transformers) first: a tiny stage 2 through TRL's own SFTTrainer with ``assistant_only_loss=True``
and a processor (the demo's stock row, bench_train.py), then through this package's ``train_stage``. Prints one JSON
line: the trl and transformers versions used and what was checked."""

from __future__ import annotations

import json
import math
import os
import sys


def train_checks(workdir: str, *, save_final: bool = False) -> tuple[dict, object]:
    """The two trainings; returns the report and ``train_stage``'s result (its model saved to its output_dir with
    ``save_final``)."""
    import torch
    import transformers
    import trl
    from trl import SFTConfig, SFTTrainer

    from llava_normaligned.compose import compose, stock_llava_like
    from llava_normaligned.demo.synthetic import SyntheticSpec, make_dataset
    from llava_normaligned.tiny import save_tiny_parts
    from llava_normaligned.trainer.data import load_llava_json
    from llava_normaligned.trainer.train import StageConfig, train_stage

    torch.manual_seed(0)
    data = make_dataset(os.path.join(workdir, "data"), SyntheticSpec(train_per_template=16, test_per_template=16),
                        progress=False)
    rows = load_llava_json(data.instruct, data.root)
    model, processor = compose(*save_tiny_parts(os.path.join(workdir, "parts")))

    def config(name: str, **extra) -> SFTConfig:
        return SFTConfig(output_dir=os.path.join(workdir, name), max_steps=2, per_device_train_batch_size=4,
                         logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, bf16=False,
                         gradient_checkpointing=False, dataloader_num_workers=0, disable_tqdm=True, max_length=None,
                         **extra)

    stock = SFTTrainer(model=stock_llava_like(model), args=config("stock", assistant_only_loss=True),
                       train_dataset=rows, processing_class=processor)
    batch = next(iter(stock.get_train_dataloader()))
    masked, padding = int((batch["labels"] == -100).sum()), int((batch["attention_mask"] == 0).sum())
    assert masked > padding, "assistant_only_loss masked nothing but padding"
    stock.train()
    stock_losses = [e["loss"] for e in stock.state.log_history if "loss" in e]

    result = train_stage(model, processor, rows, args=config("stage2"), stage=StageConfig(2, save_final=save_final))
    losses = [e["loss"] for e in result.trainer.state.log_history if "loss" in e]
    assert stock_losses and losses and all(math.isfinite(v) for v in stock_losses + losses)
    report = {"trl": trl.__version__, "trl_file": trl.__file__, "transformers": transformers.__version__,
              "transformers_file": transformers.__file__, "stock_losses": stock_losses, "train_stage_losses": losses,
              "masked_labels": masked, "padding": padding}
    return report, result


def main(workdir: str) -> None:
    report, _ = train_checks(workdir)
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1])
