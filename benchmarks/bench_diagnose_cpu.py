"""CPU FLOP rate of one image-prompt forward pass of tiny models of the blog's two families (SmolVLM, Qwen3-VL),
written to ``llava_normaligned/assets/diagnose_cpu_rate.json`` for the time table of
``python .ci/doc_tables.py`` (README, docs/diagnostics.md).

The tiny models keep the real models' classes, image sizes and token counts (SmolVLM2: 17 tiles of 384 px, 1377
image tokens; Qwen3-VL: a 768 px image, 576 image tokens) and shrink the widths and depths. Each pass's FLOPs are
counted by ``memory.pass_flops`` from the config, as for the full-size models; the full-size time of a prompt is
then its FLOPs over this rate. Tiny matrices run at a lower FLOP rate than full-size ones, so the extrapolation
errs on the slow side.

    python benchmarks/bench_diagnose_cpu.py [--repeats 5] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from datetime import datetime, timezone

import torch

from llava_normaligned.diagnostics.memory import (
    CPU_RATE_RECORD,
    DYNAMIC_IMAGE_SIDE,
    IDEFICS_TILES,
    PROMPT_TOKENS,
    image_tokens,
    pass_flops,
    pass_shape,
)

TEXT = dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=4, head_dim=64,
            vocab_size=1024, max_position_embeddings=4096)
PLACEHOLDERS = dict(image_token_id=1000, video_token_id=1001, vision_start_token_id=1002, vision_end_token_id=1003)


def tiny_smolvlm():
    from transformers import SmolVLMConfig, SmolVLMForConditionalGeneration

    config = SmolVLMConfig(
        vision_config=dict(hidden_size=128, intermediate_size=512, num_hidden_layers=2, num_attention_heads=2,
                           image_size=384, patch_size=14),
        text_config=dict(model_type="llama", num_key_value_heads=4, **TEXT), scale_factor=3, image_token_id=1000)
    model = SmolVLMForConditionalGeneration(config).eval()
    tokens = image_tokens(config)
    ids = torch.cat([torch.full((1, PROMPT_TOKENS // 2), 5), torch.full((1, tokens), 1000),
                     torch.full((1, PROMPT_TOKENS // 2), 6)], 1)
    pixels = torch.randn(1, IDEFICS_TILES, 3, 384, 384)
    return config, model, dict(input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=pixels)


def tiny_qwen3_vl():
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    config = Qwen3VLConfig(
        vision_config=dict(depth=2, hidden_size=128, intermediate_size=512, num_heads=2, patch_size=16,
                           spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=256,
                           num_position_embeddings=2304, deepstack_visual_indexes=[0, 1]),
        text_config=dict(num_key_value_heads=2, **TEXT), **PLACEHOLDERS)
    model = Qwen3VLForConditionalGeneration(config).eval()
    grid = DYNAMIC_IMAGE_SIDE // 16  # patches per side
    tokens = image_tokens(config)
    ids = torch.cat([torch.full((1, PROMPT_TOKENS // 2 - 1), 5), torch.tensor([[1002]]), torch.full((1, tokens), 1000),
                     torch.tensor([[1003]]), torch.full((1, PROMPT_TOKENS // 2 - 1), 6)], 1)
    pixels = torch.randn(grid * grid, 3 * 2 * 16 * 16)
    return config, model, dict(input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=pixels,
                               image_grid_thw=torch.tensor([[1, grid, grid]]),
                               mm_token_type_ids=(ids == 1000).long())  # 1 marks image tokens (M-RoPE)


FAMILIES = {"smolvlm": tiny_smolvlm, "qwen3_vl": tiny_qwen3_vl}


@torch.inference_mode()
def measure(build, repeats: int) -> dict:
    torch.manual_seed(0)
    config, model, inputs = build()
    sequence = inputs["input_ids"].shape[1]
    model(**inputs, logits_to_keep=1)  # warm-up
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        model(**inputs, logits_to_keep=1)
        seconds.append(time.perf_counter() - start)
    flops = pass_flops(pass_shape(config), sequence)
    median = statistics.median(seconds)
    return {"model_class": type(model).__name__, "sequence": sequence, "flops_per_pass": flops,
            "seconds_per_pass": median, "seconds_all": seconds, "gflops_per_second": flops / median / 1e9}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", default=CPU_RATE_RECORD)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    families = {}
    for name, build in FAMILIES.items():
        families[name] = measure(build, args.repeats)
        print(name, json.dumps(families[name]))
    record = {
        "about": "CPU FLOP rate of one image-prompt forward pass of tiny models of each family (benchmarks/"
                 "bench_diagnose_cpu.py); the time table of llava_normaligned.diagnostics.memory divides the "
                 "full-size FLOPs of a diagnose prompt by it.",
        "command": "python benchmarks/bench_diagnose_cpu.py " + " ".join(argv or []),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{os.cpu_count()} CPU cores ({platform.machine()}), {args.threads} threads, "
                   f"1-minute load average {os.getloadavg()[0]:.1f} at the end (a shared machine)",
        "torch": torch.__version__,
        "families": families,
    }
    with open(args.output, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=2)
        f.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
