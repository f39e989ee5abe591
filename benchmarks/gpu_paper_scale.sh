#!/usr/bin/env bash
# Paper-scale training steps on one GPU (sized for under 10 minutes; the run is cut at 540 s): stage 1 and full stage 2
# of the 3.65B shape in bf16, `llava-normaligned train` padded and with length grouping + padding-free batches
# (flash-attention-2 where installed, sdpa otherwise) against stock TRL + stock LLaVA, and one single-process ZeRO-2
# run. JSON to benchmarks/results/. `--tiny` runs the same code on the CPU at tiny widths.
# Needs a CUDA torch and `pip install -e ".[dev]"` (DeepSpeed for the ZeRO-2 run).
#   bash benchmarks/gpu_paper_scale.sh            # on the GPU machine
#   bash benchmarks/gpu_paper_scale.sh --tiny     # anywhere
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p benchmarks/results
if [[ "${1:-}" == "--tiny" ]]; then
  out=${OUT_JSON:-benchmarks/results/paper_scale_tiny_cpu.json}
  exec python benchmarks/paper_scale.py --tiny --device cpu --batch-size 2 --steps 2 --warmup 1 --zero2 --json "$out"
fi
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
out=${OUT_JSON:-benchmarks/results/paper_scale_$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr ' A-Z' '_a-z').json}
attn=$(python -c "import importlib.util as u; print('flash_attention_2' if u.find_spec('flash_attn') else 'sdpa')")
timeout 540 python benchmarks/paper_scale.py --device cuda --batch-size 4 --steps 5 --warmup 2 --zero2 \
  --attn-implementation "$attn" --json "$out"
echo "wrote $out"
