#!/usr/bin/env bash
# Paper-scale training steps on one GPU (sized for under 10 minutes; the run is cut at 540 s): stage 1 and 2 of the 3.65B shape
# in bf16, this package against stock TRL + stock LLaVA, and one single-process ZeRO-2 run. JSON to
# benchmarks/results/. `--tiny` runs the same code on the CPU at tiny widths.
# Needs a CUDA torch and `pip install -e ".[dev,engines]"` (DeepSpeed for the ZeRO-2 run; `--no-zero2` without it).
#   bash benchmarks/gpu_paper_scale.sh            # on the GPU machine
#   bash benchmarks/gpu_paper_scale.sh --tiny     # anywhere
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p benchmarks/results
if [[ "${1:-}" == "--tiny" ]]; then
  out=${OUT_JSON:-benchmarks/results/gpu_paper_scale_tiny_cpu.json}
  exec python benchmarks/gpu_paper_scale.py --tiny --batch-size 2 --steps 2 --warmup 1 --json "$out"
fi
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
out=${OUT_JSON:-benchmarks/results/gpu_paper_scale_$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr ' A-Z' '_a-z').json}
timeout 540 python benchmarks/gpu_paper_scale.py --device cuda --batch-size 4 --steps 5 --warmup 2 --json "$out"
echo "wrote $out"
