"""Start-up at the paper's scale: each up-front phase of ``train`` on LLaVA-558K- and mix665k-shaped data, against
the floor measured in the same run; the end-to-end 2-step ``train`` runs; and the collator at the paper's shapes.

    python benchmarks/bench_data.py --sizes 10000,100000,full              # phases, both data sets
    python benchmarks/bench_data.py --sizes full --e2e                      # + 2-step `train`, first and second run
    python benchmarks/bench_data.py --collator                              # the collator vs TRL's, SigLIP-384
    python benchmarks/bench_data.py --sizes 10000 --kinds pretrain --drop-caches   # cold files (root, Linux)
    python benchmarks/bench_data.py --sizes full --kinds pretrain --no-phases --image-checks --drop-caches
                                            # each --check-images mode alone on cold files, a process each

Data (``scale_data.py``, generated once into ``--workdir`` and reused): LLaVA-558K-shaped rows (one image, short
captions, images in ~1,000-file folders) and mix665k-shaped rows (multi-turn, long answers, ~6% text-only
ShareGPT rows with a long tail beyond ``max_length``), each image path its own tiny PNG file.

Model parts, built in code (nothing is downloaded): a byte-level BPE tokenizer trained on the generated text
(words of the captions become single tokens, as common English words do in Llama's vocabulary), Llama-3.2's chat
template as shipped (no ``{% generation %}`` markers: answers are located by placeholder rendering), a tiny Llama
and a tiny SigLIP for the ``train`` runs; for the collator, a SigLIP-SO400M-384 image processor (384 px, patch 14:
729 image tokens).

Phases (each in a fresh subprocess, so its peak RSS is its own; ``seconds`` are wall times):

* ``floor``: ``json.load`` + one chat-template render + one fast-tokenizer pass over all rows, one process: the
  least any up-front length check costs (what LLaVA's own loader skips by checking nothing up front);
* ``parse``, ``image_check`` (``load_llava_json``), ``hash``, ``render``, ``filter`` (``prepare_dataset``), first
  with an empty cache, then again with the cache the first pass wrote (``second_*``).

Each figure is printed with its ratio to the floor. Results: ``benchmarks/results/bench_data_<name>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))  # the vendored Llama-3.2 template

import scale_data

FULL = {"pretrain": scale_data.PRETRAIN_ROWS, "mix": scale_data.MIX_ROWS}
MAX_LENGTH = 2048  # LLaVA-1.5's model_max_length (the recipes')
LLAMA_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                  "<|finetune_right_pad_id|>"]
# published: LLaVA-1.5's README, "Pretrain takes around 5.5 hours for LLaVA-v1.5-13B on 8x A100 (80G)"
PUBLISHED_STAGE1_HOURS = 5.5
PAPER_GLOBAL_BATCH_STAGE1 = 256  # paper Appendix E.1
RECIPE_WORKERS_PER_GPU = 4  # the shipped recipes' dataloader_num_workers


def peak_rss_mib() -> dict:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return {"main_process": round(own, 1), "largest_child": round(children, 1)}


# ------------------------------------------------------------------------------------------------ data and parts


def dataset_files(workdir: str, kind: str, n_rows: int) -> tuple[str, str]:
    """(JSON path, image folder) of ``n_rows`` generated rows of ``kind``, made once and reused."""
    folder = os.path.join(workdir, f"{kind}_{n_rows}")
    path = os.path.join(folder, "data.json")
    images = os.path.join(folder, "images")
    done = os.path.join(folder, "done")
    if not os.path.isfile(done):
        start = time.perf_counter()
        rows = scale_data.pretrain_rows(n_rows) if kind == "pretrain" else scale_data.mix_rows(n_rows)
        scale_data.write_json(rows, path)
        n_images = scale_data.write_images(rows, images)
        with open(done, "w") as handle:
            handle.write(f"{n_rows} rows, {n_images} image files\n")
        print(f"  generated {kind} x {n_rows}: {n_images} image files in {time.perf_counter() - start:.0f} s",
              flush=True)
    return path, images


def train_tokenizer(workdir: str):
    """A byte-level BPE (32K vocabulary cap) trained on the generated text, with Llama 3's special tokens and
    Llama-3.2's chat template; saved once and reused."""
    from transformers import PreTrainedTokenizerFast

    folder = os.path.join(workdir, "tokenizer")
    if os.path.isfile(os.path.join(folder, "tokenizer.json")):
        return PreTrainedTokenizerFast.from_pretrained(folder)
    from test_train_templates import LLAMA_3_2
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=32_000, special_tokens=LLAMA_SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    text = scale_data._Text(random.Random(1))
    corpus = [text.sentences_(50) for _ in range(2_000)]
    corpus += scale_data.BRIEF_PROMPTS + [scale_data.SHORT_ANSWER]
    tok.train_from_iterator(corpus, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>",
                                        pad_token="<|finetune_right_pad_id|>", chat_template=LLAMA_3_2,
                                        model_max_length=131072)
    tokenizer.save_pretrained(folder)
    return tokenizer


