"""The inference path: full-precision and bitsandbytes 4/8-bit loading (real bitsandbytes, on CPU), the check of
what is quantized, batched and streamed generation, and the ``generate`` command. Tiny models built in code."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from llava_normaligned.generation import generate_batch, prepare_inputs, stream_answer
from llava_normaligned.hub_cards.selfcheck import run_without_package
from llava_normaligned.loading import (
    KEEP_UNQUANTIZED,
    QUANTIZED_ROOT,
    load_model,
    resolve_device,
    verify_quantization,
)
from llava_normaligned.commands.generate import main
from tests.support.hub_server import HubServer
from tests.support.isolation import run_isolated
from tests.support.messages import error_line, number, one_line
from tests.support.numerics import F32_EPS, assert_close_scaled
from tests.support.processes import CONSOLE

bnb = pytest.importorskip("bitsandbytes")  # a dev install has it (pyproject [dev]); the error path is tested below
BNB_LINEAR = {"4bit": bnb.nn.Linear4bit, "8bit": bnb.nn.Linear8bitLt}
PROMPT = "what colour is the shape in the image ?"
TOKEN = "hf_" + "inferenceTestToken0123456789abcdef"[:34]


def subprocess_env(tmp_path, **extra) -> dict:
    """This environment, offline, with the Hub cache and the remote-code modules in ``tmp_path`` (never in the
    developer's own cache)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING_FACE")) and k != "PYTHONPATH"}
    env.update(
        HF_HOME=str(tmp_path / "hf_home"),
        HF_MODULES_CACHE=str(tmp_path / "hf_modules"),
        HF_HUB_OFFLINE="1",
        HF_HUB_DISABLE_TELEMETRY="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONWARNINGS="ignore",
    )
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """Two small RGB PNGs of different sizes (the processor resizes them)."""
    folder = tmp_path_factory.mktemp("images")
    paths = []
    for seed, (h, w) in enumerate([(40, 40), (30, 52)]):
        pixels = (np.random.RandomState(seed).rand(h, w, 3) * 255).astype("uint8")
        paths.append(str(folder / f"image{seed}.png"))
        Image.fromarray(pixels).save(paths[-1])
    return paths


@pytest.fixture(scope="module")
def full_precision(tiny_model_dir):
    return load_model(tiny_model_dir, device="cpu")


@pytest.fixture(scope="module", params=["4bit", "8bit"])
def quantized(request, tiny_model_dir):
    model, processor, report = load_model(tiny_model_dir, quantization=request.param, device="cpu", return_report=True)
    return request.param, model, processor, report


# ------------------------------------------------------------------------------------------ what is quantized


def test_quantized_load_keeps_precise_modules_and_quantizes_llm(quantized, full_precision):
    mode, model, _, report = quantized
    fp_model, _ = full_precision
    for path in KEEP_UNQUANTIZED:
        kept = model.get_submodule(path)
        assert not [n for n, m in kept.named_modules() if type(m).__module__.startswith("bitsandbytes")], path
        assert all(p.dtype == torch.float32 for p in kept.parameters()), path
    assert model.model.multi_modal_projector.norm is not None
    # Every nn.Linear of the full-precision LLM is a bnb layer of the requested kind in the quantized one.
    fp_linears = sorted(
        f"{QUANTIZED_ROOT}.{n}"
        for n, m in fp_model.get_submodule(QUANTIZED_ROOT).named_modules()
        if type(m) is nn.Linear
    )
    q_linears = sorted(
        f"{QUANTIZED_ROOT}.{n}"
        for n, m in model.get_submodule(QUANTIZED_ROOT).named_modules()
        if isinstance(m, BNB_LINEAR[mode])
    )
    assert fp_linears and q_linears == fp_linears == sorted(report.quantized_layers)
    assert report.mode == mode and set(report.kept) == set(KEEP_UNQUANTIZED)
    # The projector norm's gain (T / sqrt(D), paper §5.1) arrives bit for bit.
    torch.testing.assert_close(
        model.model.multi_modal_projector.norm.weight, fp_model.model.multi_modal_projector.norm.weight, rtol=0, atol=0
    )
    assert report.footprint_bytes < fp_model.get_memory_footprint()


def test_verify_refuses_a_model_quantized_with_bare_skip_names(tiny_model_dir):
    """The trap of STACK-NOTES: bare names match nothing, the vision tower gets quantized; the check must catch it."""
    from transformers import AutoModelForImageTextToText, BitsAndBytesConfig

    config = BitsAndBytesConfig(
        load_in_8bit=True, llm_int8_skip_modules=["vision_tower", "multi_modal_projector", "lm_head"]
    )
    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir, quantization_config=config, device_map="cpu")
    with pytest.raises(RuntimeError, match=r"under 'model.vision_tower' are quantized"):
        verify_quantization(model, "8bit")


