"""Memory footprint and generation speed of the quantized inference path against full precision, same model.

    python benchmarks/bench_quant.py --size small --device cpu --output bench_quant_small_cpu.json
    python benchmarks/bench_quant.py --size 1b --device cuda --output bench_quant_1b_cuda.json
    python benchmarks/bench_quant.py --size 7b --device cuda --output bench_quant_7b_cuda.json

Nothing is downloaded: a norm-aligned LLaVA with the shapes of a real one and random weights is built, saved to a
temporary folder (as `compose` would write it) and loaded from there by `load_model` in each mode, one after the
other, so that every mode reads the same checkpoint. Per mode: `get_memory_footprint()` by component, on a GPU the
allocated and peak memory, and generation speed (prefill time, tokens/s over the whole call, decode tokens/s).

Goal (issue 5): 4-bit footprint <= 0.35x of bf16 for a model whose LLM dominates. Only the LLM's linear layers are
quantized (NF4 with double quantization: about 4.13 bits per weight); the vision tower, projector, embeddings and
lm_head stay in bf16. The script prints the ratio this split predicts next to the measured one.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
from PIL import Image

from llava_normaligned.generation import prepare_inputs
from llava_normaligned.loading import QUANTIZED_ROOT, load_model, parse_dtype, resolve_device

NF4_DOUBLE_QUANT_BITS = 4 + 8 / 64 + 32 / (64 * 256)  # 4-bit codes, 8-bit absmax per 64, fp32 per 256 absmax
INT8_BITS = 8 + 32 / 4096  # int8 codes + an fp32 scale per output row (rows of ~4k)
GOAL_4BIT_OVER_BF16 = 0.35


@dataclass
class Preset:
    """The shapes of a real vision encoder and LLM (random weights)."""

    description: str
    vision: dict
    text: dict


SIGLIP_SO400M_384 = dict(
    model_type="siglip_vision_model",
    hidden_size=1152,
    intermediate_size=4304,
    num_hidden_layers=27,
    num_attention_heads=16,
    image_size=384,
    patch_size=14,
)
PRESETS = {
    "tiny": Preset(
        "tiny SigLIP (48-d) + tiny Llama (64-d): the test-suite model",
        dict(
            model_type="siglip_vision_model",
            hidden_size=48,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=2,
            image_size=32,
            patch_size=8,
        ),
        dict(
            model_type="llama",
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=1024,
            tie_word_embeddings=False,
        ),
    ),
    "small": Preset(
        "SigLIP-B/16-224-shaped tower + SmolLM2-135M-shaped LLM (~0.22B)",
        dict(
            model_type="siglip_vision_model",
            hidden_size=768,
            intermediate_size=3072,
            num_hidden_layers=12,
            num_attention_heads=12,
            image_size=224,
            patch_size=16,
        ),
        dict(
            model_type="llama",
            hidden_size=576,
            intermediate_size=1536,
            num_hidden_layers=30,
            num_attention_heads=9,
            num_key_value_heads=3,
            vocab_size=49152,
            tie_word_embeddings=True,
        ),
    ),
    "1b": Preset(
        "SigLIP-SO400M/14-384-shaped tower + Llama-3.2-1B-shaped LLM (~1.7B)",
        SIGLIP_SO400M_384,
        dict(
            model_type="llama",
            hidden_size=2048,
            intermediate_size=8192,
            num_hidden_layers=16,
            num_attention_heads=32,
            num_key_value_heads=8,
            vocab_size=128256,
            tie_word_embeddings=True,
            rope_theta=500000.0,
        ),
    ),
    "3b": Preset(
        "SigLIP-SO400M/14-384-shaped tower + Llama-3.2-3B-shaped LLM (~3.7B)",
        SIGLIP_SO400M_384,
        dict(
            model_type="llama",
            hidden_size=3072,
            intermediate_size=8192,
            num_hidden_layers=28,
            num_attention_heads=24,
            num_key_value_heads=8,
            vocab_size=128256,
            tie_word_embeddings=True,
            rope_theta=500000.0,
        ),
    ),
    "7b": Preset(
        "LLaVA-1.5-7B-shaped: CLIP-L/14-336 tower + Llama-2-7B/Vicuna-shaped LLM (~7.1B)",
        dict(
            model_type="clip_vision_model",
            hidden_size=1024,
            intermediate_size=4096,
            num_hidden_layers=24,
            num_attention_heads=16,
            image_size=336,
            patch_size=14,
            projection_dim=768,
        ),
        dict(
            model_type="llama",
            hidden_size=4096,
            intermediate_size=11008,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=32,
            vocab_size=32064,
            tie_word_embeddings=False,
        ),
    ),
}


@dataclass
class BenchConfig:
    size: str = "small"
    device: str = "auto"
    dtype: str | None = None  # full-precision reference and unquantized parts; default bf16 on GPU, fp32 on CPU
    modes: list[str] = field(default_factory=lambda: ["full", "8bit", "4bit"])
    batch_sizes: list[int] = field(default_factory=lambda: [1])
    new_tokens: int = 32
    repeats: int = 3
    output: str | None = None
    workdir: str | None = None


# ---------------------------------------------------------------------------------------------- the checkpoint


def build_checkpoint(preset: Preset, folder: str, device: torch.device, dtype: torch.dtype) -> dict:
    """Build the model with random weights on ``device`` (fast on a GPU), save it in ``dtype`` with a processor whose
    tokenizer is the tiny BPE one (the ids it produces all lie inside the model's vocabulary)."""
    from transformers import LlavaProcessor
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil
    from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil

    from llava_normaligned.families.tokens import IMAGE_TOKEN
    from llava_normaligned.tiny import train_tokenizer
    from modeling_llava_normaligned import LlavaNormAlignedConfig, LlavaNormAlignedForConditionalGeneration

    tokenizer = train_tokenizer()
    vision, text = dict(preset.vision), dict(preset.text)
    siglip = vision["model_type"] == "siglip_vision_model"
    size = {"height": vision["image_size"], "width": vision["image_size"]}
    image_processor = (
        SiglipImageProcessorPil(size=size)
        if siglip
        else CLIPImageProcessorPil(size={"shortest_edge": vision["image_size"]}, crop_size=size)
    )
    text.update(
        max_position_embeddings=4096,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    config = LlavaNormAlignedConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        image_seq_length=(vision["image_size"] // vision["patch_size"]) ** 2,
        vision_feature_select_strategy="full" if siglip else "default",
        vision_feature_layer=-2,
        tie_word_embeddings=text["tie_word_embeddings"],
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = LlavaNormAlignedForConditionalGeneration(config)  # T computed from the random embeddings
    model.to(dtype).save_pretrained(folder)
    processor = LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=vision["patch_size"],
        vision_feature_select_strategy=config.vision_feature_select_strategy,
        num_additional_image_tokens=0 if siglip else 1,
        chat_template=tokenizer.chat_template,
    )
    processor.save_pretrained(folder)
    counts = parameter_counts(model)
    del model
    return counts


def _component(name: str) -> str:
    if name.startswith("model.vision_tower."):
        return "vision_tower"
    if name.startswith("model.multi_modal_projector."):
        return "projector"
    if name.startswith("lm_head."):
        return "lm_head"
    if name.startswith(QUANTIZED_ROOT + ".embed_tokens."):
        return "llm_embeddings"
    if name.startswith(QUANTIZED_ROOT + ".layers.") and name.endswith("_proj.weight"):
        return "llm_linear_weights"  # what bitsandbytes quantizes
    return "llm_other"  # norms, biases


def parameter_counts(model) -> dict[str, int]:
    counts: dict[str, int] = {}
    for name, param in model.named_parameters():  # tied lm_head is listed once, under the embeddings
        counts[_component(name)] = counts.get(_component(name), 0) + param.numel()
    counts["total"] = sum(counts.values())
    return counts


def predicted_ratio(counts: dict[str, int], bits: float, reference_bits: int = 16) -> float:
    """Footprint ratio if only the LLM's linear weights go to ``bits`` and the rest stays at ``reference_bits``."""
    quantized = counts.get("llm_linear_weights", 0)
    return ((counts["total"] - quantized) * reference_bits + quantized * bits) / (counts["total"] * reference_bits)


def _quant_state_bytes(module) -> int:
    """Bytes bitsandbytes keeps outside parameters and buffers, which ``get_memory_footprint`` does not see: a 4-bit
    layer's block scales (absmax, nested absmax and code book), an 8-bit layer's per-row scales (SCB)."""
    weight = getattr(module, "weight", None)
    state = getattr(weight, "quant_state", None)
    if state is not None:
        tensors = [v for v in state.as_dict(packed=True).values() if isinstance(v, torch.Tensor)]
        return sum(t.numel() * t.element_size() for t in tensors)
    scb = getattr(weight, "SCB", None)
    return scb.numel() * scb.element_size() if isinstance(scb, torch.Tensor) else 0


def component_bytes(model) -> dict[str, int]:
    """Memory by component: parameters and buffers (what ``get_memory_footprint`` counts; a 4-bit weight holds its
    packed bytes) plus the quantization scales under ``llm_quant_scales``."""
    sizes: dict[str, int] = {}
    seen = set()
    for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        key = _component(name)
        sizes[key] = sizes.get(key, 0) + tensor.numel() * tensor.element_size()
    scales = sum(_quant_state_bytes(m) for m in model.modules() if type(m).__module__.startswith("bitsandbytes"))
    if scales:
        sizes["llm_quant_scales"] = scales
    return sizes


# -------------------------------------------------------------------------------------------------- measuring


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed_generate(model, inputs, new_tokens: int, device: torch.device) -> float:
    _sync(device)
    start = time.perf_counter()
    model.generate(**inputs, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
    _sync(device)
    return time.perf_counter() - start


def time_generation(model, processor, image, batch: int, new_tokens: int, repeats: int, device) -> dict:
    """Median seconds of a 1-token call (prefill) and a ``new_tokens`` call, on ``batch`` copies of one prompt."""
    inputs = prepare_inputs(model, processor, ["Describe the image in detail."] * batch, [[image]] * batch)
    _timed_generate(model, inputs, 4, device)  # warm-up: kernels, CPU weight repacking, allocator
    prefills, totals = [], []
    for _ in range(repeats):  # interleaved, so that drift in clock or machine load hits both alike
        prefills.append(_timed_generate(model, inputs, 1, device))
        totals.append(_timed_generate(model, inputs, new_tokens, device))
    prefill, total = statistics.median(prefills), statistics.median(totals)
    return {
        "batch": batch,
        "prompt_tokens": int(inputs["input_ids"].shape[1]),
        "new_tokens": new_tokens,
        "prefill_s": prefill,
        "generate_s": total,
        "tokens_per_s": batch * new_tokens / total,
        # the tokens after the first, over the time after the prefill (None when noise swallowed the difference)
        "decode_tokens_per_s": batch * (new_tokens - 1) / (total - prefill) if total > prefill else None,
    }


def bench_mode(folder: str, mode: str, device: torch.device, dtype: torch.dtype, cfg: BenchConfig, image) -> dict:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    start = time.perf_counter()
    model, processor, report = load_model(
        folder, quantization=None if mode == "full" else mode, device=str(device), dtype=dtype, return_report=True
    )
    components = component_bytes(model)
    result = {
        "mode": mode,
        "load_s": time.perf_counter() - start,
        "footprint_bytes": int(model.get_memory_footprint()),  # transformers' number: parameters + buffers
        "components_bytes": components,
        "footprint_with_scales_bytes": sum(components.values()),  # + bitsandbytes' block/row scales
        "compute_dtype": report.compute_dtype,
        "kept": report.kept,
        "quantized_layers": len(report.quantized_layers),
    }
    if device.type == "cuda":
        result["cuda_allocated_after_load_bytes"] = torch.cuda.memory_allocated(device) - base
        result["cuda_peak_during_load_bytes"] = torch.cuda.max_memory_allocated(device) - base
        torch.cuda.reset_peak_memory_stats(device)
    result["generation"] = [
        time_generation(model, processor, image, batch, cfg.new_tokens, cfg.repeats, device)
        for batch in cfg.batch_sizes
    ]
    if device.type == "cuda":
        result["cuda_peak_during_generation_bytes"] = torch.cuda.max_memory_allocated(device) - base
    del model, processor
    gc.collect()
    return result


# ---------------------------------------------------------------------------------------------------- report


def _mib(n: int | float) -> str:
    return f"{n / 2**20:,.1f}"


def summarise(results: list[dict], counts: dict[str, int], reference_dtype: torch.dtype) -> dict:
    """Ratios of every mode against the full-precision row, and the predicted 4/8-bit ratios."""
    reference = next((r for r in results if r["mode"] == "full"), None)
    ref_bits = torch.finfo(reference_dtype).bits
    summary = {
        "predicted_footprint_ratio": {
            "4bit": predicted_ratio(counts, NF4_DOUBLE_QUANT_BITS, ref_bits),
            "8bit": predicted_ratio(counts, INT8_BITS, ref_bits),
        },
        "ratios": {},
    }
    if reference is None:
        return summary
    for r in results:
        ratios = {
            "footprint": r["footprint_bytes"] / reference["footprint_bytes"],
            "footprint_with_scales": r["footprint_with_scales_bytes"] / reference["footprint_with_scales_bytes"],
        }
        if "cuda_allocated_after_load_bytes" in r:
            ratios["cuda_allocated"] = (
                r["cuda_allocated_after_load_bytes"] / reference["cuda_allocated_after_load_bytes"]
            )
            ratios["cuda_peak_generation"] = (
                r["cuda_peak_during_generation_bytes"] / reference["cuda_peak_during_generation_bytes"]
            )
        for g, g_ref in zip(r["generation"], reference["generation"]):
            ratios[f"tokens_per_s_batch{g['batch']}"] = g["tokens_per_s"] / g_ref["tokens_per_s"]
        summary["ratios"][r["mode"]] = ratios
    if "4bit" in summary["ratios"] and reference_dtype == torch.bfloat16:
        # judged on the stricter number, the one that counts the NF4 block scales
        ratio = summary["ratios"]["4bit"]["footprint_with_scales"]
        summary["goal_4bit_footprint_le_0.35x_bf16"] = {
            "ratio": ratio,
            "ratio_get_memory_footprint": summary["ratios"]["4bit"]["footprint"],
            "met": ratio <= GOAL_4BIT_OVER_BF16,
        }
    return summary


def print_table(results: list[dict], summary: dict, reference_dtype: torch.dtype) -> None:
    name = str(reference_dtype).removeprefix("torch.")
    print("\nfootprint: get_memory_footprint(); +scales: with bitsandbytes' block/row scales; MiB unless a ratio")
    print(
        f"{'mode':<6} {'footprint':>10} {'+scales':>9} {'x ' + name:>9} {'vision':>9} {'LLM lin.':>9} {'emb+head':>9}"
        f" {'GPU alloc':>10} {'GPU peak':>10} {'batch':>5} {'prefill s':>9} {'tok/s':>8} {'decode':>8} {'x tok/s':>7}"
    )
    for r in results:
        c = r["components_bytes"]
        ratios = summary["ratios"].get(r["mode"], {})
        for i, g in enumerate(r["generation"]):
            head = (
                (
                    f"{r['mode']:<6} {_mib(r['footprint_bytes']):>10} {_mib(r['footprint_with_scales_bytes']):>9} "
                    f"{ratios.get('footprint_with_scales', float('nan')):>9.3f} "
                    f"{_mib(c.get('vision_tower', 0)):>9} {_mib(c.get('llm_linear_weights', 0)):>9} "
                    f"{_mib(c.get('llm_embeddings', 0) + c.get('lm_head', 0)):>9} "
                    f"{_mib(r.get('cuda_allocated_after_load_bytes', float('nan'))):>10} "
                    f"{_mib(r.get('cuda_peak_during_generation_bytes', float('nan'))):>10}"
                )
                if i == 0
                else " " * 88
            )
            speed = ratios.get(f"tokens_per_s_batch{g['batch']}", float("nan"))
            decode = g["decode_tokens_per_s"] if g["decode_tokens_per_s"] is not None else float("nan")
            print(
                f"{head} {g['batch']:>5} {g['prefill_s']:>9.3f} {g['tokens_per_s']:>8.1f} {decode:>8.1f} {speed:>7.2f}"
            )
    predicted = summary["predicted_footprint_ratio"]
    print(
        f"\npredicted footprint ratio from the parameter split (unquantized parts in {name}): "
        f"4bit {predicted['4bit']:.3f}, 8bit {predicted['8bit']:.3f}"
    )
    goal = summary.get("goal_4bit_footprint_le_0.35x_bf16")
    if goal:
        print(
            f"goal 4-bit footprint <= {GOAL_4BIT_OVER_BF16}x bf16: {goal['ratio']:.3f} with scales "
            f"({goal['ratio_get_memory_footprint']:.3f} by get_memory_footprint) -> "
            f"{'MET' if goal['met'] else 'NOT MET'}"
        )


def environment(device: torch.device) -> dict:
    import transformers

    try:
        import bitsandbytes

        bnb_version = bitsandbytes.__version__
    except ImportError:
        bnb_version = None
    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "bitsandbytes": bnb_version,
        "device": str(device),
        "cpu_count": os.cpu_count(),
        "loadavg_start": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
    return env


# ------------------------------------------------------------------------------------------------------- main


def make_parser() -> argparse.ArgumentParser:
    defaults = BenchConfig()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(PRESETS), default=defaults.size)
    parser.add_argument("--device", default=defaults.device, help="auto, cpu, cuda, cuda:N")
    parser.add_argument("--dtype", default=None, help="reference dtype (default bf16 on GPU, fp32 on CPU)")
    parser.add_argument("--modes", nargs="+", choices=["full", "8bit", "4bit"], default=defaults.modes)
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=defaults.batch_sizes)
    parser.add_argument("--new-tokens", type=int, default=defaults.new_tokens)
    parser.add_argument("--repeats", type=int, default=defaults.repeats)
    parser.add_argument("--output", default=None, help="write the results as JSON here")
    parser.add_argument("--workdir", default=None, help="where to write the temporary checkpoint (default: $TMPDIR)")
    return parser


def run(cfg: BenchConfig) -> dict:
    device = resolve_device(cfg.device)
    dtype = parse_dtype(cfg.dtype) or (torch.float32 if device.type == "cpu" else torch.bfloat16)
    preset = PRESETS[cfg.size]
    print(f"bench_quant: {cfg.size} ({preset.description}) on {device}, reference {dtype}", flush=True)
    env = environment(device)
    rng = np.random.RandomState(0)
    image = Image.fromarray(
        (rng.rand(preset.vision["image_size"], preset.vision["image_size"], 3) * 255).astype("uint8")
    )
    with tempfile.TemporaryDirectory(dir=cfg.workdir, prefix="bench_quant_") as folder:
        start = time.perf_counter()
        counts = build_checkpoint(preset, folder, device, dtype)
        print(
            f"built and saved the checkpoint in {time.perf_counter() - start:.1f}s: "
            + ", ".join(f"{k} {v / 1e6:,.1f}M" for k, v in counts.items()),
            flush=True,
        )
        results = []
        for mode in cfg.modes:
            results.append(bench_mode(folder, mode, device, dtype, cfg, image))
            print(
                f"  {mode}: footprint {_mib(results[-1]['footprint_bytes'])} MiB, "
                f"{results[-1]['generation'][0]['tokens_per_s']:.1f} tok/s (batch {cfg.batch_sizes[0]})",
                flush=True,
            )
    summary = summarise(results, counts, dtype)
    print_table(results, summary, dtype)
    env["loadavg_end"] = os.getloadavg() if hasattr(os, "getloadavg") else None
    record = {
        "config": asdict(cfg),
        "preset": asdict(preset),
        "reference_dtype": str(dtype),
        "environment": env,
        "parameters": counts,
        "results": results,
        "summary": summary,
        "command": " ".join(sys.argv),
    }
    if cfg.output:
        os.makedirs(os.path.dirname(os.path.abspath(cfg.output)), exist_ok=True)
        with open(cfg.output + ".partial", "w") as handle:
            json.dump(record, handle, indent=2)
        os.replace(cfg.output + ".partial", cfg.output)
        print(f"wrote {cfg.output}")
    return record


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    run(BenchConfig(**vars(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