def build_parts(workdir: str) -> tuple[str, str]:
    """(vision folder, text folder): a tiny SigLIP (32 px, patch 8: 16 image tokens) and a tiny Llama with the
    bench tokenizer; ``compose`` adds the ``<image>`` token and wraps Llama-3.2's template."""
    from llava_normaligned.tiny import TinyTextSpec, tiny_text_model, tiny_vision_model

    vision_dir, text_dir = os.path.join(workdir, "parts", "vision"), os.path.join(workdir, "parts", "text")
    if not os.path.isfile(os.path.join(text_dir, "config.json")):
        tokenizer = train_tokenizer(workdir)
        vision, image_processor = tiny_vision_model()
        vision.save_pretrained(vision_dir)
        image_processor.save_pretrained(vision_dir)
        lm = tiny_text_model(tokenizer, TinyTextSpec(max_position_embeddings=4096))
        lm.save_pretrained(text_dir)
        tokenizer.save_pretrained(text_dir)
    return vision_dir, text_dir


def composed(workdir: str):
    """The composed tiny model folder (``train --model`` for stage 2) and its processor."""
    from transformers import AutoProcessor

    from llava_normaligned.compose import compose, save

    folder = os.path.join(workdir, "parts", "composed")
    if not os.path.isfile(os.path.join(folder, "config.json")):
        model, processor = compose(*build_parts(workdir))
        save(model, processor, folder)
    return folder, AutoProcessor.from_pretrained(folder, trust_remote_code=True)


# ------------------------------------------------------------------------------------------------------ phases


def measure_floor(path: str, processor) -> dict:
    """json.load + one chat-template render + one fast-tokenizer pass over every row, in one process."""
    from llava_normaligned.trainer.data import LLAVA_ROLES
    from llava_normaligned.trainer.masking import template_messages
    from transformers.utils.chat_template_utils import render_jinja_template

    out = {}
    start = time.perf_counter()
    with open(path, encoding="utf-8") as handle:
        rows = json.load(handle)
    out["json_load"] = time.perf_counter() - start
    start = time.perf_counter()
    texts = []
    template, specials = processor.chat_template, dict(processor.tokenizer.special_tokens_map)
    for row in rows:
        messages = [{"role": LLAVA_ROLES[t["from"]], "content": t["value"].replace("<image>", "")}
                    for t in row["conversations"]]
        parts = template_messages(messages, 1 if "image" in row else 0)
        texts.append(render_jinja_template(conversations=[parts], chat_template=template, **specials)[0][0])
    out["chat_template"] = time.perf_counter() - start
    start = time.perf_counter()
    backend = processor.tokenizer.backend_tokenizer
    for first in range(0, len(texts), 4096):
        backend.encode_batch_fast(texts[first : first + 4096], add_special_tokens=False)
    out["tokenizer"] = time.perf_counter() - start
    out["total"] = sum(out.values())
    return {k: round(v, 2) for k, v in out.items()}


def drop_caches() -> bool:
    try:
        subprocess.run(["sync"], check=True)
        with open("/proc/sys/vm/drop_caches", "w") as handle:
            handle.write("3\n")
        return True
    except OSError:
        return False