def test_verify_refuses_a_full_precision_model_as_quantized(full_precision):
    with pytest.raises(RuntimeError, match="not quantized as 4bit"):
        verify_quantization(full_precision[0], "4bit")


# --------------------------------------------------------------------------------- closeness to full precision


def _agreement(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """(mean cosine of the centred logit vectors, top-1 agreement) over positions; a, b: (N, V)."""
    a, b = a.float() - a.float().mean(-1, keepdim=True), b.float() - b.float().mean(-1, keepdim=True)
    return float(nn.functional.cosine_similarity(a, b, dim=-1).mean()), float(
        (a.argmax(-1) == b.argmax(-1)).float().mean()
    )


@pytest.fixture(scope="module")
def unrelated_model(tmp_path_factory):
    """Same architecture and processor, other random weights: what 'not close' looks like to the metric."""
    from llava_normaligned.compose import compose
    from llava_normaligned.tiny import save_tiny_parts

    model, _ = compose(*save_tiny_parts(tmp_path_factory.mktemp("unrelated"), seed=7))
    return model


def test_greedy_generation_logits_stay_close_to_full_precision(quantized, full_precision, unrelated_model, images):
    """Greedy decoding with the quantized model; the full-precision model is teacher-forced on the same tokens and
    the logits of every prompt and generated position compared.

    The tiny model is random, so its logits are nearly flat (entropy ~5.98 nats of a possible 5.99) and the argmax is
    decided by small margins: top-1 agreement is a weak signal there, the cosine of the centred logit vectors a
    strong one. Measured: 8-bit ~1.000 cosine / 1.00 top-1; NF4 ~0.99 / 0.90 (about the error of 10% Gaussian noise
    on every LLM weight, which NF4's 16 levels amount to); an unrelated model ~0. The bounds leave room for kernel
    differences across CPUs and stay far from the unrelated model."""
    mode, model, processor, _ = quantized
    fp_model, _ = full_precision
    inputs = prepare_inputs(model, processor, [PROMPT], [[images[0]]])
    out = model.generate(
        **inputs, max_new_tokens=8, min_new_tokens=8, do_sample=False, output_logits=True, return_dict_in_generate=True
    )
    assert out.sequences.shape[1] == inputs["input_ids"].shape[1] + 8
    full = {k: v for k, v in inputs.items()}
    full["input_ids"] = out.sequences
    full["attention_mask"] = torch.ones_like(out.sequences)
    with torch.no_grad():
        q_logits = model(**full).logits[0, :-1]  # (L-1, V): every next-token prediction
        fp_logits = fp_model(**full).logits[0, :-1]
        other_logits = unrelated_model(**full).logits[0, :-1]
    # The logits generate() returned are those of the teacher-forced pass at the generated positions. Not to float32
    # rounding: on a CPU with AVX512-BF16, bitsandbytes' 4-bit kernel (gemv_4bit) rounds the activations to bfloat16,
    # and the cached steps and the full pass hand it float32 activations that differ in their last bits, enough to
    # round some to the neighbouring bfloat16 value. Half a bfloat16 step, 2^-9 of the largest logit, bounds that
    # (measured ~3e-4 there, ~3e-7 where the kernel stays in float32)
    assert_close_scaled(torch.stack(out.logits, 1)[0].float(), q_logits[-8:].float(), rtol=2.0**-9,
                        what=f"{mode}: generate() logits vs the teacher-forced pass")
    cosine, top1 = _agreement(q_logits, fp_logits)
    bound = {"8bit": (0.995, 0.95), "4bit": (0.97, 0.75)}[mode]
    assert cosine >= bound[0] and top1 >= bound[1], (mode, cosine, top1)
    assert _agreement(other_logits, fp_logits)[0] < 0.5  # the metric does tell models apart


# ------------------------------------------------------------------------ stock, converted and adapter checkpoints


@pytest.fixture(scope="module")
def stock_llava_dir(tiny_parts, tmp_path_factory):
    """A stock transformers LLaVA (no projector norm) with the tiny parts' weights, saved with its processor."""
    from llava_normaligned.compose import compose, stock_llava_like

    model, processor = compose(*tiny_parts, projector_norm=None)
    stock = stock_llava_like(model)
    folder = str(tmp_path_factory.mktemp("stock_llava"))
    stock.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


def test_stock_and_converted_checkpoints_load_quantized(stock_llava_dir, images, tmp_path):
    from llava_normaligned.compose import convert_from_llava, save

    stock, processor, report = load_model(stock_llava_dir, quantization="8bit", device="cpu", return_report=True)
    assert type(stock).__name__ == "LlavaForConditionalGeneration" and len(report.quantized_layers) == 14
    converted_dir = str(tmp_path / "converted")
    save(*convert_from_llava(stock_llava_dir), converted_dir)
    model, processor, report = load_model(converted_dir, quantization="4bit", device="cpu", return_report=True)
    assert type(model).__name__ == "LlavaNormAlignedForConditionalGeneration" and len(report.quantized_layers) == 14
    assert model.model.multi_modal_projector.norm.weight.dtype == torch.float32
    assert generate_batch(model, processor, [PROMPT], [images[0]], max_new_tokens=3)[0]


def test_lora_adapter_folder_loads_merged_and_on_a_quantized_base(tiny_model_dir, images, tmp_path):
    """What `train --use_peft` writes: an adapter folder naming its base. Full precision merges it (same logits as
    the PeftModel); 4-bit keeps it unmerged on the checked 4-bit base."""
    from peft import LoraConfig, PeftModel, get_peft_model

    from modeling_llava_normaligned import LlavaNormAlignedForConditionalGeneration

    base = LlavaNormAlignedForConditionalGeneration.from_pretrained(tiny_model_dir).eval()
    lora = LoraConfig(
        r=4,
        target_modules=r".*language_model.*\.(q_proj|v_proj|up_proj)",
        modules_to_save=["multi_modal_projector"],
        init_lora_weights=False,
    )  # random B: not a no-op
    torch.manual_seed(0)
    peft_model = get_peft_model(base, lora).eval()
    adapter_dir = str(tmp_path / "adapter")
    peft_model.save_pretrained(adapter_dir)
    assert not os.path.exists(os.path.join(adapter_dir, "config.json"))

    merged, processor = load_model(adapter_dir, device="cpu")
    inputs = prepare_inputs(merged, processor, [PROMPT], [[images[0]]])
    reloaded = PeftModel.from_pretrained(
        LlavaNormAlignedForConditionalGeneration.from_pretrained(tiny_model_dir), adapter_dir
    ).eval()
    with torch.no_grad():
        expected = reloaded(**inputs).logits
        plain = LlavaNormAlignedForConditionalGeneration.from_pretrained(tiny_model_dir).eval()(**inputs).logits
        # merging rounds W + BA once per weight; then the same reductions (of at most 128 terms, the LLM's MLP)
        assert_close_scaled(merged(**inputs).logits, expected, rtol=4 * 128 * F32_EPS,
                            what="merged vs PeftModel logits")
        assert not torch.allclose(plain, expected, atol=1e-4)  # the adapter does change the model

    quantized, processor, report = load_model(adapter_dir, quantization="4bit", device="cpu", return_report=True)
    assert isinstance(quantized, PeftModel) and report.mode == "4bit" and len(report.quantized_layers) == 14
    with torch.no_grad():
        cosine, _ = _agreement(quantized(**inputs).logits[0], expected[0])
    assert cosine >= 0.97
    assert generate_batch(quantized, processor, [PROMPT], [images[0]], max_new_tokens=3)[0]


# -------------------------------------------------------------------------------------------------- generation


def test_batched_generation_matches_one_by_one(full_precision, images):
    """Left padding: answers in one batch (prompts of different lengths, 0, 1 and 2 images) equal those alone."""
    model, processor = full_precision
    prompts = [PROMPT, "how many shapes are there ?", "describe the picture"]
    per_prompt = [images[0], None, [images[0], images[1]]]
    together = generate_batch(model, processor, prompts, per_prompt, max_new_tokens=6, batch_size=3)
    alone = generate_batch(model, processor, prompts, per_prompt, max_new_tokens=6, batch_size=1)
    assert together == alone and all(together)
    assert processor.tokenizer.padding_side == "left"


def test_generate_batch_rejects_bad_input(full_precision, images, tmp_path):
    model, processor = full_precision
    with pytest.raises(ValueError, match="2 entries for 1 prompts"):
        generate_batch(model, processor, [PROMPT], [images[0], images[1]])
    with pytest.raises(FileNotFoundError, match="nope.png"):
        generate_batch(model, processor, [PROMPT], [str(tmp_path / "nope.png")])
    with pytest.raises(ValueError, match="contains the image token"):
        generate_batch(model, processor, ["<image>\n" + PROMPT], [images[0]])
    with pytest.raises(TypeError, match="one string"):
        generate_batch(model, processor, PROMPT, [images[0]])


def test_batching_works_with_a_tokenizer_without_pad_token(full_precision, images):
    """Llama-3 tokenizers have no pad token: left padding then uses EOS for the call (masked out, so the answers
    equal those generated one by one) and the tokenizer is left as it was."""
    import copy

    model, processor = full_precision
    processor = copy.deepcopy(processor)
    processor.tokenizer.pad_token = None
    saved = model.generation_config.pad_token_id
    model.generation_config.pad_token_id = None
    try:
        prompts = [PROMPT, "describe the picture in a few words please"]
        together = generate_batch(model, processor, prompts, [images[0], images[1]], max_new_tokens=5, batch_size=2)
        alone = generate_batch(model, processor, prompts, [images[0], images[1]], max_new_tokens=5, batch_size=1)
    finally:
        model.generation_config.pad_token_id = saved
    assert together == alone and all(together)
    assert processor.tokenizer.pad_token is None


def test_stream_answer_takes_one_image_path(full_precision, images, capsys):
    """A single path is one image (not a sequence of one-character paths); the streamed answer is the batch API's."""
    model, processor = full_precision
    expected = generate_batch(model, processor, [PROMPT], [images[0]], max_new_tokens=5)[0]
    assert stream_answer(model, processor, PROMPT, images[0], max_new_tokens=5) == expected
    assert stream_answer(model, processor, PROMPT, [images[0]], max_new_tokens=5) == expected
    assert capsys.readouterr().out.split() == (expected + " " + expected).split()


# ------------------------------------------------------------------------------------------- errors, no fallback


def test_device_errors():
    with pytest.raises(ValueError, match="unknown device 'gpu0'"):
        resolve_device("gpu0")
    with pytest.raises(ValueError, match="'meta' is not one of"):
        resolve_device("meta")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="'cuda' was requested but is not available"):
            resolve_device("cuda")
    if not torch.backends.mps.is_available():
        with pytest.raises(RuntimeError, match="'mps' was requested"):
            resolve_device("mps")


