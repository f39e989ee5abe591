"""Run by tests/test_transformers_floor.py in a subprocess whose PYTHONPATH puts another transformers first: the
trainings of trl_floor_check.py (TRL's SFTTrainer with a processor, and ``train_stage``, whose collator asks the
processor for ``return_text_replacement_offsets``), a look at one batch of this package's collator, then the saved
stage loaded back with ``load_model`` (``from_pretrained``) and a short greedy ``generate``. Prints one JSON line."""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from trl_floor_check import train_checks  # noqa: E402


def main(workdir: str) -> None:
    from PIL import Image

    from llava_normaligned.generation import generate_batch
    from llava_normaligned.loading import load_model
    from llava_normaligned.trainer.collator import PixelTable

    report, result = train_checks(workdir, save_final=True)
    batch = next(iter(result.trainer.get_train_dataloader()))
    labelled = int((batch["labels"] != -100).sum())
    unlabelled_text = int(((batch["labels"] == -100) & (batch["attention_mask"] == 1)).sum())
    assert labelled > 0 and unlabelled_text > 0, "the collator labelled everything or nothing"

    model, processor = load_model(result.output_dir)
    assert type(model).__name__ == type(result.model).__name__, type(model).__name__
    # the model's own forward in training (a plain Trainer's or a loop's): the loss at the labelled positions only
    model.train()
    outputs = model(**{k: v for k, v in batch.items() if k in ("input_ids", "attention_mask", "pixel_values",
                                                                  "labels")})
    outputs.loss.backward()
    assert outputs.logits is None and float(outputs.loss) > 0, "the loss at labelled positions"
    model.eval()
    image = Image.new("RGB", (32, 32), (200, 30, 30))
    answers = generate_batch(model, processor, ["What colour is the image?"], [image], max_new_tokens=4)
    assert len(answers) == 1 and isinstance(answers[0], str)
    report.update(collator_labelled=labelled, collator_unlabelled_text=unlabelled_text,
                  pixel_table=PixelTable.of(processor.image_processor) is not None, loaded=type(model).__name__,
                  labelled_positions_loss=float(outputs.loss),
                  answer=answers[0])
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1])