def phase_child(args) -> dict:
    """One data set, one size, in this (fresh) process: the floor, then the phases twice (empty cache, then warm)."""
    from llava_normaligned.trainer.data import load_llava_json
    from llava_normaligned.trainer.preprocess import prepare_dataset

    _, processor = composed(args.workdir)
    path, images = dataset_files(args.workdir, args.kind, args.n)
    result = {"kind": args.kind, "rows": args.n, "drop_caches": False}
    cache = tempfile.mkdtemp(prefix="bench_data_cache_", dir=args.workdir)
    if args.drop_caches:
        result["drop_caches"] = drop_caches()  # cold files for the first pass's image check
    for attempt in ("first", "second"):
        start = time.perf_counter()
        dataset, report = load_llava_json(path, images, check_images=args.check_images, return_report=True,
                                          cache_dir=os.path.join(cache, "loaded"))
        load_seconds = time.perf_counter() - start
        start = time.perf_counter()
        prepared, prep = prepare_dataset(dataset, processor, max_length=MAX_LENGTH, drop_text_only=args.kind == "pretrain",
                                         cache_dir=os.path.join(cache, "prepared"), fast_render=args.render != "exact")
        prepare_seconds = time.perf_counter() - start
        result[attempt] = {
            "load": round(load_seconds, 2), "prepare": round(prepare_seconds, 2),
            "total": round(load_seconds + prepare_seconds, 2), **report.seconds, **prep.seconds,
            "image_check_mode": report.image_check, "read_from_cache": [report.read_from_cache, prep.read_from_cache],
            "rendering": prep.rendering, "rows_rendered_fast": prep.rows_rendered_fast,
        }
        result["rows"] = {"read": report.rows_read, "kept_by_load": report.rows_kept, "to_train": prep.rows_out,
                          "too_long_dropped": prep.too_long_dropped, "text_only_dropped": prep.text_only_dropped,
                          "text_only_rows": prep.text_only_rows, "longest_row_tokens": prep.longest_row_tokens}
        if attempt == "first" and args.render == "both":  # the same rendering with every row through jinja
            start = time.perf_counter()
            _, exact = prepare_dataset(dataset, processor, max_length=MAX_LENGTH,
                                       drop_text_only=args.kind == "pretrain", fast_render=False,
                                       cache_dir=os.path.join(cache, "prepared_jinja"))
            result["first_jinja"] = {"prepare": round(time.perf_counter() - start, 2), **exact.seconds,
                                     "rendering": exact.rendering, "rows_out": exact.rows_out}
            assert exact.rows_out == prep.rows_out and exact.longest_row_tokens == prep.longest_row_tokens
        del dataset, prepared
    result["peak_rss_mib_phases"] = peak_rss_mib()
    result["floor"] = measure_floor(path, processor)
    result["peak_rss_mib_with_floor"] = peak_rss_mib()
    return result


