"""Run a checkpoint with vLLM's offline engine and write what it did as JSON (runs where vLLM is installed).

    python -m llava_normaligned.commands.vllm_check CKPT --image cat.png --prompt "What is it?" --output out.json

It renders the prompt with the checkpoint's own chat template (as ``llava-normaligned generate`` does), generates
greedily, and records the prompt's token ids (after vLLM's image-token expansion), the generated ids, text and
per-token log-probabilities, plus the loaded model's anatomy: every parameter name, which linear layers are
quantized, the projector's dtypes, and how each checkpoint tensor name maps onto vLLM's parameters. The tests
compare all of it with transformers; it is also a smoke check of an installation (``--quantization fp8`` on a GPU).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass

from .shared import CommandParser, option

PROG = "python -m llava_normaligned.commands.vllm_check"


@dataclass(frozen=True, kw_only=True)
class VllmCheckConfig:
    """``vllm_check``'s options: the checkpoint, the prompt, vLLM's engine settings and where the JSON goes."""

    model: str = option(help="checkpoint folder (or Hub id)")
    image: str | None = option("--image", default=None, help="image file for the prompt")
    prompt: str | None = option("--prompt", default=None, help="the user's text; the image goes before it")
    max_tokens: int = option("--max-tokens", default=8, type=int, help="tokens to generate (default 8)")
    logprobs: int = option("--logprobs", default=5, type=int,
                           help="log-probabilities of the top N tokens per step (default 5)")
    suppress_token_id: list[int] = option("--suppress-token-id", factory=list, type=int, action="append",
                                          help="token id never to generate (repeatable): a tiny random model may "
                                               "emit its image token")
    dtype: str = option("--dtype", default="auto", help="vLLM's --dtype (default auto)")
    quantization: str | None = option("--quantization", default=None, help="vLLM's --quantization (fp8, ...)")
    max_model_len: int = option("--max-model-len", default=512, type=int, help="vLLM's --max-model-len (default 512)")
    kv_cache_mib: int | None = option("--kv-cache-mib", default=None, type=int,
                                      help="KV cache size in MiB (on CPU: instead of a fraction of the machine's "
                                           "memory)")
    output: str = option("--output", required=True, help="JSON file to write")
    init_only: bool = option("--init-only", default=False, action="store_true",
                             help="only build the model as vLLM would (no weights, no kernels) and record its "
                                  "anatomy: shows what a quantization method quantizes on machines that cannot run "
                                  "its kernels")


def make_parser() -> CommandParser:
    return CommandParser(config_class=VllmCheckConfig, prog=PROG, description=__doc__.split("\n\n")[0])


def build_model_only(args) -> dict:
    """The model vLLM's loader would build for ``args`` (quantization included), in this process, without weights."""
    import tempfile

    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm.utils.torch_utils import set_default_torch_dtype

    engine_args = EngineArgs(model=args.model, dtype=args.dtype, quantization=args.quantization,
                             max_model_len=args.max_model_len, kv_cache_memory_bytes=64 * 2**20,
                             limit_mm_per_prompt={"image": 1}, distributed_executor_backend="uni")
    config = engine_args.create_engine_config()
    with set_current_vllm_config(config), tempfile.TemporaryDirectory() as rendezvous:
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"file://{rendezvous}/init")
        initialize_model_parallel(1, 1)
        with set_default_torch_dtype(config.model_config.dtype):
            model = initialize_model(vllm_config=config)
    return {"quantization": config.model_config.quantization, "anatomy": model_anatomy(model)}


def model_anatomy(model) -> dict:
    """Parameter names, quantized linear layers and the projector's dtypes of a loaded vLLM model (in a worker)."""
    from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod

    linears = {name: type(module.quant_method).__name__ for name, module in model.named_modules()
               if isinstance(module, LinearBase)}
    projector = model.multi_modal_projector
    return {
        "class": type(model).__name__,
        "parameters": sorted(name for name, _ in model.named_parameters()),
        "linear_quant_methods": linears,
        "quantized_linears": sorted(name for name, module in model.named_modules()
                                    if isinstance(module, LinearBase)
                                    and not isinstance(module.quant_method, UnquantizedLinearMethod)),
        "projector_dtypes": {name: str(p.dtype) for name, p in projector.named_parameters()},
        "projector_class": type(projector).__name__,
        # vLLM fuses q/k/v and gate/up projections into one parameter each
        "packed_modules_mapping": {k: list(v) for k, v in type(model).packed_modules_mapping.items()},
    }


def checkpoint_name_map(model_dir: str) -> dict[str, str | None]:
    """Each tensor name of the checkpoint's safetensors files -> the vLLM name our model's mapper gives it."""
    import glob

    from safetensors import safe_open

    from .vllm_model import LlavaNormAlignedForConditionalGeneration

    mapper = LlavaNormAlignedForConditionalGeneration.hf_to_vllm_mapper
    names = {}
    for path in sorted(glob.glob(os.path.join(model_dir, "*.safetensors"))):
        with safe_open(path, "pt") as handle:
            for key in handle.keys():
                names[key] = mapper.map_name(key)
    return names


def main(argv: list[str] | None = None) -> int:
    parser = make_parser()
    args = parser.parse_config(argv)
    if not args.init_only:  # a usage error: one line, exit code 2
        if args.image is None or args.prompt is None:
            parser.error("--image and --prompt are needed (unless --init-only)")
        if not os.path.isfile(args.image):
            parser.error(f"--image {args.image!r}: no such file")

    if args.init_only:
        with open(args.output, "w") as handle:
            json.dump(build_model_only(args), handle, indent=1)
        return 0

    from PIL import Image
    from transformers import AutoProcessor
    from vllm import LLM, SamplingParams

    processor = AutoProcessor.from_pretrained(args.model, trust_remote_code=True)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": args.prompt}]}]
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True)

    engine_kwargs = dict(model=args.model, dtype=args.dtype, max_model_len=args.max_model_len, max_num_seqs=2,
                         limit_mm_per_prompt={"image": 1}, quantization=args.quantization,
                         distributed_executor_backend="uni")
    if args.kv_cache_mib:
        engine_kwargs["kv_cache_memory_bytes"] = args.kv_cache_mib * 2**20
    llm = LLM(**engine_kwargs)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, logprobs=args.logprobs,
                            logit_bias={i: -100.0 for i in args.suppress_token_id} or None)
    image = Image.open(args.image).convert("RGB")
    (result,) = llm.generate([{"prompt": prompt, "multi_modal_data": {"image": image}}], params, use_tqdm=False)
    completion = result.outputs[0]
    (anatomy,) = llm.apply_model(model_anatomy)

    record = {
        "prompt": prompt,
        "prompt_token_ids": list(result.prompt_token_ids),
        "token_ids": list(completion.token_ids),
        "text": completion.text,
        # per step: {token id: log-probability} of the top tokens (and of the chosen one)
        "logprobs": [{str(k): v.logprob for k, v in step.items()} for step in completion.logprobs],
        "anatomy": anatomy,
        "checkpoint_names": checkpoint_name_map(args.model) if os.path.isdir(args.model) else None,
    }
    with open(args.output, "w") as handle:
        json.dump(record, handle, indent=1)
    return 0


__all__ = ["VllmCheckConfig", "main", "make_parser"]


if __name__ == "__main__":
    sys.exit(main())