def test_quantized_load_refuses_bad_mode_and_missing_device(tiny_model_dir):
    with pytest.raises(ValueError, match="'int4'"):
        load_model(tiny_model_dir, quantization="int4")
    with pytest.raises(FileNotFoundError, match=r"model './no/such/model': no such folder"):
        load_model("./no/such/model", quantization="4bit", device="cpu")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="not available"):
            load_model(tiny_model_dir, quantization="4bit", device="cuda")


def test_missing_bitsandbytes_is_a_clear_error(tiny_model_dir, images, tmp_path):
    """A fresh process in which bitsandbytes cannot be imported: the loader raises ImportError with the pip command,
    the CLI exits 1 with it, and full precision still loads. The process is set up as the publishing self-check sets
    up its own (``run_without_package``: ``-I``, own environment); ``sys.modules`` blocks bitsandbytes, so that
    transformers' availability check sees it as absent, as where it is not installed."""
    result = run_without_package(
        f"""
        import sys
        sys.modules["bitsandbytes"] = None  # makes `import bitsandbytes` raise ImportError
        from llava_normaligned.loading import load_model
        from llava_normaligned.commands.generate import main
        try:
            load_model({tiny_model_dir!r}, quantization="4bit", device="cpu")
        except ImportError as error:
            print("API:", error)
        argv = [{tiny_model_dir!r}, "--image", {images[0]!r}, "--prompt", "hi", "--load-in-8bit", "--device", "cpu"]
        code = main(argv)
        print("CLI exit:", code)
        model, _ = load_model({tiny_model_dir!r}, device="cpu")
        print("full precision:", sum(p.numel() for p in model.parameters()) > 0)
        """,
        cwd=str(tmp_path),
        env=subprocess_env(tmp_path),
        timeout=180,
        hidden=(),  # hide nothing: this check needs the package itself; bitsandbytes is blocked above
    )
    assert result.returncode == 0, result.stderr[-3000:]
    said = dict(line.split(": ", 1) for line in result.stdout.splitlines()
                if line.startswith(("API: ", "CLI exit: ", "full precision: ")))
    assert "bitsandbytes" in said["API"] and "pip install" in said["API"], result.stdout
    assert int(said["CLI exit"]) == 1 and said["full precision"] == "True", result.stdout
    refused = error_line(result.stderr, "generate")
    assert "bitsandbytes" in refused and "pip install" in refused