def run_phases(args, kind: str, n_rows: int) -> dict:
    command = [sys.executable, os.path.abspath(__file__), "--_phase-child", "--kind", kind, "--n", str(n_rows),
               "--workdir", args.workdir, "--check-images", args.check_images, "--render", args.render]
    if args.drop_caches:
        command.append("--drop-caches")
    out = subprocess.run(command, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"phase run {kind} x {n_rows} failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def print_phases(result: dict) -> None:
    floor = result["floor"]["total"]
    print(f"\n{result['kind']} x {result['rows']['read']} rows (floor {floor:.1f} s = json.load "
          f"{result['floor']['json_load']:.1f} + template {result['floor']['chat_template']:.1f} + tokenizer "
          f"{result['floor']['tokenizer']:.1f}); rows: {result['rows']}")
    for attempt in ("first", "second"):
        timing = result[attempt]
        parts = "  ".join(f"{k} {timing[k]:.1f}s ({timing[k] / floor:.2f}x)" for k in
                          ("parse", "image_check", "hash", "render", "filter", "total") if k in timing)
        print(f"  {attempt:6s} {parts}  [images: {timing['image_check_mode']}; rendering: {timing.get('rendering')}, "
              f"{timing.get('rows_rendered_fast')} rows fast]")
    if "first_jinja" in result:
        jinja = result["first_jinja"]
        print(f"  jinja  render {jinja['render']:.1f}s ({jinja['render'] / floor:.2f}x): fast path "
              f"{result['first']['render'] / jinja['render']:.2f}x of it")
    print(f"  peak RSS MiB: {result['peak_rss_mib_phases']}")


def image_check_child(args) -> dict:
    """``load_llava_json`` once with one ``--check-images`` mode and no cache, in this fresh process: the parse and
    the image check, the page cache dropped first when asked (every image file cold)."""
    from llava_normaligned.trainer.data import load_llava_json

    path, images = dataset_files(args.workdir, args.kind, args.n)
    dropped = drop_caches() if args.drop_caches else False
    start = time.perf_counter()
    _, report = load_llava_json(path, images, check_images=args.check_images, return_report=True)
    wall = time.perf_counter() - start
    return {"kind": args.kind, "rows": args.n, "mode": args.check_images, "resolved_mode": report.image_check,
            "drop_caches": dropped, "wall_s": round(wall, 2), **{k: round(v, 2) for k, v in report.seconds.items()},
            "rows_kept": report.rows_kept, "peak_rss_mib": peak_rss_mib()["main_process"]}


def run_image_checks(args, kind: str, n_rows: int) -> list[dict]:
    """Each image-check mode on the same files, cold when ``--drop-caches``: ``none`` (the parse alone), ``exists``,
    ``open``, and the default ``auto``."""
    results = []
    for mode in ("none", "exists", "open", "auto"):
        command = [sys.executable, os.path.abspath(__file__), "--_image-check-child", "--kind", kind, "--n",
                   str(n_rows), "--workdir", args.workdir, "--check-images", mode]
        if args.drop_caches:
            command.append("--drop-caches")
        out = subprocess.run(command, capture_output=True, text=True, check=False)
        if out.returncode != 0:
            raise RuntimeError(f"image check {mode} on {kind} x {n_rows} failed:\n{out.stderr[-4000:]}")
        result = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"  images {kind} x {n_rows} --check-images {mode} ({result['resolved_mode']}, "
              f"{'cold' if result['drop_caches'] else 'warm'}): image check {result.get('image_check', 0.0):.1f} s, "
              f"parse {result.get('parse', 0.0):.1f} s, wall {result['wall_s']:.1f} s", flush=True)
        results.append(result)
    return results


# ------------------------------------------------------------------------------------------------- end to end


def run_train(command: list[str], env: dict) -> dict:
    start = time.perf_counter()
    out = subprocess.run(["/usr/bin/time", "-f", "%M", *command], capture_output=True, text=True, env=env,
                         check=False)
    wall = time.perf_counter() - start
    lines = out.stderr.strip().splitlines()
    peak = int(lines[-1]) / 1024 if lines and lines[-1].isdigit() else None
    if out.returncode != 0:
        raise RuntimeError(f"train failed ({out.returncode}):\n{out.stderr[-4000:]}")
    logged = [line for line in lines if "llava_normaligned" in line and (" in " in line or "prepared:" in line)]
    return {"wall_s": round(wall, 1), "peak_rss_mib": round(peak, 1) if peak else None, "log": logged[-12:]}


