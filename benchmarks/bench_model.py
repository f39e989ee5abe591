"""Forward+backward time of the norm-aligned LLaVA over stock transformers LLaVA of the same shape.

    python benchmarks/bench_model.py --sizes tiny medium            # CPU, fp32
    python benchmarks/bench_model.py --sizes medium --device cuda     # GPU, bf16

Both models get identical weights (the aligned one has the extra LayerNorm + GWC); steps are interleaved
(stock, aligned, aligned, stock, ...) so drift in clock or load hits both alike, and the medians are compared.
Goal (issue): ratio <= 1.01 at the medium size (a few hundred million parameters).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from llava_normaligned.compose import stock_llava_like
from modeling_llava_normaligned import LlavaNormAlignedConfig, LlavaNormAlignedForConditionalGeneration

SIZES = {
    # ~0.3M parameters: the test-suite model
    "tiny": dict(
        vision=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                    image_size=32, patch_size=8),
        text=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=1000),
        batch=8, text_tokens=32,
    ),
    # ~340M parameters: a SigLIP-B/16-224-shaped tower and a 16-layer, 1024-wide Llama
    "medium": dict(
        vision=dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                    image_size=224, patch_size=16),
        text=dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=16, num_attention_heads=16,
                  num_key_value_heads=8, vocab_size=32000),
        batch=4, text_tokens=64,
    ),
    # ~1.9B parameters: a SigLIP-SO400M-p14-384-shaped tower, a Llama-3.2-1B-shaped LLM (GPU)
    "large": dict(
        vision=dict(hidden_size=1152, intermediate_size=4304, num_hidden_layers=27, num_attention_heads=16,
                    image_size=384, patch_size=14),
        text=dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                  num_key_value_heads=8, vocab_size=128256),
        batch=4, text_tokens=128,
    ),
}


def build_pair(size: str, dtype: torch.dtype, device: str):
    spec = SIZES[size]
    vision = dict(model_type="siglip_vision_model", **spec["vision"])
    text = dict(model_type="llama", max_position_embeddings=4096, **spec["text"])
    n_image_tokens = (spec["vision"]["image_size"] // spec["vision"]["patch_size"]) ** 2
    common = dict(
        vision_config=vision, text_config=text, image_token_index=spec["text"]["vocab_size"] - 1,
        image_seq_length=n_image_tokens, vision_feature_select_strategy="full", vision_feature_layer=-2,
    )
    torch.manual_seed(0)
    aligned = LlavaNormAlignedForConditionalGeneration(LlavaNormAlignedConfig(**common))
    stock = stock_llava_like(aligned)  # same weights, stock transformers class, no norm
    aligned.to(device=device, dtype=dtype).train()
    stock.to(device=device, dtype=dtype).train()
    n_params = sum(p.numel() for p in stock.parameters())
    return stock, aligned, n_image_tokens, n_params


def make_batch(spec: dict, n_image_tokens: int, device: str, dtype: torch.dtype):
    g = torch.Generator().manual_seed(0)
    vocab, batch, n_text = spec["text"]["vocab_size"], spec["batch"], spec["text_tokens"]
    text = torch.randint(1, vocab - 1, (batch, n_text), generator=g)
    image = torch.full((batch, n_image_tokens), vocab - 1)
    input_ids = torch.cat([text[:, :4], image, text[:, 4:]], dim=1).to(device)
    size = spec["vision"]["image_size"]
    pixel_values = torch.randn(batch, 3, size, size, generator=g).to(device=device, dtype=dtype)
    return input_ids, pixel_values


def step_seconds(model, input_ids, pixel_values, device: str) -> float:
    """One forward + backward; returns wall seconds (CUDA-synchronised)."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    loss = model(input_ids=input_ids, pixel_values=pixel_values, labels=input_ids).loss
    loss.backward()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    model.zero_grad(set_to_none=True)
    return elapsed


def bench(size: str, device: str, dtype: torch.dtype, steps: int, warmup: int, batch: int | None = None) -> dict:
    stock, aligned, n_image_tokens, n_params = build_pair(size, dtype, device)
    spec = dict(SIZES[size], batch=batch or SIZES[size]["batch"])
    input_ids, pixel_values = make_batch(spec, n_image_tokens, device, dtype)
    for _ in range(warmup):
        step_seconds(stock, input_ids, pixel_values, device)
        step_seconds(aligned, input_ids, pixel_values, device)
    times = {"stock": [], "aligned": []}
    for i in range(steps):
        order = ("stock", "aligned") if i % 2 == 0 else ("aligned", "stock")
        for name in order:
            model = stock if name == "stock" else aligned
            times[name].append(step_seconds(model, input_ids, pixel_values, device))
    med = {k: statistics.median(v) for k, v in times.items()}
    # each aligned step against the stock step run next to it: robust to slow drift in machine load
    paired = sorted(a / s for s, a in zip(times["stock"], times["aligned"]))
    q1, q3 = paired[len(paired) // 4], paired[(3 * len(paired)) // 4]
    return {
        "size": size, "device": device, "dtype": str(dtype).replace("torch.", ""), "params": n_params,
        "batch": spec["batch"], "seq_len": int(input_ids.shape[1]), "steps": steps,
        "stock_median_s": med["stock"], "aligned_median_s": med["aligned"],
        "ratio_aligned_over_stock": med["aligned"] / med["stock"],
        "paired_ratio_median": statistics.median(paired), "paired_ratio_iqr": [q1, q3],
    }


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=["tiny", "medium"], choices=sorted(SIZES))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, float32 on CPU")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per model (default 30 tiny, 10 else)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--batch", type=int, default=None, help="override the preset's batch size")
    parser.add_argument("--output", default=None, help="write the results as JSON here")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    default_dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    dtype = getattr(torch, args.dtype) if args.dtype else default_dtype
    results = []
    for size in args.sizes:
        steps = args.steps or (30 if size == "tiny" else 10)
        result = bench(size, args.device, dtype, steps, args.warmup, args.batch)
        results.append(result)
        print(
            f"{size:>6} ({result['params'] / 1e6:.0f}M params, {result['dtype']}, {args.device}, "
            f"batch {result['batch']} x {result['seq_len']} tokens): stock {result['stock_median_s'] * 1e3:.1f} ms, "
            f"norm-aligned {result['aligned_median_s'] * 1e3:.1f} ms, ratio of medians "
            f"{result['ratio_aligned_over_stock']:.3f}, paired ratio {result['paired_ratio_median']:.3f} "
            f"(IQR {result['paired_ratio_iqr'][0]:.3f}-{result['paired_ratio_iqr'][1]:.3f})",
            flush=True,
        )
    if args.output:
        with open(args.output, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