def test_remote_code_loads_4bit_on_a_machine_without_this_package(tiny_model_dir, images, tmp_path):
    """The saved folder alone, on a machine where this package cannot be imported: transformers loads it through the
    checkpoint's own code, 4-bit with the skip list of ``KEEP_UNQUANTIZED`` (what docs/inference.md tells such a
    user to pass) quantizes the language model only, and it answers."""
    from modeling_llava_normaligned import LlavaNormAlignedForConditionalGeneration

    folder = shutil.copytree(tiny_model_dir, tmp_path / "checkpoint")
    result = run_isolated(
        f"""
        import torch
        from PIL import Image
        from transformers import AutoModelForImageTextToText, AutoProcessor, BitsAndBytesConfig

        config = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                    bnb_4bit_compute_dtype=torch.bfloat16, llm_int8_skip_modules={list(KEEP_UNQUANTIZED)!r})
        model = AutoModelForImageTextToText.from_pretrained(
            {str(folder)!r}, trust_remote_code=True, quantization_config=config, device_map="cpu"
        )
        processor = AutoProcessor.from_pretrained({str(folder)!r}, trust_remote_code=True)
        print("class:", type(model).__module__, type(model).__name__)
        quantized = [n for n, m in model.named_modules() if type(m).__module__.startswith("bitsandbytes")]
        print("quantized:", len(quantized), all(n.startswith({QUANTIZED_ROOT + "."!r}) for n in quantized))
        messages = [{{"role": "user", "content": [{{"type": "image"}}, {{"type": "text", "text": "hi"}}]}}]
        text = processor.apply_chat_template(messages, add_generation_prompt=True)
        inputs = processor(text=[text], images=[Image.open({images[0]!r}).convert("RGB")], return_tensors="pt")
        out = model.generate(**inputs, max_new_tokens=4, min_new_tokens=4, do_sample=False)
        print("new tokens:", out.shape[1] - inputs["input_ids"].shape[1])
        """,
        cwd=str(tmp_path),
        env={"HF_HOME": str(tmp_path / "hf_home"), "HF_HUB_OFFLINE": "1"},
        timeout=180,
    )
    module, name = next(line for line in result.stdout.splitlines() if line.startswith("class: ")).split()[1:]
    assert module.startswith("transformers_modules.") and name == LlavaNormAlignedForConditionalGeneration.__name__
    assert "quantized: 14 True" in result.stdout and "new tokens: 4" in result.stdout
    assert os.listdir(tmp_path / "hf_modules")  # the remote code went to the test's folder