def end_to_end(args, kind: str, n_rows: int) -> dict:
    """2-step ``llava-normaligned train`` runs: first (empty caches) and second (the same run again)."""
    path, images = dataset_files(args.workdir, kind, n_rows)
    vision_dir, text_dir = build_parts(args.workdir)
    model_dir, _ = composed(args.workdir)
    cache = tempfile.mkdtemp(prefix="bench_data_hf_", dir=args.workdir)
    env = {**os.environ, "HF_DATASETS_CACHE": cache, "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    stage = 1 if kind == "pretrain" else 2
    model = ["--vision-model", vision_dir, "--text-model", text_dir] if stage == 1 else ["--model", model_dir]
    command = [sys.executable, "-m", "llava_normaligned.cli", "train", "--stage", str(stage), *model,
               "--data-path", path, "--image-folder", images, "--max_steps", "2",
               "--per_device_train_batch_size", "4", "--max_length", str(MAX_LENGTH), "--report_to", "none",
               "--save_strategy", "no", "--gradient_checkpointing", "False", "--dataloader_num_workers", "0",
               "--render", "exact" if args.render == "exact" else "fast"]
    result = {"kind": kind, "rows": n_rows, "stage": stage, "cpus": os.cpu_count()}
    attempt = None
    for attempt in ("first", "second"):
        output = tempfile.mkdtemp(prefix="bench_data_run_", dir=args.workdir)
        if attempt == "first" and args.drop_caches:
            result["drop_caches"] = drop_caches()
        result[attempt] = run_train([*command, "--output-dir", output], env)
        with open(os.path.join(output, "training_summary.json")) as handle:
            summary = json.load(handle)
        result[attempt]["data"] = {"load": {k: summary["data"]["load"][k] for k in
                                            ("rows_read", "rows_kept", "image_check", "read_from_cache", "seconds")},
                                   "prepare": {k: summary["data"]["prepare"][k] for k in
                                               ("rows_out", "too_long_dropped", "text_only_dropped",
                                                "read_from_cache", "seconds")}}
        print(f"  e2e {kind} x {n_rows} stage {stage} {attempt}: {result[attempt]['wall_s']} s wall, peak RSS "
              f"{result[attempt]['peak_rss_mib']} MiB", flush=True)
    result["tokenizer_pass"] = tokenizer_pass(os.path.join(cache, "llava_normaligned_prepared"), model_dir)
    print(f"  the tokenizer alone over the rows the run rendered: {result['tokenizer_pass']}", flush=True)
    return result


def tokenizer_pass(prepared_dir: str, model_dir: str, every: int = 10) -> dict:
    """The share of the rendering that is the tokenizer's: one fast-tokenizer pass (one thread, as in each
    rendering process) over every ``every``-th row the run rendered, scaled to all rows and spread over the cores
    (the rendering runs one process per core): the least the up-front token count can take on this machine."""
    code = f"""
import glob, json, os, time
os.environ["TOKENIZERS_PARALLELISM"] = "false"
from datasets import Dataset, concatenate_datasets
from transformers import AutoTokenizer
files = sorted(glob.glob(os.path.join({prepared_dir!r}, "*.arrow")))
rendered = concatenate_datasets([Dataset.from_file(f) for f in files]).data.column("rendered")
texts = [t for t in rendered.take(list(range(0, len(rendered), {every}))).to_pylist() if t]
backend = AutoTokenizer.from_pretrained({model_dir!r}, trust_remote_code=True).backend_tokenizer
start = time.perf_counter()
for first in range(0, len(texts), 256):
    backend.encode_batch_fast(texts[first:first + 256], add_special_tokens=False)
seconds = time.perf_counter() - start
print(json.dumps({{"rows_sampled": len(texts), "rows": len(rendered), "sample_seconds": round(seconds, 2),
                  "all_rows_one_core_s": round(seconds * len(rendered) / len(texts), 1),
                  "all_rows_all_cores_s": round(seconds * len(rendered) / len(texts) / (os.cpu_count() or 1), 1)}}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        return {"error": (out.stdout + out.stderr)[-2000:]}
    return json.loads(lines[-1])


# --------------------------------------------------------------------------------------------------- collator


def siglip_384_processor(tokenizer):
    """A LlavaProcessor with SigLIP-SO400M-patch14-384's image processing (384 px, patch 14, no CLS: 729 tokens)."""
    from transformers import LlavaProcessor
    from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil

    image_processor = SiglipImageProcessorPil(size={"height": 384, "width": 384}, resample=3, do_normalize=True,
                                              image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5],
                                              do_rescale=True, rescale_factor=1 / 255)
    from llava_normaligned.compose import multimodal_chat_template

    tokenizer = tokenizer.__class__.from_pretrained(tokenizer.name_or_path) if tokenizer.name_or_path else tokenizer
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
    tokenizer.image_token = "<image>"
    tokenizer.image_token_id = tokenizer.convert_tokens_to_ids("<image>")
    template = multimodal_chat_template(tokenizer.chat_template, tokenizer)
    return LlavaProcessor(image_processor=image_processor, tokenizer=tokenizer, patch_size=14,
                          vision_feature_select_strategy="full", num_additional_image_tokens=0,
                          chat_template=template)


