"""CPU threads for ``llava-normaligned train``: seconds per step with torch's default threads, one thread, all cores,
and OpenMP's passive wait policy, on a quiet machine and beside another job.

    python benchmarks/bench_threads.py --json benchmarks/results/bench_threads_cpu.json

Each setting runs ``python -m llava_normaligned.cli train`` (stage 2 of a tiny model, ``--max_steps`` steps) in a
fresh process with its environment, three ways: alone; beside one busy process (a Python loop, one core, as an
editor's indexer or a test run would be); beside another 2-thread torch job (a matmul loop, as a second training run
would be). OpenMP threads that wait for each other spin by default (libgomp's ``GOMP_SPINCOUNT``): when another
process holds one of the cores, the spinning thread burns its time slice waiting for one that is not running, and a
step can take many times longer. ``OMP_WAIT_POLICY=PASSIVE`` makes them sleep instead.

Seconds per step are the training summary's ``train_runtime`` over the steps (data loading included), best of
``--repeats``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import machine  # noqa: E402

SETTINGS = {
    "default": {},  # what the environment gives the `train` command (the package's own default applies)
    "OMP_NUM_THREADS=1": {"OMP_NUM_THREADS": "1"},
    "OMP_NUM_THREADS=2": {"OMP_NUM_THREADS": "2"},
    "OMP_WAIT_POLICY=PASSIVE": {"OMP_WAIT_POLICY": "PASSIVE"},
    "OMP_WAIT_POLICY=ACTIVE": {"OMP_WAIT_POLICY": "ACTIVE"},
    "GOMP_SPINCOUNT=10000": {"GOMP_SPINCOUNT": "10000"},
    "GOMP_SPINCOUNT=1000": {"GOMP_SPINCOUNT": "1000"},
}
COMPETITORS = {
    "alone": None,
    "one busy process": [sys.executable, "-c", "while True: pass"],
    "a 2-thread torch job": [sys.executable, "-c", "import torch\ntorch.set_num_threads(2)\na = torch.randn(1024, 1024)"
                             "\nwhile True: a @ a"],
}


def prepare(workdir: str, size: str) -> tuple[str, str, str]:
    """(model folder, data JSON, image folder): the tests' tiny model (``tiny``) or bench_train's ``small`` one (a
    256-wide, 4-layer Llama; a 128-wide, 4-layer SigLIP at 64 px), and 64 rows about solid-colour images."""
    sys.path.insert(0, os.path.dirname(HERE))  # the checkout: tests.support
    import bench_train

    from llava_normaligned.compose import compose, save
    from llava_normaligned.tiny import TinyTextSpec, TinyVisionSpec, save_tiny_parts
    from tests.support.training import write_llava_dataset

    spec = {} if size == "tiny" else {"vision": TinyVisionSpec(**bench_train.SIZES[size]["vision"]),
                                      "text": TinyTextSpec(**bench_train.SIZES[size]["text"])}
    model, processor = compose(*save_tiny_parts(os.path.join(workdir, "parts"), **spec))
    folder = os.path.join(workdir, "model")
    save(model, processor, folder)
    path, images = write_llava_dataset(os.path.join(workdir, "data"), n_rows=64, text_only=4)
    return folder, path, images


def step_seconds(setting: dict, files, steps: int, workdir: str) -> float:
    model, path, images = files
    out = tempfile.mkdtemp(dir=workdir)
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(setting, TOKENIZERS_PARALLELISM="false", HF_DATASETS_CACHE=os.path.join(workdir, "datasets_cache"))
    command = [sys.executable, "-m", "llava_normaligned.cli", "train", "--stage", "2", "--model", model,
               "--data-path", path, "--image-folder", images, "--output-dir", out, "--max_steps", str(steps),
               "--per_device_train_batch_size", "4", "--report_to", "none", "--save_strategy", "no",
               "--disable_tqdm", "True", "--logging_steps", str(steps), "--learning_rate", "1e-4"]
    run = subprocess.run(command, capture_output=True, text=True, env=env)
    if run.returncode != 0:
        raise RuntimeError(f"train failed with {setting}:\n{run.stderr[-3000:]}")
    with open(os.path.join(out, "training_summary.json"), encoding="utf-8") as handle:
        return json.load(handle)["metrics"]["train_runtime"] / steps


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="tiny", choices=["tiny", "small"])
    parser.add_argument("--competitors", nargs="+", default=list(COMPETITORS), choices=list(COMPETITORS))
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--json", default=None)
    opts = parser.parse_args(argv)
    results = {"command": "python benchmarks/bench_threads.py " + " ".join(sys.argv[1:] if argv is None else argv),
               "machine": machine.describe(), "size": opts.size, "steps": opts.steps, "seconds_per_step": {}}
    print(f"{results['machine']['cpu']} ({results['machine']['cores']} cores), load "
          f"{results['machine']['load_average'][0]:.2f}", flush=True)
    with tempfile.TemporaryDirectory() as workdir:
        files = prepare(workdir, opts.size)
        step_seconds({}, files, 2, workdir)  # the rows rendered once, into the cache every run reads
        for competitor in opts.competitors:
            command = COMPETITORS[competitor]
            other = subprocess.Popen(command) if command else None
            time.sleep(1.0 if other else 0.0)
            try:
                row = {name: min(step_seconds(SETTINGS[name], files, opts.steps, workdir)
                                 for _ in range(opts.repeats)) for name in opts.settings}
            finally:
                if other is not None:
                    other.kill()
                    other.wait()
            results["seconds_per_step"][competitor] = row
            print(f"{competitor:22} " + "  ".join(f"{name} {value:.3f} s" for name, value in row.items()), flush=True)
    if opts.json:
        with open(opts.json, "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