# -------------------------------------------------------------------------------------- trust_remote_code, Hub ids

HUB_CHECK = """
import logging, sys
from llava_normaligned.loading import load_model

repo, sha, image = sys.argv[1:4]
warnings = []


class Keep(logging.Handler):
    def emit(self, record):
        warnings.append(record.getMessage())


keep = Keep()
logging.getLogger("llava_normaligned.loading").addHandler(keep)
model, _ = load_model(repo, device="cpu")
print("default:", type(model).__module__, len(warnings))
model, _ = load_model(repo, device="cpu", trust_remote_code=True)
print("trusted at main:", type(model).__module__, len(warnings), "pin a commit hash" in warnings[-1])
model, _ = load_model(repo, revision=sha, device="cpu", trust_remote_code=True)
print("trusted at a commit:", type(model).__module__, len(warnings))
try:
    load_model("runs/no-such-checkpoint", device="cpu")
except OSError as error:
    print("mistyped:", error)
logging.getLogger("llava_normaligned.loading").removeHandler(keep)  # as in a plain CLI run
from llava_normaligned.commands.generate import main
code = main([repo, "--trust-remote-code", "--image", image, "--prompt", "hi", "--max-new-tokens", "2", "--device",
             "cpu", "--quiet"])
print("cli:", code)
"""