def collator_bench(args) -> dict:
    """Samples/s of one data-loader worker (this process) for this package's collator and TRL's, same rows."""
    import statistics

    import torch
    from llava_normaligned.trainer.collator import LlavaTrainingCollator
    from llava_normaligned.trainer.data import load_llava_json
    from llava_normaligned.trainer.preprocess import image_tokens_per_image, prepare_dataset
    from PIL import Image
    from trl.trainer.sft_trainer import DataCollatorForVisionLanguageModeling

    torch.set_num_threads(1)  # a data-loader worker
    processor = siglip_384_processor(train_tokenizer(args.workdir))
    per_image = image_tokens_per_image(processor)
    folder = os.path.join(args.workdir, "collator")
    os.makedirs(folder, exist_ok=True)
    rows = scale_data.pretrain_rows(args.collator_rows, seed=3)
    for k, row in enumerate(rows):  # COCO-sized JPEGs (500 x 375), a few distinct ones
        row["image"] = f"{k % 16}.jpg"
    for k in range(16):
        image = Image.effect_noise((500, 375), 40 + k).convert("RGB")
        image.save(os.path.join(folder, f"{k}.jpg"), quality=90)
    path = scale_data.write_json(rows, os.path.join(folder, "rows.json"))
    dataset = load_llava_json(path, folder)
    prepared, _ = prepare_dataset(dataset, processor, max_length=MAX_LENGTH)
    ours = LlavaTrainingCollator(processor, max_length=MAX_LENGTH)
    trl = DataCollatorForVisionLanguageModeling(processor)
    batch_size = args.collator_batch
    ours_rows = [prepared[i] for i in range(len(prepared))]
    trl_rows = [{"messages": dataset[i]["messages"], "images": dataset[i]["images"]} for i in range(len(dataset))]
    # TRL decodes nothing itself: its rows hold PIL images, decoded from the same files per batch here (as a
    # datasets Image column does on access) so that both collators pay the same JPEG decoding
    trl_paths = [dataset.with_format("arrow")[i]["images"].to_pylist()[0][0]["path"] for i in range(len(dataset))]

    def ours_batches():
        for first in range(0, len(ours_rows) - batch_size + 1, batch_size):
            ours(ours_rows[first : first + batch_size])

    def trl_batches():
        for first in range(0, len(trl_rows) - batch_size + 1, batch_size):
            batch = [{"messages": trl_rows[i]["messages"], "images": [Image.open(trl_paths[i])]}
                     for i in range(first, first + batch_size)]
            trl(batch)

    rates = {"ours": [], "trl": []}
    samples = (len(ours_rows) // batch_size) * batch_size
    for repeat in range(args.repeats):
        order = (("ours", ours_batches), ("trl", trl_batches)) if repeat % 2 == 0 else \
            (("trl", trl_batches), ("ours", ours_batches))
        for name, run in order:
            start = time.perf_counter()
            run()
            rates[name].append(samples / (time.perf_counter() - start))
    ours_rate, trl_rate = statistics.median(rates["ours"]), statistics.median(rates["trl"])
    step_s = PUBLISHED_STAGE1_HOURS * 3600 / (scale_data.PRETRAIN_ROWS / PAPER_GLOBAL_BATCH_STAGE1)
    needed = PAPER_GLOBAL_BATCH_STAGE1 / step_s
    per_worker = needed / (8 * RECIPE_WORKERS_PER_GPU)
    batch = ours(ours_rows[:batch_size])
    return {
        "image_tokens_per_image": per_image, "batch_size": batch_size, "rows": samples, "repeats": args.repeats,
        "pixel_values_shape": list(batch["pixel_values"].shape), "sequence_length": int(batch["input_ids"].shape[1]),
        "samples_per_s_per_worker": {"ours": round(ours_rate, 1), "trl": round(trl_rate, 1),
                                     "ratio_ours_over_trl": round(ours_rate / trl_rate, 3)},
        "all_rates": {k: [round(r, 1) for r in v] for k, v in rates.items()},
        "trl_collator": "DataCollatorForVisionLanguageModeling (messages rows; labels = all non-pad tokens, no "
                        "answer masking: it has none for a template without generation markers)",
        "stage1_need_8_gpus": {
            "source": f"published: LLaVA-1.5-13B stage 1 on 8x A100 in ~{PUBLISHED_STAGE1_HOURS} h (LLaVA README)",
            "step_time_s": round(step_s, 2), "samples_per_s_all_gpus": round(needed, 1),
            "samples_per_s_per_gpu": round(needed / 8, 2),
            "samples_per_s_per_worker_at_4_workers_per_gpu": round(per_worker, 2),
            "headroom_ours": round(ours_rate / per_worker, 1),
        },
    }


# ------------------------------------------------------------------------------------------------------- main


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,100000", help="comma-separated row counts, or 'full'")
    parser.add_argument("--kinds", default="pretrain,mix", help="pretrain (LLaVA-558K) and/or mix (mix665k)")
    parser.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "llava_na_bench_data"))
    parser.add_argument("--check-images", default="auto", choices=["auto", "open", "exists", "none"])
    parser.add_argument("--render", default="fast", choices=["fast", "exact", "both"],
                        help="prepare_dataset's rendering (train --render): the fast path, every row through jinja, "
                             "or both (phases: the first run's rendering is also timed through jinja)")
    parser.add_argument("--drop-caches", action="store_true", help="cold files: drop the page cache first (root)")
    parser.add_argument("--no-phases", action="store_true", help="skip the phase timings")
    parser.add_argument("--e2e", action="store_true", help="also time 2-step `train` runs at the largest size")
    parser.add_argument("--image-checks", action="store_true",
                        help="each --check-images mode alone (parse + check, a fresh process each) at the largest size")
    parser.add_argument("--collator", action="store_true", help="the collator at the paper's shapes vs TRL's")
    parser.add_argument("--collator-rows", type=int, default=256)
    parser.add_argument("--collator-batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--name", default=None, help="results file: benchmarks/results/bench_data_<name>.json")
    parser.add_argument("--_phase-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--_image-check-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--kind", help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, help=argparse.SUPPRESS)
    return parser


