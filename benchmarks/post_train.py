"""GRPO and DPO after stage 2, on the CPU demo's synthetic VQA: w/o Norm against target init + GWC.

For each of the two variants and each seed, the demo's own pipeline (``llava_normaligned.demo``: its synthetic data,
its pre-trained tiny parts, ``run_group``'s stage 1 and stage 2 with TRL's SFTTrainer, its scoring of the held-out
test split) gives a stage-2 model and its held-out accuracy. From that same saved model, three post-trainings run with
TRL's own trainers, each followed by the same scoring on the same held-out questions:

(a) ``GRPOTrainer``, reward ``trainer.rewards.exact_answer``, on prompts of the training split
    (``trainer.rl_data.prompt_rows``): completions sampled per question, rewarded 1 when they equal the answer;
(b) ``DPOTrainer`` on preference pairs of the training split (``trainer.rl_data.preference_rows``): the right answer
    chosen, another answer the data gives to the same question text rejected; once with the plain DPO loss and once
    with the chosen answer's negative log-likelihood added (TRL's ``loss_type=["sigmoid", "sft"]``, RPO), the same
    pairs, steps and rate.

Recorded per seed: accuracy before (stage 2) and after, with the real images and with blank ones; the mean GRPO
reward over its steps; the vision/text norm ratio at the LLM input on fixed test images (``part_metrics``) before and
after, and the ratio ``NormTrackingCallback`` logs on the training batches. Over seeds: means with 95% intervals and
the paired after-minus-before difference (``demo.stats``).

Room to improve: the demo's stage 2 (150 steps) leaves the held-out accuracy near 0.5 (docs/demo.md); a stage 2 that
reached ~1.0 would leave nothing for GRPO or DPO to add. ``--stage2-steps`` sets that budget.

    python benchmarks/post_train.py --work-dir /tmp/post_train_work   # 2 variants x 3 seeds: 745 s on 2 busy CPU cores
    python benchmarks/post_train.py --quick --output-dir /tmp/pt --work-dir /tmp/pt-work   # tiny sizes: 31 s

Writes ``results.json`` and ``summary.md`` in ``--output-dir``; the data, parts and models go to ``--work-dir``
(finished pieces are reused when the script runs again there with the same settings).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

import torch

VARIANT_KEYS = ("no_norm", "norm_target_init_gwc")  # w/o Norm, the paper's method (target init + GWC)
METHODS = ("grpo", "dpo", "dpo_nll")
METHOD_NAMES = {"grpo": "GRPO", "dpo": "DPO", "dpo_nll": "DPO + NLL"}
# TRL's DPO loss_type per method: plain DPO, and DPO plus the negative log-likelihood of the chosen answer (TRL's
# "sft" loss added with weight 1: RPO, Pang et al. 2024), which keeps the chosen answer's likelihood from falling
DPO_LOSSES = {"dpo": ["sigmoid"], "dpo_nll": ["sigmoid", "sft"]}
SETTINGS_FILE = "post_train_settings.json"
DEFAULT_OUTPUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "post_train")


@dataclass
class Settings:
    """What the post-training numbers depend on (the demo's own settings are its ``DemoConfig``)."""

    quick: bool = False
    num_seeds: int = 3  # the demo's seeds 42, 43, ...
    stage1_steps: int | None = None  # None: the demo's
    stage2_steps: int | None = None  # None: the demo's (150): held-out accuracy near 0.5, room to improve
    rl_rows: int = 1024  # training-split questions GRPO and DPO draw from (a seeded subset of instruct.json)
    grpo_steps: int = 200
    grpo_prompts: int = 16  # questions a step; each sampled num_generations times
    num_generations: int = 8
    max_completion_length: int = 6  # every answer is one or two words and the end-of-turn token
    temperature: float = 1.0
    grpo_lr: float = 3e-4
    grpo_beta: float = 0.0  # TRL's default: no reference model, no KL term
    dpo_steps: int = 300  # both DPO methods
    dpo_batch_size: int = 16
    dpo_lr: float = 3e-4
    dpo_beta: float = 0.1

    @classmethod
    def quick_settings(cls) -> Settings:
        return cls(quick=True, num_seeds=2, rl_rows=64, grpo_steps=2, grpo_prompts=2, num_generations=4,
                   dpo_steps=2, dpo_batch_size=4)


# --------------------------------------------------------------------------------------------- the demo's runs


def demo_config(settings: Settings):
    """The demo's settings (``--quick``: its CI sizes) for the two rows, with this script's seeds and stage sizes."""
    from llava_normaligned.demo.run import DemoConfig

    config = DemoConfig.quick() if settings.quick else DemoConfig.full()
    overrides = {"num_seeds": settings.num_seeds, "rows": VARIANT_KEYS}
    for name in ("stage1_steps", "stage2_steps"):
        if getattr(settings, name) is not None:
            overrides[name] = getattr(settings, name)
    return dataclasses.replace(config, **overrides)


@dataclass
class Inputs:
    """What every run reads: the demo's folder (``WORK_DIR/demo``), config, parts, data and test rows, and the folder
    of the post-training runs (``WORK_DIR/post``)."""

    post_root: str
    paths: object
    config: object
    parts: object
    dataset: object  # synthetic.DatasetPaths
    datasets: dict
    test_rows: list


def load_inputs(work_dir: str, settings: Settings) -> Inputs:
    """The demo's data and parts in ``work_dir`` (made, or reused when it holds them with the same settings)."""
    from llava_normaligned.demo.parts import build_parts
    from llava_normaligned.demo.run import ensure_dataset, prepare_folder
    from llava_normaligned.demo.scoring import load_test_rows
    from llava_normaligned.trainer.data import load_llava_json

    config = demo_config(settings)
    paths = prepare_folder(os.path.join(work_dir, "demo"), config)
    dataset = ensure_dataset(paths, config.data, progress=False)
    parts = build_parts(paths.parts, config.parts, progress=False)
    datasets = {"pretrain": load_llava_json(dataset.pretrain, dataset.root),
                "instruct": load_llava_json(dataset.instruct, dataset.root)}
    return Inputs(os.path.join(work_dir, "post"), paths, config, parts, dataset, datasets,
                  load_test_rows(dataset.test, dataset.root))


def stage2_run(inputs: Inputs, key: str, seed: int, position: tuple[int, int]) -> dict:
    """The demo's run of row ``key`` with ``seed`` (stage 1, stage 2, scoring; its ``result.json``, reused)."""
    from llava_normaligned.demo.parts import VARIANTS
    from llava_normaligned.demo.run import run_group

    variant = next(v for v in VARIANTS if v.key == key)
    return run_group([variant], inputs.parts, inputs.datasets, inputs.test_rows, inputs.paths, inputs.config,
                     [position], False, seed)[0]


# ------------------------------------------------------------------------------------------- post-training


def rl_source_rows(inputs: Inputs, settings: Settings, seed: int) -> list[dict]:
    """``settings.rl_rows`` rows of the training split's questions (``instruct.json``), drawn with ``seed``."""
    import random

    with open(inputs.dataset.instruct, encoding="utf-8") as handle:
        rows = json.load(handle)
    return random.Random(seed).sample(rows, min(settings.rl_rows, len(rows)))


def trainer_settings(method: str, folder: str, settings: Settings, config, seed: int) -> dict:
    """The fields GRPOConfig and DPOConfig share: CPU, the demo's precision (``compute_dtype``), cosine schedule,
    no checkpoints, a log line every step."""
    steps = settings.grpo_steps if method == "grpo" else settings.dpo_steps
    return {"output_dir": folder, "max_steps": steps, "learning_rate": settings.grpo_lr if method == "grpo"
            else settings.dpo_lr, "lr_scheduler_type": "cosine", "warmup_steps": config.warmup, "weight_decay": 0.0,
            "logging_steps": 1, "save_strategy": "no", "report_to": [], "use_cpu": True,
            "bf16": config.compute_dtype == "bfloat16", "fp16": False, "gradient_checkpointing": False,
            "seed": seed, "data_seed": seed, "dataloader_num_workers": 0, "disable_tqdm": True}


def make_trainer(method: str, model, processor, rows: list[dict], inputs: Inputs, settings: Settings, folder: str,
                 seed: int, callback):
    from trl import DPOConfig, DPOTrainer, GRPOConfig, GRPOTrainer

    from llava_normaligned.trainer.rewards import exact_answer
    from llava_normaligned.trainer.rl_data import preference_rows, prompt_rows

    common = trainer_settings(method, folder, settings, inputs.config, seed)
    if method == "grpo":
        args = GRPOConfig(**common, per_device_train_batch_size=settings.grpo_prompts * settings.num_generations,
                          num_generations=settings.num_generations,
                          max_completion_length=settings.max_completion_length, temperature=settings.temperature,
                          beta=settings.grpo_beta)
        return GRPOTrainer(model=model, reward_funcs=[exact_answer], args=args, processing_class=processor,
                           train_dataset=prompt_rows(rows, inputs.dataset.root), callbacks=[callback])
    args = DPOConfig(**common, per_device_train_batch_size=settings.dpo_batch_size, beta=settings.dpo_beta,
                     loss_type=DPO_LOSSES[method])
    return DPOTrainer(model=model, args=args, processing_class=processor,
                      train_dataset=preference_rows(rows, inputs.dataset.root, seed=seed), callbacks=[callback])


def score(model, processor, inputs: Inputs) -> dict:
    """The demo's scoring of the held-out test split: accuracy per template and average, real and blank images."""
    from llava_normaligned.demo.run import compute_autocast
    from llava_normaligned.demo.scoring import score_model

    config = inputs.config
    with compute_autocast(config):
        scores = score_model(model.eval(), processor, inputs.test_rows, image_size=config.data.image_size,
                             batch_size=config.eval_batch_size, progress=False)
    return {"accuracy": scores.accuracy, "visual_gain": scores.visual_gain, "examples": scores.examples}


def log_values(history: list[dict], name: str) -> list[float]:
    """The per-step values of ``name`` in a Trainer's ``log_history`` (one entry a step: ``logging_steps`` 1)."""
    return [float(entry[name]) for entry in history if name in entry]


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def post_train(method: str, stage2: dict, inputs: Inputs, settings: Settings, seed: int) -> dict:
    """``method`` from the saved stage-2 model of ``stage2`` (a demo run's row), then the same scoring; the run's
    record (also ``result.json`` in its folder, read instead of training again)."""
    from llava_normaligned.demo.run import frozen_heap, norm_ratio, probe_pixels, trainer_console_to
    from llava_normaligned.loading import load_model
    from llava_normaligned.trainer.callbacks import NormTrackingCallback

    folder = os.path.join(inputs.post_root, stage2["key"], f"seed{seed}", method)
    done = os.path.join(folder, "result.json")
    if os.path.exists(done):
        with open(done, encoding="utf-8") as handle:
            return json.load(handle)
    start = time.perf_counter()
    torch.manual_seed(seed)
    model, processor = load_model(os.path.join(inputs.paths.root, stage2["checkpoint"]), for_training=True)
    pixels = probe_pixels(processor, inputs.test_rows, inputs.config.probe_images)
    ratio_before = norm_ratio(model, pixels)
    callback = NormTrackingCallback()
    rows = rl_source_rows(inputs, settings, seed)
    with trainer_console_to(os.path.join(folder, "trainer_log.txt")), frozen_heap():
        trainer = make_trainer(method, model, processor, rows, inputs, settings, folder, seed, callback)
        output = trainer.train()
    train_seconds = time.perf_counter() - start
    model = trainer.model
    history = trainer.state.log_history
    tracked = log_values(history, "norm/vision_text_ratio")
    record = {
        "method": method, "key": stage2["key"], "seed": seed,
        "train_rows": len(trainer.train_dataset),
        "steps": trainer.state.global_step,
        "train_loss": output.metrics.get("train_loss"),
        "norm_ratio": {"before": ratio_before, "after": norm_ratio(model, pixels)},
        "tracked_ratio": {"first": tracked[0] if tracked else None, "last": tracked[-1] if tracked else None,
                          "batches_counted": callback.batches_counted},
        **score(model, processor, inputs),
    }
    if method == "grpo":
        rewards = log_values(history, "reward")
        quarter = max(1, len(rewards) // 4)
        record["reward"] = {"per_step": rewards, "mean": _mean(rewards), "first_quarter": _mean(rewards[:quarter]),
                            "last_quarter": _mean(rewards[-quarter:])}
    else:
        record["preference"] = {name: log_values(history, f"rewards/{name}")  # per step, on the training pairs
                                for name in ("accuracies", "margins")}
    record["seconds"] = {"train": train_seconds, "total": time.perf_counter() - start}
    os.makedirs(folder, exist_ok=True)
    from llava_normaligned.atomic_files import write_json_atomic

    write_json_atomic(done, record, indent=1)
    return record


def run_one(inputs: Inputs, settings: Settings, key: str, seed: int, position: tuple[int, int]) -> dict:
    """One variant with one seed: the demo's stage 1 + stage 2 + scoring, then GRPO and DPO from that model."""
    stage2 = stage2_run(inputs, key, seed, position)
    print(f"[{position[0]}/{position[1]}] {stage2['name']}, seed {seed}: stage 2 held-out accuracy "
          f"{stage2['accuracy']['real']['avg']:.3f}", file=sys.stderr, flush=True)
    runs = {}
    for method in METHODS:
        runs[method] = post_train(method, stage2, inputs, settings, seed)
        print(f"[{position[0]}/{position[1]}] {stage2['name']}, seed {seed}: after {METHOD_NAMES[method]} "
              f"{runs[method]['accuracy']['real']['avg']:.3f}", file=sys.stderr, flush=True)
    return {"key": key, "name": stage2["name"], "seed": seed,
            "stage2": {"accuracy": stage2["accuracy"], "visual_gain": stage2["visual_gain"],
                       "norm_ratio": stage2["norm_ratio"]["after_stage2"], "checkpoint": stage2["checkpoint"],
                       "seconds": stage2["seconds"]},
            "post": runs}


# ----------------------------------------------------------------------------------------- processes


_INPUTS: dict = {}  # per worker process: the inputs it read


def _worker(work_dir: str, settings: dict, key: str, seed: int, position: tuple[int, int]) -> dict:
    from llava_normaligned.demo.run import quiet_libraries, torch_threads
    from llava_normaligned.notices import quiet_known_notices

    quiet_known_notices([])
    settings = Settings(**settings)
    with quiet_libraries():
        if _INPUTS.get("root") != work_dir:
            _INPUTS.update(root=work_dir, inputs=load_inputs(work_dir, settings))
        inputs = _INPUTS["inputs"]
        with torch_threads(inputs.config.threads):
            return run_one(inputs, settings, key, seed, position)


def run_all(work_dir: str, settings: Settings, workers: int) -> list[dict]:
    """Every (variant, seed), ``workers`` at a time (spawned processes of one torch thread each, as the demo's); the
    numbers do not depend on ``workers``: each run is seeded and single-threaded."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    seeds = demo_config(settings).seeds
    jobs = [(key, seed) for seed in seeds for key in VARIANT_KEYS]
    positions = {job: (i + 1, len(jobs)) for i, job in enumerate(jobs)}
    if workers <= 1:
        return [_worker(work_dir, asdict(settings), key, seed, positions[(key, seed)]) for key, seed in jobs]
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=context) as pool:
        futures = [pool.submit(_worker, work_dir, asdict(settings), key, seed, positions[(key, seed)])
                   for key, seed in jobs]
        return [future.result() for future in futures]


# ------------------------------------------------------------------------------------------------ summary


def summarise(runs: list[dict]) -> dict:
    """Per variant and method: held-out accuracy before (stage 2) and after, mean ± 95% interval over seeds, the
    paired after-minus-before difference; blank-image accuracy likewise; the norm ratios; GRPO's mean reward. Per
    method: target init + GWC minus w/o Norm in that difference, paired by seed."""
    from llava_normaligned.demo.stats import mean_interval, paired_difference

    def of(key):
        return sorted((r for r in runs if r["key"] == key), key=lambda r: r["seed"])

    out = {"variants": {}, "gwc_minus_no_norm": {}}
    for key in VARIANT_KEYS:
        mine = of(key)
        if not mine:
            continue
        entry = {"name": mine[0]["name"], "seeds": [r["seed"] for r in mine], "methods": {}}
        for method in METHODS:
            block = {}
            for condition in ("real", "blank"):
                before = [r["stage2"]["accuracy"][condition]["avg"] for r in mine]
                after = [r["post"][method]["accuracy"][condition]["avg"] for r in mine]
                block[condition] = {"before": mean_interval(before).to_dict(), "after": mean_interval(after).to_dict(),
                                    "after_minus_before": paired_difference(after, before).to_dict(),
                                    "per_seed": {"before": before, "after": after}}
            block["norm_ratio"] = {
                "before": mean_interval([r["post"][method]["norm_ratio"]["before"] for r in mine]).to_dict(),
                "after": mean_interval([r["post"][method]["norm_ratio"]["after"] for r in mine]).to_dict()}
            if method == "grpo":  # the reward of the sampled completions (temperature 1), on the training prompts
                rewards = [r["post"][method]["reward"] for r in mine]
                block["mean_reward"] = mean_interval([r["mean"] for r in rewards]).to_dict()
                block["reward_first_quarter"] = mean_interval([r["first_quarter"] for r in rewards]).to_dict()
                block["reward_last_quarter"] = mean_interval([r["last_quarter"] for r in rewards]).to_dict()
                block["reward_last_minus_first_quarter"] = paired_difference(
                    [r["last_quarter"] for r in rewards], [r["first_quarter"] for r in rewards]).to_dict()
            entry["methods"][method] = block
        out["variants"][key] = entry
    if all(k in out["variants"] for k in VARIANT_KEYS):
        base, gwc = of(VARIANT_KEYS[0]), of(VARIANT_KEYS[1])
        for method in METHODS:
            out["gwc_minus_no_norm"][method] = paired_difference([_gain(r, method) for r in gwc],
                                                                 [_gain(r, method) for r in base]).to_dict()
    return out


def _gain(run: dict, method: str) -> float:
    """One run's held-out real-image accuracy after ``method`` minus before it."""
    return run["post"][method]["accuracy"]["real"]["avg"] - run["stage2"]["accuracy"]["real"]["avg"]


def _text(entry: dict, signed: bool = False) -> str:
    mean = f"{entry['mean']:+.3f}" if signed else f"{entry['mean']:.3f}"
    return mean if entry.get("half_width") is None else f"{mean} ± {entry['half_width']:.3f}"


def _separated(entry: dict) -> bool:
    return entry.get("half_width") is not None and (entry["low"] > 0 or entry["high"] < 0)


def markdown(document: dict) -> str:
    summary, settings, demo = document["summary"], document["settings"], document["demo_config"]
    env = document["environment"]
    header = (
        f"`{document['command']}` on {env['cpu']} ({env['cpu_count']} cores, torch {env['torch']}, "
        f"{document['workers']} worker process(es) of one torch thread); {document['seconds']:.0f} s. The demo's "
        f"tiny LLaVA, stage 1 {demo['stage1_steps']} steps + stage 2 {demo['stage2_steps']} steps (batch "
        f"{demo['batch_size']}), then from that model GRPO ({settings['grpo_steps']} steps x {settings['grpo_prompts']} "
        f"questions x {settings['num_generations']} samples, reward: exact answer, lr {settings['grpo_lr']:g}, beta "
        f"{settings['grpo_beta']:g}) or DPO, plain or with the chosen answer's NLL added (TRL loss_type sigmoid, or "
        f"sigmoid + sft; {settings['dpo_steps']} steps x {settings['dpo_batch_size']} pairs, lr {settings['dpo_lr']:g}, beta "
        f"{settings['dpo_beta']:g}) on {settings['rl_rows']} training-split questions. "
        f"Held-out accuracy: the demo's test split ({document['test_questions']} questions, greedy, exact match; "
        "chance 0.25), the same before and after. Mean ± 95% interval over seeds "
        f"{document['seeds']} (Student's t); * = the paired interval excludes 0."
    )
    lines = [
        "# GRPO and DPO after stage 2: w/o Norm vs target init + GWC",
        "",
        header,
        "",
        ("| variant | method | before (stage 2) | after | after - before | blank images before / after "
         "| vision/text norm ratio before / after | mean GRPO reward |"),
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for entry in summary["variants"].values():
        for method, block in entry["methods"].items():
            real, blank, ratio = block["real"], block["blank"], block["norm_ratio"]
            diff = real["after_minus_before"]
            reward = _text(block["mean_reward"]) if "mean_reward" in block else "-"
            lines.append(f"| {entry['name']} | {METHOD_NAMES[method]} | {_text(real['before'])} | "
                         f"{_text(real['after'])} | {_text(diff, True)}{' *' if _separated(diff) else ''} | "
                         f"{blank['before']['mean']:.3f} / {blank['after']['mean']:.3f} | "
                         f"{ratio['before']['mean']:.3f} / {ratio['after']['mean']:.3f} | {reward} |")
    lines.append("")
    for entry in summary["variants"].values():
        grpo = entry["methods"].get("grpo")
        if grpo:
            diff = grpo["reward_last_minus_first_quarter"]
            lines.append(f"{entry['name']}: GRPO's reward on its sampled completions, first quarter of the steps "
                         f"{_text(grpo['reward_first_quarter'])}, last quarter {_text(grpo['reward_last_quarter'])} "
                         f"(paired difference {_text(diff, True)}{' *' if _separated(diff) else ''}).")
    for method, diff in summary["gwc_minus_no_norm"].items():
        lines.append(f"{METHOD_NAMES[method]}: target init + GWC minus w/o Norm in after - before, paired by seed: "
                     f"{_text(diff, True)} ({'separated from 0' if _separated(diff) else 'not separated from 0'}).")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------------- CLI


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output-dir", default=DEFAULT_OUTPUT,
                        help="where results.json and summary.md go (default benchmarks/results/post_train)")
    parser.add_argument("--work-dir", default=os.path.join(tempfile.gettempdir(), "llava_normaligned_post_train"),
                        help="the demo's data, parts and every model (reused when it holds the same settings)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: the whole pipeline in well under a minute")
    parser.add_argument("--workers", type=int, default=None,
                        help="processes side by side (default: the demo's, one per core, at most 2)")
    defaults = Settings()
    for field in dataclasses.fields(Settings):
        if field.name == "quick":
            continue
        flag = "--" + field.name.replace("_", "-")
        kind = {"float": float, "str": str}.get(field.type, int)
        parser.add_argument(flag, type=kind, default=None,
                            help=f"default {getattr(defaults, field.name)}"
                            + (" (the demo's)" if field.name.startswith("stage") else ""))
    return parser


def settings_from_args(args: argparse.Namespace) -> Settings:
    settings = Settings.quick_settings() if args.quick else Settings()
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(Settings)
             if f.name != "quick" and getattr(args, f.name) is not None}
    for name, value in given.items():
        if isinstance(value, str):
            continue
        if value < 0 or (value == 0 and name not in ("grpo_beta", "dpo_beta", "temperature")):
            raise ValueError(f"--{name.replace('_', '-')} must be positive, got {value}")
    return dataclasses.replace(settings, **given)


def check_work_dir(work_dir: str, settings: Settings) -> None:
    """A work folder holds one setting's runs: another setting is an error (the demo checks its own part)."""
    path = os.path.join(work_dir, SETTINGS_FILE)
    wanted = asdict(settings)
    if os.path.exists(path):
        with open(path, encoding="utf-8") as handle:
            if json.load(handle) != wanted:
                raise FileExistsError(f"--work-dir {work_dir} holds runs with other settings ({SETTINGS_FILE} "
                                      "differs); use another folder")
        return
    from llava_normaligned.atomic_files import write_json_atomic

    os.makedirs(work_dir, exist_ok=True)
    write_json_atomic(path, wanted, indent=1)


def main(argv: list[str] | None = None) -> int:
    from llava_normaligned.demo.run import default_workers, environment

    parser = make_parser()
    args = parser.parse_args(argv)
    try:
        settings = settings_from_args(args)
        if args.workers is not None and args.workers < 1:
            raise ValueError(f"--workers must be positive, got {args.workers}")
        check_work_dir(args.work_dir, settings)
    except (ValueError, FileExistsError) as error:
        parser.error(str(error))
    workers = default_workers() if args.workers is None else args.workers
    start = time.perf_counter()
    load_start = os.getloadavg()[0]
    from llava_normaligned.demo.run import quiet_libraries, torch_threads

    # data and parts once, before the workers read them; on the demo's thread count, as the demo pre-trains its parts
    with quiet_libraries(), torch_threads(demo_config(settings).threads):
        inputs = load_inputs(args.work_dir, settings)
    runs = run_all(args.work_dir, settings, workers)
    import transformers
    import trl

    environment_now = {**environment(), "transformers": transformers.__version__, "trl": trl.__version__,
                       "load_average_start": load_start, "load_average_end": os.getloadavg()[0]}
    document = {
        "command": "python benchmarks/post_train.py" + ("" if argv is None and len(sys.argv) < 2 else " ")
        + " ".join(sys.argv[1:] if argv is None else argv),
        "settings": asdict(settings),
        "demo_config": inputs.config.to_dict(),
        "variants": list(VARIANT_KEYS),
        "seeds": inputs.config.seeds,
        "test_questions": len(inputs.test_rows),
        "workers": workers,
        "environment": environment_now,
        "runs": runs,
        "summary": summarise(runs),
        "seconds": time.perf_counter() - start,
    }
    from llava_normaligned.atomic_files import write_json_atomic

    os.makedirs(args.output_dir, exist_ok=True)
    write_json_atomic(os.path.join(args.output_dir, "results.json"), document, indent=1)
    text = markdown(document)
    with open(os.path.join(args.output_dir, "summary.md"), "w", encoding="utf-8") as handle:
        handle.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