@pytest.fixture
def hub(tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_DISABLE_XET", True)  # the server speaks LFS, not Xet
    with HubServer(tmp_path / "hub", tokens={TOKEN: "alice"}) as server:
        yield server


def test_hub_checkpoint_loads_without_remote_code_and_trusting_it_warns_unless_pinned(
    hub, tiny_model_dir, images, tmp_path
):
    """A norm-aligned checkpoint on a Hub (a local server speaking its API, the real client): by default it loads
    with this package's installed classes, running none of the repo's code; ``trust_remote_code=True`` warns unless
    the revision is a commit hash (CLI included); a mistyped folder name says it is no local folder."""
    from huggingface_hub import HfApi

    api = HfApi(endpoint=hub.url, token=TOKEN)
    api.create_repo("alice/tiny-na")
    sha = api.upload_folder(repo_id="alice/tiny-na", folder_path=tiny_model_dir).oid
    env = subprocess_env(tmp_path, HF_ENDPOINT=hub.url, HF_HUB_OFFLINE="0", HF_HUB_DISABLE_XET="1")
    result = subprocess.run(
        [sys.executable, "-c", HUB_CHECK, "alice/tiny-na", sha, images[0]],
        cwd=str(tmp_path),
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = dict(line.split(": ", 1) for line in result.stdout.splitlines() if ": " in line)
    installed = "modeling_llava_normaligned.modeling_llava_normaligned"
    assert lines["default"] == f"{installed} 0"  # the installed classes, no warning
    # transformers prefers classes registered in the process even when remote code is trusted; the warning is
    # about what trusting allows for a repo at a branch, and a commit hash silences it
    assert lines["trusted at main"] == f"{installed} 1 True"
    assert lines["trusted at a commit"] == f"{installed} 1"
    assert "'runs/no-such-checkpoint'" in lines["mistyped"] and "no local folder" in lines["mistyped"]
    assert lines["cli"] == "0" and "pin a commit hash" in result.stderr  # the CLI user sees the warning


# ------------------------------------------------------------------------------------------------------- the CLI


def test_cli_streams_the_answer_of_the_batch_api(tiny_model_dir, images, quantized, capsys):
    mode, model, processor, _ = quantized
    code = main(
        [
            tiny_model_dir,
            "--image",
            images[0],
            "--prompt",
            PROMPT,
            f"--load-in-{mode}",
            "--max-new-tokens",
            "6",
            "--device",
            "cpu",
        ]
    )
    captured = capsys.readouterr()
    assert code == 0
    expected = generate_batch(model, processor, [PROMPT], [images[0]], max_new_tokens=6)[0]
    assert expected and captured.out.strip() == expected
    assert f"{mode} on cpu" in captured.err and "model.multi_modal_projector (float32)" in captured.err


def test_console_script_answers_a_question_about_an_image(tiny_model_dir, images, tmp_path):
    script = CONSOLE  # the one installed with this interpreter, not another found on PATH
    assert os.access(script, os.X_OK), "the console script is not installed (pip install -e .)"
    result = subprocess.run(
        [
            script,
            "generate",
            tiny_model_dir,
            "--image",
            images[0],
            images[1],
            "--prompt",
            PROMPT,
            "--load-in-4bit",
            "--max-new-tokens",
            "5",
            "--device",
            "cpu",
        ],
        env=subprocess_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=180,
        cwd=str(tmp_path),
        check=False,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() and "4bit on cpu" in result.stderr


def test_cli_batch_mode_writes_every_answer(tiny_model_dir, images, tmp_path, capsys):
    rows = [
        {"prompt": PROMPT, "images": [images[0]], "id": 1},
        {"prompt": "how many shapes are there ?", "id": 2},
        {"prompt": "describe", "images": [os.path.basename(images[1])], "id": 3},
    ]
    prompts_file = os.path.join(os.path.dirname(images[1]), "rows.jsonl")  # relative paths are from its folder
    with open(prompts_file, "w") as handle:
        handle.writelines(json.dumps(r) + "\n" for r in rows)
    output = tmp_path / "out" / "answers.jsonl"
    code = main(
        [
            tiny_model_dir,
            "--prompts-file",
            prompts_file,
            "--output",
            str(output),
            "--batch-size",
            "2",
            "--max-new-tokens",
            "4",
            "--device",
            "cpu",
            "--quiet",
        ]
    )
    assert code == 0
    written = [json.loads(line) for line in output.read_text().splitlines()]
    assert [w["id"] for w in written] == [1, 2, 3] and all(w["answer"] for w in written)
    assert not os.path.exists(str(output) + ".partial")


def test_cli_batch_mode_resumes_after_a_crash_and_never_overwrites(
    tiny_model_dir, images, tmp_path, monkeypatch, capsys
):
    """A run stopped after its first batch leaves OUTPUT.partial (here also a line cut mid-write); the rerun keeps
    those answers, answers the rest, and ends with what an uninterrupted run writes. A finished output is never
    replaced without --overwrite; a partial file made with other settings or other prompts is refused."""
    from llava_normaligned import generation

    rows = [{"prompt": f"{PROMPT} {i}", "images": [images[i % 2]], "id": i} for i in range(5)]
    prompts_file = tmp_path / "rows.jsonl"
    prompts_file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    output = tmp_path / "answers.jsonl"
    argv = [
        tiny_model_dir,
        "--prompts-file",
        str(prompts_file),
        "--output",
        str(output),
        "--batch-size",
        "2",
        "--max-new-tokens",
        "4",
        "--device",
        "cpu",
    ]

    real, calls = generation.generate_batch, []

    def stops_after_one_batch(*args, **kwargs):
        calls.append(len(args[2]))
        if len(calls) > 1:
            raise KeyboardInterrupt  # the run is killed while answering its second batch
        return real(*args, **kwargs)

    monkeypatch.setattr(generation, "generate_batch", stops_after_one_batch)
    with pytest.raises(KeyboardInterrupt):
        main(argv)
    partial = tmp_path / "answers.jsonl.partial"
    assert not output.exists() and len(partial.read_text().splitlines()) == 2
    with open(partial, "a") as handle:
        handle.write('{"prompt": "cut')  # a line the crash cut short
    first_two = partial.read_text().splitlines()[:2]
    settings = tmp_path / "answers.jsonl.partial.settings.json"
    settings_text = settings.read_text()

    monkeypatch.setattr(generation, "generate_batch", real)
    capsys.readouterr()
    # other settings: refused before anything is loaded
    assert main([*argv[:-4], "--max-new-tokens", "5", "--device", "cpu"]) == 2
    assert "max_new_tokens: 4 then, 5 now" in capsys.readouterr().err
    assert main(argv) == 0
    assert "resuming: 2/5 answers already in" in capsys.readouterr().err
    resumed = output.read_text().splitlines()
    assert resumed[:2] == first_two and [json.loads(line)["id"] for line in resumed] == list(range(5))
    assert not partial.exists() and not settings.exists()

    assert main(argv) == 2
    assert "exists; pass --overwrite" in capsys.readouterr().err
    assert output.read_text().splitlines() == resumed
    assert main([*argv, "--overwrite", "--quiet"]) == 0
    assert output.read_text().splitlines() == resumed  # greedy: the uninterrupted run writes the same

    # a partial file of other prompts (same settings) is not taken for this run's answers
    settings.write_text(settings_text)
    partial.write_text(json.dumps({"prompt": "something else", "id": 0, "answer": "x"}) + "\n")
    output.unlink()
    assert main(argv) == 2
    refused = error_line(capsys.readouterr().err, "generate")
    assert refused.startswith(f"{partial}:1 ") and number(r"answer to row (\d+)", refused) == 1
    assert "--overwrite" in refused


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--image", "missing.png", "--prompt", "hi"], "image not found: missing.png"),
        (["--image", "{img}", "--prompt", "hi", "--load-in-4bit", "--load-in-8bit"], "not allowed with argument"),
        (["--image", "{img}", "--prompt", "hi", "--device", "tpu"], "unknown device 'tpu'"),
        (["--image", "{img}"], "give either --prompt"),
        (["--prompts-file", "{rows}", "--output", "x.jsonl"], "rows.jsonl:2: image not found"),
        (["--image", "{img}", "--prompt", "hi", "--dtype", "float8"], "unknown value 'float8'"),
    ],
)
def test_cli_usage_errors_name_the_input(tiny_model_dir, images, tmp_path, capsys, argv, message):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"prompt": "a"}) + "\n" + json.dumps({"prompt": "b", "images": ["gone.png"]}) + "\n")
    argv = [a.format(img=images[0], rows=rows) for a in argv]
    try:
        code = main([tiny_model_dir, *argv])
    except SystemExit as exit_info:  # argparse's own usage errors (two flags that exclude each other)
        code = exit_info.code
    assert code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x.jsonl").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_cli_cuda_without_cuda_exits_1(tiny_model_dir, images, capsys):
    assert main([tiny_model_dir, "--image", images[0], "--prompt", "hi", "--load-in-4bit", "--device", "cuda"]) == 1
    refused = one_line(capsys.readouterr().err)
    assert "'cuda'" in refused and "not available" in refused


