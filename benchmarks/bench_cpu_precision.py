"""Which precision and optimizer settings make the CPU training step fastest: SmolLM2-135M-Instruct composed with the
demo's tiny SigLIP, a stage-2 step (everything trains) through ``train``'s path (TRL's fused LM head at the labelled
positions only), the demo's rows (``bench_loss_at_labels.py``'s).

    python benchmarks/bench_cpu_precision.py --json benchmarks/results/bench_cpu_precision.json

Options, interleaved (``--repeats`` rounds after one warm-up step each):

* ``float32``: float32 weights and compute;
* ``bf16-autocast``: bf16 autocast over float32 weights (the demo's setting today);
* ``bf16-weights+master``: bf16 weights and compute, AdamW on a float32 master copy (the gradients copied up, the
  updated weights copied down each step), what mixed-precision training keeps;
* each of the above with AdamW's ``fused=True`` kernel;
* the fastest of them again with 2 threads (the demo runs 2 workers of 1 thread on 2 cores);
* with ``--compile``: the fastest under ``torch.compile`` (inductor), its first (compiling) step timed apart.

It measures speed only: whether each trains the same (loss curves within seed noise) is a separate run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch


class MasterCopy:
    """AdamW over float32 copies of a bf16 model's trainable weights: ``step`` copies the gradients up, steps, and
    copies the weights down."""

    def __init__(self, params, fused: bool):
        self.params = list(params)
        self.master = [p.detach().float().clone().requires_grad_(True) for p in self.params]
        self.optimizer = torch.optim.AdamW(self.master, lr=1e-5, fused=fused)

    def step(self):
        for p, m in zip(self.params, self.master):
            m.grad = None if p.grad is None else p.grad.float()
        self.optimizer.step()
        with torch.no_grad():
            for p, m in zip(self.params, self.master):
                p.copy_(m)

    def zero_grad(self, set_to_none: bool = True):
        for p in self.params:
            p.grad = None


def _setup(model, option: str):
    """(model in the option's dtype, optimizer, autocast on?)."""
    fused = option.endswith("+fused")
    kind = option.removesuffix("+fused")
    params = [p for p in model.parameters() if p.requires_grad]
    if kind == "bf16-weights+master":
        model.to(torch.bfloat16)
        return MasterCopy(params, fused), False
    model.to(torch.float32)
    return torch.optim.AdamW(params, lr=1e-5, fused=fused), kind == "bf16-autocast"


def _step(model, optimizer, batch, autocast: bool) -> float:
    from llava_normaligned.compat import fused_head_compacted_on_cpu

    start = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast), fused_head_compacted_on_cpu():
        loss = model(**batch, fused_lm_head=True).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def _time(model, batch, options, repeats, threads) -> dict[str, list[float]]:
    torch.set_num_threads(threads)
    seconds = {option: [] for option in options}
    for round_ in range(repeats + 1):  # round 0: a warm-up step of each
        for option in options if round_ % 2 == 0 else options[::-1]:
            optimizer, autocast = _setup(model, option)
            pixels = batch["pixel_values"]
            dtype = next(model.parameters()).dtype
            step_batch = {**batch, "pixel_values": pixels.to(dtype)}
            _step(model, optimizer, step_batch, autocast)  # the optimizer's state is made in its first step
            took = _step(model, optimizer, step_batch, autocast)
            if round_:
                seconds[option].append(took)
    return seconds


def _compiled(model, batch, option: str, repeats: int) -> dict:
    """Seconds of ``option``'s step with the model under ``torch.compile`` (one thread): the first step (it
    compiles) and ``repeats`` after it."""
    torch.set_num_threads(1)
    optimizer, autocast = _setup(model, option)
    compiled = torch.compile(model)
    step_batch = {**batch, "pixel_values": batch["pixel_values"].to(next(model.parameters()).dtype)}
    first = _step(compiled, optimizer, step_batch, autocast)
    seconds = [_step(compiled, optimizer, step_batch, autocast) for _ in range(repeats + 1)][1:]
    return {"first_step": round(first, 2), "median": round(statistics.median(seconds), 3),
            "all": [round(s, 3) for s in seconds]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--repeats", type=int, default=3, help="timed steps per option (default 3)")
    parser.add_argument("--rows", type=int, default=16, help="rows a step (default 16: the demo's batch)")
    parser.add_argument("--compile", action="store_true", help="also the fastest option under torch.compile")
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_loss_at_labels import _batch, _bf16_cpu, _model, write_record
    from machine import describe
    from trl.trainer.utils import add_fused_lm_head

    torch.manual_seed(0)
    model = _model()
    add_fused_lm_head(model, outputs=("log_probs", "entropy", "is_top1"))  # as SFTTrainer does
    batch = _batch(model, args.rows)
    options = ["float32", "float32+fused"]
    if _bf16_cpu():
        options += ["bf16-autocast", "bf16-autocast+fused", "bf16-weights+master", "bf16-weights+master+fused"]
    one = _time(model, batch, options, args.repeats, threads=1)
    medians = {option: statistics.median(values) for option, values in one.items()}
    fastest = min(medians, key=medians.get)
    two = _time(model, batch, [fastest], args.repeats, threads=2)
    result = {
        "command": " ".join(["python benchmarks/bench_cpu_precision.py", *(sys.argv[1:] if argv is None else argv)]),
        "machine": describe(),
        "rows": args.rows,
        "seconds_per_step_1_thread": {o: {"median": round(medians[o], 3), "all": [round(s, 3) for s in one[o]]}
                                      for o in options},
        "fastest": fastest,
        "fastest_2_threads": {"median": round(statistics.median(two[fastest]), 3),
                              "all": [round(s, 3) for s in two[fastest]]},
    }
    if args.compile:
        result["compiled_1_thread"] = _compiled(model, batch, fastest, args.repeats)
    base = medians.get("bf16-autocast", medians["float32"])
    for option in options:
        print(f"{option:28s} {medians[option]:6.2f} s/step  ({base / medians[option]:.2f}x the demo's setting)")
    print(f"{fastest} on 2 threads: {result['fastest_2_threads']['median']:.2f} s/step")
    if args.compile:
        c = result["compiled_1_thread"]
        print(f"{fastest} under torch.compile: {c['median']:.2f} s/step ({medians[fastest] / c['median']:.2f}x), "
              f"its first step (compiling) {c['first_step']:.1f} s")
    write_record(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