def main(argv=None) -> int:
    args = make_parser().parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.makedirs(args.workdir, exist_ok=True)
    if args._phase_child:
        import logging

        logging.basicConfig(level=logging.WARNING)
        print(json.dumps(phase_child(args)))
        return 0
    if args._image_check_child:
        print(json.dumps(image_check_child(args)))
        return 0
    kinds = [k for k in args.kinds.split(",") if k]
    name = args.name or ("collator" if args.no_phases and args.collator and not args.e2e else "scale")
    out = os.path.join(HERE, "results", f"bench_data_{name}.json")

    def write():  # after every measurement: a long run interrupted keeps what it measured
        with open(out, "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=1)

    results = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                           "load_average_at_start": list(os.getloadavg())},
               "command": " ".join(["python benchmarks/bench_data.py", *(argv if argv is not None else sys.argv[1:])]),
               "max_length": MAX_LENGTH, "phases": [], "end_to_end": [], "image_checks": []}
    for kind in kinds:
        sizes = [FULL[kind] if s == "full" else int(s) for s in args.sizes.split(",") if s]
        if not args.no_phases:
            for n_rows in sizes:
                result = run_phases(args, kind, n_rows)
                print_phases(result)
                results["phases"].append(result)
                write()
        if args.image_checks:
            results["image_checks"].extend(run_image_checks(args, kind, max(sizes)))
            write()
        if args.e2e:
            results["end_to_end"].append(end_to_end(args, kind, max(sizes)))
            write()
    growth = {}
    for kind in kinds:
        runs = sorted((r for r in results["phases"] if r["kind"] == kind), key=lambda r: r["rows"]["read"])
        if len(runs) >= 2:
            small, large = runs[0], runs[-1]
            scale = large["rows"]["read"] / small["rows"]["read"]
            growth[kind] = {"rows_ratio": round(scale, 2), **{
                phase: round(large["first"][phase] / max(small["first"][phase], 1e-3), 2)
                for phase in ("parse", "image_check", "hash", "render", "filter", "total") if phase in small["first"]},
                "floor": round(large["floor"]["total"] / small["floor"]["total"], 2)}
    results["growth_first_run"] = growth
    if growth:
        print("\ngrowth (largest / smallest size), first run:", json.dumps(growth))
    if args.collator:
        results["collator"] = collator_bench(args)
        print("\ncollator:", json.dumps(results["collator"], indent=1))
    results["machine"]["load_average_at_end"] = list(os.getloadavg())
    write()
    print(f"\nwritten {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