# ------------------------------------------------------------------------------------------------ on a GPU only

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the bf16 NF4 recipe)")


@requires_cuda
@pytest.mark.parametrize("mode", ["4bit", "8bit"])
def test_cuda_quantized_path(tiny_model_dir, images, mode, capsys):
    """The GPU recipe: NF4 + double quant with bf16 compute (8-bit: LLM.int8), unquantized parts in bf16, logits
    close to the bf16 model, batched generation and the CLI on the GPU."""
    fp_model, _ = load_model(tiny_model_dir, device="cuda", dtype="bfloat16")
    model, processor, report = load_model(tiny_model_dir, quantization=mode, device="cuda", return_report=True)
    assert model.device.type == "cuda" and report.device.startswith("cuda")
    assert set(report.kept.values()) == {"bfloat16"}
    if mode == "4bit":
        layer = model.get_submodule(report.quantized_layers[0])
        assert report.compute_dtype == "bfloat16" and layer.weight.quant_state.quant_type == "nf4"
        assert layer.weight.quant_state.nested  # double quantization
    inputs = prepare_inputs(model, processor, [PROMPT], [[images[0]]])
    with torch.no_grad():
        cosine, top1 = _agreement(model(**inputs).logits[0], fp_model(**inputs).logits[0])
    assert cosine >= {"8bit": 0.99, "4bit": 0.95}[mode], (mode, cosine, top1)
    answers = generate_batch(
        model, processor, [PROMPT, "describe"], [images[0], [images[0], images[1]]], max_new_tokens=5, batch_size=2
    )
    assert len(answers) == 2
    assert (
        main(
            [
                tiny_model_dir,
                "--image",
                images[0],
                "--prompt",
                PROMPT,
                f"--load-in-{mode}",
                "--device",
                "cuda",
                "--max-new-tokens",
                "5",
            ]
        )
        == 0
    )
    assert f"{mode} on cuda" in capsys.readouterr().err
