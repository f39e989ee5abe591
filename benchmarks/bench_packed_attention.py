"""Padded against packed (padding-free) batches at the paper's LLM width, for batches with little or no padding: what
decides whether ``train --padding_free True`` packs a batch (it packs only one that has padding).

    python benchmarks/bench_packed_attention.py --json benchmarks/results/bench_packed_attention.json

Llama-3.2-3B's layer widths (3,072 wide, 24 heads, 8 KV heads, MLP 8,192) with ``--layers`` decoder layers, bf16
weights and autocast, frozen (a stage-1 step: the gradient flows back through the LLM to its input embeddings, as to
the projector), ``--threads`` torch threads. Two rows a batch, as the paper's stage-1 recipe, of 790 tokens less
each case's gap (LLaVA-558K rows: 729 image tokens and a caption), labels on the last 30 tokens of each row. Per
case, interleaved, the median of ``--repeats`` forward + backward passes after one warm-up:

* ``padded``: the rows right-padded to the longest, transformers' sdpa with the padding mask (none when the rows are
  of one length: sdpa runs causally);
* ``packed``: the real tokens as one row with restarting positions (``trainer.padding_free.pack_rows``' layout),
  the LLM's sdpa run row by row (``PACKED_SDPA``), what ``train`` uses;
* for the rows of one length, also ``eager`` attention on the padded batch (what the demo's short rows train with).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import machine  # noqa: E402

LONGEST = 790
GAPS = (0, 8, 20, 80, 200)  # tokens the second row is shorter by: 0 to 13% padding


def _model(layers: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=3072, intermediate_size=8192, num_hidden_layers=layers, num_attention_heads=24,
                         num_key_value_heads=8, head_dim=128, vocab_size=1024, attn_implementation="sdpa")
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.requires_grad_(False)
    return model


def _passes(model, lengths: list[int]):
    """(padded pass, packed pass) over rows of ``lengths``: forward + backward to the input embeddings."""
    from llava_normaligned.trainer.padding_free import PACKED_SDPA, pack_rows

    width = model.config.hidden_size
    rows, longest = len(lengths), max(lengths)
    mask = torch.zeros(rows, longest, dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    generator = torch.Generator().manual_seed(1)
    embeds = torch.randn(rows, longest, width, generator=generator, dtype=torch.bfloat16)
    labels = torch.randint(0, model.config.vocab_size, (rows, longest), generator=generator)
    labels[:, :-30] = -100
    packed = pack_rows({"input_ids": labels.clone(), "attention_mask": mask, "labels": labels}, ignore_index=-100)
    packed_embeds = embeds[mask.bool()].unsqueeze(0)

    def padded_pass(attention: str = "sdpa"):
        model.set_attn_implementation(attention)
        x = embeds.clone().requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(inputs_embeds=x, attention_mask=mask, labels=labels).loss
        loss.backward()

    def packed_pass():
        model.set_attn_implementation(PACKED_SDPA)
        x = packed_embeds.clone().requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(inputs_embeds=x, position_ids=packed["position_ids"], labels=packed["labels"],
                         use_cache=False).loss
        loss.backward()

    def eager_pass():
        padded_pass("eager")

    return padded_pass, packed_pass, eager_pass


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    from llava_normaligned.trainer.padding_free import register_packed_sdpa

    torch.set_num_threads(args.threads)
    register_packed_sdpa()
    model = _model(args.layers)
    cases = []
    for gap in GAPS:
        lengths = [LONGEST, LONGEST - gap]
        padded_pass, packed_pass, eager_pass = _passes(model, lengths)
        seconds = {"padded": [], "packed": []} | ({"eager_padded": []} if gap == 0 else {})
        for round_ in range(args.repeats + 1):
            order = (("padded", padded_pass), ("packed", packed_pass)) + (
                (("eager_padded", eager_pass),) if gap == 0 else ())
            for name, run in order if round_ % 2 == 0 else order[::-1]:
                start = time.perf_counter()
                run()
                if round_:
                    seconds[name].append(time.perf_counter() - start)
        padded, packed = statistics.median(seconds["padded"]), statistics.median(seconds["packed"])
        case = {"lengths": lengths, "padding": gap / (2 * LONGEST), "padded_s": padded, "packed_s": packed,
                "packed_vs_padded": padded / packed, "all": seconds}
        if gap == 0:
            case["eager_padded_s"] = statistics.median(seconds["eager_padded"])
            case["sdpa_vs_eager"] = case["eager_padded_s"] / padded
        cases.append(case)
        print(f"rows {lengths}: padding {case['padding']:5.1%}  padded {padded:.3f} s  packed {packed:.3f} s  "
              f"packed {case['packed_vs_padded']:.2f}x"
              + (f"; eager attention {case['eager_padded_s']:.3f} s (sdpa {case['sdpa_vs_eager']:.2f}x)"
                 if "eager_padded_s" in case else ""), flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"command": " ".join(["python benchmarks/bench_packed_attention.py",
                                            *(sys.argv[1:] if argv is None else argv)]),
                       "machine": machine.describe(), "layers": args.layers, "threads": args.threads,
                       "cases": cases}, handle, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
