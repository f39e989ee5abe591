"""What one training step at the paper's 3.65B shape (SigLIP-SO400M-384 + Llama-3.2-3B) costs on this CPU.

    python benchmarks/bench_cpu_step.py            # writes benchmarks/results/bench_cpu_step.json

Measures the matmul rates a step is made of, at the shapes of one Llama-3.2-3B decoder layer over 761 tokens (729
image tokens and a caption), in the step's dtypes: a linear layer's forward (``F.linear``: x @ W^T) and the input
gradient its backward computes (``grad @ W``, W stored [out, in] as the layer keeps it) in bfloat16, and the same
products in float32. The step's FLOPs come from the model's own parameter counts (``diagnostics.memory``: the
vision tower's forward, the LLM's forward with the LM head over every position, and, for stage 1, the input
gradients back through the frozen LLM to the projector). The printed times are lower bounds: matmuls only, at the
measured rates.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import machine  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
PAPER_SHAPE = "SigLIP-so400m-384 + Llama-3.2-3B (paper)"
CAPTION_TOKENS = 32  # a LLaVA-558K caption and the template around it


def rate(function, flops: float, repeats: int) -> float:
    """GFLOP/s of ``function`` (best of ``repeats`` after one warm-up call)."""
    function()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        best = min(best, time.perf_counter() - start)
    return flops / best / 1e9


def measure_rates(tokens: int, width: int, repeats: int) -> dict:
    generator = torch.Generator().manual_seed(0)
    out = {}
    for dtype in (torch.bfloat16, torch.float32):
        x = torch.randn(tokens, width, generator=generator).to(dtype)
        weight = torch.randn(width, width, generator=generator).to(dtype)  # [out, in], as nn.Linear keeps it
        grad = torch.randn(tokens, width, generator=generator).to(dtype)
        flops = 2.0 * tokens * width * width
        name = str(dtype).replace("torch.", "")
        out[f"{name}_linear_forward"] = rate(lambda: F.linear(x, weight), flops, repeats)
        out[f"{name}_input_gradient"] = rate(lambda: grad @ weight, flops, repeats)
    return {k: round(v, 2) for k, v in out.items()}


def step_flops(tokens: int) -> dict:
    from llava_normaligned.diagnostics import memory

    shape = memory.pass_shape(memory.reference_config(PAPER_SHAPE))
    forward = memory.pass_flops(shape, tokens, scored=tokens)
    vision = memory.pass_flops(shape, 0, scored=0)  # the vision tower alone (no text positions)
    llm = forward - vision
    return {"forward": forward, "vision_forward": vision, "llm_forward": llm,
            "stage1_backward": llm,  # input gradients only: the LLM and the tower are frozen in stage 1
            "parameters": shape.vision_parameters + shape.llm_parameters + shape.vocab_size * shape.hidden_size}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=os.path.join(HERE, "results", "bench_cpu_step.json"))
    args = parser.parse_args(argv)
    tokens = 729 + CAPTION_TOKENS
    load_start = os.getloadavg()
    rates = measure_rates(tokens, 3072, args.repeats)
    flops = step_flops(tokens)
    bf16_forward_s = flops["forward"] / (rates["bfloat16_linear_forward"] * 1e9)
    bf16_backward_s = flops["stage1_backward"] / (rates["bfloat16_input_gradient"] * 1e9)
    fp32_s = (flops["forward"] + flops["stage1_backward"]) / (rates["float32_linear_forward"] * 1e9)
    result = {
        "machine": {**machine.describe(), "load_average_at_start": list(load_start),
                    "load_average_at_end": list(os.getloadavg())},
        "command": "python benchmarks/bench_cpu_step.py", "tokens": tokens,
        "gflops_per_s": rates,
        "step_tflop": {k: round(v / 1e12, 2) for k, v in flops.items() if k != "parameters"},
        "parameters": flops["parameters"],
        "stage1_step_lower_bound_s": {"bfloat16_forward": round(bf16_forward_s), "bfloat16_backward": round(bf16_backward_s),
                                      "bfloat16_total": round(bf16_forward_s + bf16_backward_s),
                                      "float32_total": round(fp32_s)},
        "float32_weights_gib": round(flops["parameters"] * 4 / 2**30, 1),
    }
    print(json.dumps(result, indent=1))
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
