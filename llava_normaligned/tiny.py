"""Tiny vision encoders, causal LMs, tokenizers, processors and whole stock VLMs built in code, offline.

They stand in for SigLIP / CLIP and Llama / Qwen in tests and in the CPU demo (`save_tiny_parts`: the folders `compose`
takes), and for the Hub's VLMs of other families (`save_tiny_vlm`: a folder `align` takes): same classes, same files on
disk, a few hundred kilobytes. Random weights; nothing here downloads anything.

    python -m llava_normaligned.tiny --family idefics3 --output-dir tiny-idefics3
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    CLIPVisionConfig,
    CLIPVisionModel,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    SiglipVisionConfig,
    SiglipVisionModel,
)
from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil
from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil

from .align import SUPPORTED_MODEL_TYPES
from .families.tokens import IMAGE_TOKEN

SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<unk>", "<|im_start|>", "<|im_end|>"]

# ChatML, as SmolLM2 and Qwen2.5 write it. Message content may be a string or a list of {"type": "image"} /
# {"type": "text", "text": ...} parts (what TRL and processors pass). The assistant turn has its own branch wrapped
# in {% generation %} so that `return_assistant_tokens_mask` / TRL's `assistant_only_loss` can find the answers.
CHATML_TEMPLATE = (
    "{%- macro render(content) -%}"
    "{%- if content is string -%}{{ content }}"
    "{%- else -%}{%- for part in content -%}"
    "{%- if part['type'] == 'image' -%}{{ '" + IMAGE_TOKEN + "\n' }}"
    "{%- elif part['type'] == 'text' -%}{{ part['text'] }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{%- endmacro -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "{{ '<|im_start|>assistant\n' }}{% generation %}{{ render(message['content']) }}{{ '<|im_end|>' }}{% endgeneration %}{{ '\n' }}"
    "{%- else -%}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}{{ render(message['content']) }}{{ '<|im_end|>\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\n' }}{%- endif -%}"
)

DEFAULT_CORPUS_WORDS = (
    "what colour is the shape in the image ? red green blue yellow purple orange white black grey "
    "circle square triangle star cross ring how many shapes are there one two three four five six "
    "is there a in left right top bottom centre center where answer yes no with word single short "
    "describe picture photo object objects of and the on at which kind size small large big "
    "user assistant system you are helpful question answer please 0 1 2 3 4 5 6 7 8 9 . , : ;"
).split()


def _bpe_tokenizer(special_tokens, corpus, vocab_size: int, **wrapper) -> PreTrainedTokenizerFast:
    """A byte-level BPE trained in code on ``corpus`` (strings), ``special_tokens`` first in its vocabulary;
    ``wrapper``: the ``PreTrainedTokenizerFast`` settings besides ``<unk>``, ``<pad>`` and left padding."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(corpus), trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>", padding_side="left",
                                   **wrapper)


def train_tokenizer(words=DEFAULT_CORPUS_WORDS, vocab_size: int = 400, with_image_token: bool = True):
    """Trains a tiny byte-level BPE tokenizer in code, with ChatML special tokens and a chat template.

    Args:
        words (`Sequence[str]`, *optional*, defaults to `DEFAULT_CORPUS_WORDS`):
            The corpus's words.
        vocab_size (`int`, *optional*, defaults to 400):
            The BPE vocabulary size asked of the trainer.
        with_image_token (`bool`, *optional*, defaults to `True`):
            Whether the tokenizer has LLaVA's image token as its `image_token`.

    Returns:
        `PreTrainedTokenizerFast`: The tokenizer, with `SPECIAL_TOKENS` first in its vocabulary, `<s>` as BOS,
        `<|im_end|>` as EOS, `<pad>`, `<unk>`, left padding, `CHATML_TEMPLATE` as its chat template and
        `model_max_length` 2048.
    """
    corpus = [" ".join(words)] * 4 + [f" {w}" for w in words] + [w.capitalize() for w in words]
    extra = {"image_token": IMAGE_TOKEN} if with_image_token else {}
    return _bpe_tokenizer(SPECIAL_TOKENS, corpus, vocab_size, bos_token="<s>", eos_token="<|im_end|>",
                          extra_special_tokens=extra, chat_template=CHATML_TEMPLATE, model_max_length=2048)


@dataclass
class TinyVisionSpec:
    """The size of a tiny vision encoder (`tiny_vision_model`).

    Args:
        kind (`str`, *optional*, defaults to `"siglip"`):
            `"siglip"` (no CLS token) or `"clip"` (CLS token).
        hidden_size, intermediate_size, num_hidden_layers, num_attention_heads (`int`, *optional*):
            The encoder config's fields of the same names (defaults: 48, 96, 2, 2).
        image_size, patch_size (`int`, *optional*, defaults to 32 and 8):
            The image's and a patch's side, in pixels.
    """

    kind: str = "siglip"  # "siglip" (no CLS token) or "clip" (CLS token)
    hidden_size: int = 48
    intermediate_size: int = 96
    num_hidden_layers: int = 2
    num_attention_heads: int = 2
    image_size: int = 32
    patch_size: int = 8


@dataclass
class TinyTextSpec:
    """The size of a tiny causal LM (`tiny_text_model`).

    Args:
        kind (`str`, *optional*, defaults to `"llama"`):
            `"llama"`, `"qwen2"` or `"qwen3"`.
        hidden_size, intermediate_size, num_hidden_layers, num_attention_heads (`int`, *optional*):
            The LM config's fields of the same names (defaults: 64, 128, 2, 4).
        num_key_value_heads, max_position_embeddings (`int`, *optional*, defaults to 2 and 512):
            The LM config's fields of the same names.
        tie_word_embeddings (`bool`, *optional*, defaults to `False`):
            Whether the LM head shares the input embeddings.
        extra (`dict`, *optional*):
            Further config fields.
    """

    kind: str = "llama"  # "llama", "qwen2" or "qwen3"
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 512
    tie_word_embeddings: bool = False
    extra: dict = field(default_factory=dict)


def tiny_vision_model(spec: TinyVisionSpec = TinyVisionSpec(), seed: int = 0):
    """Builds a randomly initialised SigLIP or CLIP vision model and its image processor.

    Args:
        spec (`TinyVisionSpec`, *optional*):
            The encoder's kind and size; defaults to `TinyVisionSpec()`.
        seed (`int`, *optional*, defaults to 0):
            The seed of the random weights (set with `torch.manual_seed`).

    Returns:
        `tuple`: `(model, image_processor)`, a `SiglipVisionModel` or `CLIPVisionModel` and its PIL image processor
        for `spec.image_size`-pixel images.

    Raises:
        `ValueError`: If `spec.kind` is not `"siglip"` or `"clip"`.
    """
    import torch

    kwargs = dict(
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        image_size=spec.image_size,
        patch_size=spec.patch_size,
    )
    torch.manual_seed(seed)
    size = {"height": spec.image_size, "width": spec.image_size}
    if spec.kind == "siglip":
        model = SiglipVisionModel(SiglipVisionConfig(**kwargs))
        processor = SiglipImageProcessorPil(size=size)
    elif spec.kind == "clip":
        model = CLIPVisionModel(CLIPVisionConfig(**kwargs, projection_dim=spec.hidden_size))
        processor = CLIPImageProcessorPil(
            size={"shortest_edge": spec.image_size}, crop_size=size, do_center_crop=True
        )
    else:
        raise ValueError(f"TinyVisionSpec.kind must be 'siglip' or 'clip', got {spec.kind!r}")
    return model, processor


def tiny_text_model(tokenizer, spec: TinyTextSpec = TinyTextSpec(), seed: int = 0):
    """Builds a randomly initialised Llama, Qwen2 or Qwen3 causal LM sized to a tokenizer.

    Args:
        tokenizer (`PreTrainedTokenizerBase`):
            Gives the vocabulary size (`len(tokenizer)`) and the BOS, EOS and pad token ids; a tokenizer without the
            image token, which `compose` adds.
        spec (`TinyTextSpec`, *optional*):
            The LM's kind and size; defaults to `TinyTextSpec()`.
        seed (`int`, *optional*, defaults to 0):
            The seed of the random weights (set with `torch.manual_seed`).

    Returns:
        `LlamaForCausalLM`, `Qwen2ForCausalLM` or `Qwen3ForCausalLM`: The model.

    Raises:
        `ValueError`: If `spec.kind` is not `"llama"`, `"qwen2"` or `"qwen3"`.
    """
    import torch

    kwargs = dict(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=spec.tie_word_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **spec.extra,
    )
    torch.manual_seed(seed)
    if spec.kind == "llama":
        return LlamaForCausalLM(LlamaConfig(**kwargs))
    if spec.kind == "qwen2":
        return Qwen2ForCausalLM(Qwen2Config(**kwargs))
    if spec.kind == "qwen3":  # Qwen3 sets head_dim explicitly (default 128)
        return Qwen3ForCausalLM(Qwen3Config(head_dim=spec.hidden_size // spec.num_attention_heads, **kwargs))
    raise ValueError(f"TinyTextSpec.kind must be 'llama', 'qwen2' or 'qwen3', got {spec.kind!r}")


def save_tiny_parts(
    output_dir: str | os.PathLike,
    vision: TinyVisionSpec = TinyVisionSpec(),
    text: TinyTextSpec = TinyTextSpec(),
    seed: int = 0,
) -> tuple[str, str]:
    """Writes a tiny vision encoder and a tiny causal LM as transformers folders, the inputs `compose` takes.

    The LM's tokenizer does not know the image token: `compose` adds it, as it would for Llama or Qwen.

    Args:
        output_dir (`str` or `os.PathLike`):
            The folder to write `vision/` and `text/` in.
        vision (`TinyVisionSpec`, *optional*):
            The vision encoder's kind and size; defaults to `TinyVisionSpec()`.
        text (`TinyTextSpec`, *optional*):
            The LM's kind and size; defaults to `TinyTextSpec()`.
        seed (`int`, *optional*, defaults to 0):
            The vision encoder's seed; the LM's is `seed + 1`.

    Returns:
        `tuple[str, str]`: The paths of the two folders, `<output_dir>/vision` and `<output_dir>/text`.
    """
    vision_dir = os.path.join(output_dir, "vision")
    text_dir = os.path.join(output_dir, "text")
    vision_model, image_processor = tiny_vision_model(vision, seed=seed)
    vision_model.save_pretrained(vision_dir)
    image_processor.save_pretrained(vision_dir)
    # The LM's own tokenizer does not know <image>: compose adds it, as it would for Llama or Qwen.
    tokenizer = train_tokenizer(with_image_token=False)
    lm = tiny_text_model(tokenizer, text, seed=seed + 1)
    lm.save_pretrained(text_dir)
    tokenizer.save_pretrained(text_dir)
    return vision_dir, text_dir


# ------------------------------------------------------------------------------ whole stock VLMs of other families
# Tiny random models of transformers' own classes, with the processor files their checkpoints hold: the folders
# ``align`` takes (docs/align.md, "Offline, with nothing downloaded"), and the stock models of the tests of ``align``,
# ``train`` and ``diagnose`` on the other families. Every size is tiny: 32-px images or tiles, 8-px patches, 1-3
# layers, 16-32 wide.

# The families ``align`` supports, by ``model_type``: one tiny model each.
TINY_VLM_FAMILIES = SUPPORTED_MODEL_TYPES

_QWEN_TOKENS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
                "<|video_pad|>"]
_QWEN_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% else %}{{ part['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_IDEFICS_TOKENS = ["<|im_start|>", "<end_of_utterance>", "<|endoftext|>", "<fake_token_around_image>", "<image>",
                   "<global-img>"] + [f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)]
_IDEFICS_TEMPLATE = (  # SmolVLM's own, for images and text
    "<|im_start|>{% for message in messages %}{{ message['role'] | capitalize }}:"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}<image>{% else %}{{ part['text'] }}"
    "{% endif %}{% endfor %}<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}"
)
_QWEN_IDEFICS_TEXT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=2,
                          num_key_value_heads=1, max_position_embeddings=1024)
_PINPOINTS = [[32, 32], [32, 64], [64, 32]]  # LLaVA-NeXT / OneVision's any-resolution grids, at the tiny size


def chatml_template(image: str) -> str:
    """Builds a ChatML chat template whose image parts write a family's placeholder.

    Args:
        image (`str`):
            The family's image placeholder token, written (with a newline) for each `{"type": "image"}` part.

    Returns:
        `str`: The Jinja template.
    """
    return (
        "{%- for message in messages -%}"
        "{{ '<|im_start|>' + message['role'] + '\n' }}"
        "{%- if message['content'] is string -%}{{ message['content'] }}"
        "{%- else -%}{%- for part in message['content'] -%}"
        "{%- if part['type'] == 'image' -%}{{ '" + image + "\n' }}"
        "{%- elif part['type'] == 'text' -%}{{ part['text'] }}{%- endif -%}"
        "{%- endfor -%}{%- endif -%}"
        "{{ '<|im_end|>\n' }}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\n' }}{%- endif -%}"
    )


def family_tokenizer(specials: list[str], named: dict[str, str], template: str | None, vocab_size: int = 300):
    """Trains the tokenizer of the tiny LLaVA-like families' models.

    Args:
        specials (`list[str]`):
            The family's special tokens, added after ChatML's (`SPECIAL_TOKENS`).
        named (`dict[str, str]`):
            Attribute -> token for the tokenizer's named special tokens, e.g. `{"image_token": "<image>"}`.
        template (`str` or `None`):
            The chat template, e.g. `chatml_template(<image placeholder>)`.
        vocab_size (`int`, *optional*, defaults to 300):
            The BPE vocabulary size asked of the trainer.

    Returns:
        `PreTrainedTokenizerFast`: The tokenizer, with `<s>` as BOS, `<|im_end|>` as EOS, `<pad>`, `<unk>`, left padding
        and `model_max_length` 4096.
    """
    corpus = [" ".join(DEFAULT_CORPUS_WORDS)] * 4 + [f" {w}" for w in DEFAULT_CORPUS_WORDS]
    return _bpe_tokenizer(SPECIAL_TOKENS + list(specials), corpus, vocab_size, bos_token="<s>", eos_token="<|im_end|>",
                          extra_special_tokens=named, chat_template=template, model_max_length=4096)


def _qwen_idefics_tokenizer(special: list[str], image_token: str, template: str, eos: str):
    return _bpe_tokenizer(["<pad>", "<unk>", *special], [" ".join(DEFAULT_CORPUS_WORDS)] * 4, 320, eos_token=eos,
                          extra_special_tokens={"image_token": image_token}, chat_template=template)


def tiny_llama_config(vocab_size: int, **extra) -> dict:
    """Gives a tiny Llama text config: 2 layers, width 32, 4 attention heads (2 key-value heads).

    Args:
        vocab_size (`int`):
            The vocabulary size.
        **extra:
            Further config fields.

    Returns:
        `dict`: The config's fields, with `model_type` `"llama"`.
    """
    return dict(model_type="llama", vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024, **extra)


def tiny_qwen2_config(vocab_size: int) -> dict:
    """Gives a tiny Qwen2 text config: 2 layers, width 32, 4 attention heads (2 key-value heads).

    Args:
        vocab_size (`int`):
            The vocabulary size.

    Returns:
        `dict`: The config's fields, with `model_type` `"qwen2"`.
    """
    return dict(model_type="qwen2", vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)


def tiny_siglip_config(**extra) -> dict:
    """Gives a tiny SigLIP vision config: 1 layer, width 24, 32-pixel images in 8-pixel patches.

    Args:
        **extra:
            Further config fields.

    Returns:
        `dict`: The config's fields, with `model_type` `"siglip_vision_model"`.
    """
    return dict(model_type="siglip_vision_model", hidden_size=24, intermediate_size=48, num_hidden_layers=1,
                num_attention_heads=2, image_size=32, patch_size=8, **extra)


def tiny_clip_config(**extra) -> dict:
    """Gives a tiny CLIP vision config: 2 layers, width 24, 32-pixel images in 8-pixel patches.

    Args:
        **extra:
            Further config fields.

    Returns:
        `dict`: The config's fields, with `model_type` `"clip_vision_model"`.
    """
    return dict(model_type="clip_vision_model", hidden_size=24, intermediate_size=48, num_hidden_layers=2,
                num_attention_heads=2, image_size=32, patch_size=8, projection_dim=24, **extra)


def tiny_gemma3_text_config(vocab_size: int) -> dict:
    """Gives a tiny Gemma3 text config: 2 layers, width 32, 4 attention heads (2 key-value heads) of size 8.

    Args:
        vocab_size (`int`):
            The vocabulary size.

    Returns:
        `dict`: The config's fields, with `model_type` `"gemma3_text"`.
    """
    return dict(model_type="gemma3_text", vocab_size=vocab_size, hidden_size=32, intermediate_size=64,
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8, query_pre_attn_scalar=8,
                sliding_window=64, max_position_embeddings=1024)


@dataclass
class TinyVLM:
    """A tiny stock VLM and what its folder holds besides the weights.

    Args:
        model (`PreTrainedModel`):
            The model.
        processor (`ProcessorMixin`, *optional*):
            A transformers processor, saved with `save_pretrained`. `None` where transformers builds the family's
            processor only with torchvision: the folder then gets the parts below, as the family's checkpoints hold
            them.
        tokenizer (`PreTrainedTokenizerFast`, *optional*):
            The tokenizer.
        image_processor (`BaseImageProcessor`, *optional*):
            The image processor (the PIL class).
        processor_config (`dict`, *optional*):
            The content of `processor_config.json`.
        image_processor_type (`str`, *optional*):
            The class `preprocessor_config.json` names (the family's default one).
        template_file (`str`, *optional*, defaults to `"chat_template.jinja"`):
            Where the chat template goes: `chat_template.jinja` (as Qwen's and SmolVLM's folders have it) or
            `chat_template.json` (then without it in the tokenizer's config).
    """

    model: object
    processor: object = None
    tokenizer: object = None
    image_processor: object = None
    processor_config: dict | None = None
    image_processor_type: str | None = None
    template_file: str = "chat_template.jinja"

    def save(self, output_dir: str | os.PathLike) -> str:
        """Writes the model and its processor's files to a folder.

        Args:
            output_dir (`str` or `os.PathLike`):
                The folder to write to.

        Returns:
            `str`: `output_dir`, as a string.

        Raises:
            `ValueError`: Without a processor, for a tokenizer that has no chat template or a `template_file` that is
                neither `chat_template.jinja` nor `chat_template.json`; nothing is written then.
        """
        out = os.fspath(output_dir)
        if self.processor is None:
            if self.template_file not in ("chat_template.jinja", "chat_template.json"):
                raise ValueError(f"template_file {self.template_file!r}: expected 'chat_template.jinja' or "
                                 "'chat_template.json'")
            if not getattr(self.tokenizer, "chat_template", None):
                raise ValueError("the tokenizer has no chat template: a VLM folder needs one to format its prompts "
                                 "(set tokenizer.chat_template)")
        self.model.save_pretrained(out)
        if self.processor is not None:
            self.processor.save_pretrained(out)
            return out
        template = self.tokenizer.chat_template
        self.image_processor.save_pretrained(out)
        if self.template_file == "chat_template.json":
            self.tokenizer.chat_template = None
            try:
                self.tokenizer.save_pretrained(out)
            finally:
                self.tokenizer.chat_template = template
            _write_json(os.path.join(out, "chat_template.json"), {"chat_template": template})
        else:
            self.tokenizer.save_pretrained(out)
            with open(os.path.join(out, "chat_template.jinja"), "w", encoding="utf-8") as f:
                f.write(template)
        if self.image_processor_type:
            path = os.path.join(out, "preprocessor_config.json")
            with open(path, encoding="utf-8") as f:
                stored = json.load(f)
            _write_json(path, {**stored, "image_processor_type": self.image_processor_type})
        if self.processor_config is not None:
            _write_json(os.path.join(out, "processor_config.json"), self.processor_config)
        return out


def _write_json(path: str, content: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(content, f)


def _qwen_vl(family: str):
    import transformers as tf
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    tokenizer = _qwen_idefics_tokenizer(_QWEN_TOKENS, "<|image_pad|>", _QWEN_TEMPLATE, "<|im_end|>")
    ids = {key: tokenizer.convert_tokens_to_ids(token) for key, token in (
        ("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"),
        ("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>"))}
    # M-RoPE: mrope_section sums to head_dim / 2 (head_dim 16)
    text = dict(_QWEN_IDEFICS_TEXT, vocab_size=len(tokenizer), bos_token_id=None, eos_token_id=tokenizer.eos_token_id,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]})
    patches = dict(patch_size=8, spatial_merge_size=2, temporal_patch_size=2, num_heads=2)
    if family == "qwen2_vl":
        vision = dict(depth=2, embed_dim=16, hidden_size=32, **patches)
        config = tf.Qwen2VLConfig(text_config=text, vision_config=vision, **ids)
        cls = tf.Qwen2VLForConditionalGeneration
    elif family == "qwen2_5_vl":
        vision = dict(depth=2, hidden_size=16, intermediate_size=32, out_hidden_size=32, window_size=16,
                      fullatt_block_indexes=[1], **patches)
        config = tf.Qwen2_5_VLConfig(text_config=text, vision_config=vision, **ids)
        cls = tf.Qwen2_5_VLForConditionalGeneration
    else:
        text["head_dim"] = 16
        text["rope_parameters"]["mrope_interleaved"] = True
        vision = dict(depth=2, hidden_size=16, intermediate_size=32, out_hidden_size=32, num_position_embeddings=16,
                      deepstack_visual_indexes=[0, 1], **patches)
        config = tf.Qwen3VLConfig(text_config=text, vision_config=vision, **ids)
        cls = tf.Qwen3VLForConditionalGeneration
    # 32 x 32 px: a 4 x 4 grid of 8-px patches, 4 merged tokens per image
    images = Qwen2VLImageProcessorPil(patch_size=8, merge_size=2, temporal_patch_size=2, min_pixels=32 * 32,
                                      max_pixels=32 * 32)
    return config, cls, dict(tokenizer=tokenizer, image_processor=images, image_processor_type="Qwen2VLImageProcessor")


def _idefics3(family: str):
    import transformers as tf
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil
    from transformers.models.smolvlm.image_processing_pil_smolvlm import SmolVLMImageProcessorPil

    tokenizer = _qwen_idefics_tokenizer(_IDEFICS_TOKENS, "<image>", _IDEFICS_TEMPLATE, "<end_of_utterance>")
    text = dict(_QWEN_IDEFICS_TEXT, model_type="llama", vocab_size=len(tokenizer))
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, image_size=32,
                  patch_size=8)
    config_cls, cls, images_cls, name = (
        (tf.Idefics3Config, tf.Idefics3ForConditionalGeneration, Idefics3ImageProcessorPil, "Idefics3")
        if family == "idefics3"
        else (tf.SmolVLMConfig, tf.SmolVLMForConditionalGeneration, SmolVLMImageProcessorPil, "SmolVLM"))
    scale = 2
    config = config_cls(text_config=text, vision_config=vision, scale_factor=scale,
                        image_token_id=tokenizer.convert_tokens_to_ids("<image>"))
    # 64-px images cut into 32-px tiles (2 x 2) plus the global image; 16 patches -> 4 tokens per tile
    images = images_cls(do_image_splitting=True, size={"longest_edge": 64}, max_image_size={"longest_edge": 32})
    per_tile = (vision["image_size"] // vision["patch_size"]) ** 2 // scale**2
    return config, cls, dict(tokenizer=tokenizer, image_processor=images, image_processor_type=f"{name}ImageProcessor",
                             processor_config={"image_seq_len": per_tile, "processor_class": f"{name}Processor"})


def _llava_next(family: str):
    from transformers import LlavaNextConfig, LlavaNextForConditionalGeneration, LlavaNextProcessor
    from transformers.models.llava_next.image_processing_pil_llava_next import LlavaNextImageProcessorPil

    tok = family_tokenizer(["<image>"], {"image_token": "<image>"}, chatml_template("<image>"))
    config = LlavaNextConfig(vision_config=tiny_clip_config(), text_config=tiny_llama_config(len(tok)),
                             image_token_index=tok.image_token_id, image_grid_pinpoints=_PINPOINTS,
                             vision_feature_select_strategy="default", vision_feature_layer=-1)
    images = LlavaNextImageProcessorPil(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32},
                                        image_grid_pinpoints=_PINPOINTS)
    processor = LlavaNextProcessor(images, tok, patch_size=8, vision_feature_select_strategy="default",
                                   num_additional_image_tokens=1, chat_template=tok.chat_template)
    return config, LlavaNextForConditionalGeneration, dict(processor=processor)


def _llava_onevision(family: str):
    from transformers import LlavaOnevisionConfig, LlavaOnevisionForConditionalGeneration
    from transformers.models.llava_onevision.image_processing_pil_llava_onevision import (
        LlavaOnevisionImageProcessorPil,
    )

    tok = family_tokenizer(["<image>", "<video>"], {"image_token": "<image>", "video_token": "<video>"},
                           chatml_template("<image>"))
    config = LlavaOnevisionConfig(vision_config=tiny_siglip_config(), text_config=tiny_qwen2_config(len(tok)),
                                  image_token_index=tok.image_token_id, video_token_index=tok.video_token_id,
                                  image_grid_pinpoints=_PINPOINTS, vision_feature_layer=-1)
    images = LlavaOnevisionImageProcessorPil(size={"height": 32, "width": 32}, image_grid_pinpoints=_PINPOINTS)
    return config, LlavaOnevisionForConditionalGeneration, dict(
        tokenizer=tok, image_processor=images, template_file="chat_template.json",
        processor_config={"processor_class": "LlavaOnevisionProcessor", "num_image_tokens": 16,
                          "vision_feature_select_strategy": "full"})


def _gemma3(family: str):
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration, Gemma3Processor
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    named = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"}
    tok = family_tokenizer(list(named.values()), named, chatml_template("<start_of_image>"))
    config = Gemma3Config(vision_config=tiny_siglip_config(), text_config=tiny_gemma3_text_config(len(tok)),
                          mm_tokens_per_image=4, boi_token_index=tok.boi_token_id, eoi_token_index=tok.eoi_token_id,
                          image_token_index=tok.image_token_id)
    images = Gemma3ImageProcessorPil(size={"height": 32, "width": 32})
    processor = Gemma3Processor(images, tok, image_seq_length=4, chat_template=tok.chat_template)
    return config, Gemma3ForConditionalGeneration, dict(processor=processor)


def _internvl(family: str):
    from transformers import InternVLConfig, InternVLForConditionalGeneration
    from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import GotOcr2ImageProcessorPil

    named = {"start_image_token": "<img>", "end_image_token": "</img>", "context_image_token": "<IMG_CONTEXT>",
             "video_token": "<video>"}
    tok = family_tokenizer(list(named.values()), named, chatml_template("<IMG_CONTEXT>"))
    vision = dict(model_type="internvl_vision", hidden_size=24, intermediate_size=48, num_hidden_layers=1,
                  num_attention_heads=2, image_size=32, patch_size=8)
    config = InternVLConfig(vision_config=vision, text_config=tiny_qwen2_config(len(tok)),
                            image_token_id=tok.context_image_token_id, image_seq_length=4, downsample_ratio=0.5)
    images = GotOcr2ImageProcessorPil(size={"height": 32, "width": 32}, crop_to_patches=False)
    return config, InternVLForConditionalGeneration, dict(
        tokenizer=tok, image_processor=images, template_file="chat_template.json",
        processor_config={"processor_class": "InternVLProcessor", "image_seq_length": 4})


def _mistral3(family: str):
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration
    from transformers.models.pixtral.image_processing_pil_pixtral import PixtralImageProcessorPil

    named = {"image_token": "[IMG]", "image_break_token": "[IMG_BREAK]", "image_end_token": "[IMG_END]"}
    tok = family_tokenizer(list(named.values()), named, chatml_template("[IMG]"))
    vision = dict(model_type="pixtral", hidden_size=24, intermediate_size=48, num_hidden_layers=1,
                  num_attention_heads=2, head_dim=12, image_size=32, patch_size=8)
    text = dict(model_type="mistral", vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=1024)
    config = Mistral3Config(vision_config=vision, text_config=text, image_token_index=tok.image_token_id,
                            spatial_merge_size=2, vision_feature_layer=-1)
    images = PixtralImageProcessorPil(size={"longest_edge": 32}, patch_size=8)
    return config, Mistral3ForConditionalGeneration, dict(
        tokenizer=tok, image_processor=images, template_file="chat_template.json",
        processor_config={"processor_class": "PixtralProcessor", "patch_size": 8, "spatial_merge_size": 2})


_BUILDERS = {
    "idefics3": _idefics3, "smolvlm": _idefics3,
    "qwen2_vl": _qwen_vl, "qwen2_5_vl": _qwen_vl, "qwen3_vl": _qwen_vl,
    "llava_next": _llava_next, "llava_onevision": _llava_onevision, "gemma3": _gemma3, "internvl": _internvl,
    "mistral3": _mistral3,
}


def tiny_vlm(family: str, seed: int = 0) -> TinyVLM:
    """Builds a tiny random stock VLM of one family, with its processor.

    Where a random connector would write outputs too flat for a LayerNorm (their spread below its eps, 1e-5, so the
    aligned norm could not bring them to T), it is drawn larger: Gemma3's projection matrix (initialised to zeros, which
    would send no image to the LLM) from N(0, 0.1), and Mistral3's last projector layer times 30.

    Args:
        family (`str`):
            A `model_type` of `TINY_VLM_FAMILIES`, e.g. `"idefics3"`.
        seed (`int`, *optional*, defaults to 0):
            The seed of the random weights (set with `torch.manual_seed`).

    Returns:
        `TinyVLM`: The model, in eval mode, and its processor or processor files.

    Raises:
        `ValueError`: If `family` is not one of `TINY_VLM_FAMILIES`.
    """
    import torch

    if family not in _BUILDERS:
        raise ValueError(f"family {family!r}: tiny_vlm builds {', '.join(TINY_VLM_FAMILIES)}")
    config, model_class, files = _BUILDERS[family](family)
    torch.manual_seed(seed)
    model = model_class(config).eval()
    with torch.no_grad():
        if family == "gemma3":
            model.model.multi_modal_projector.mm_input_projection_weight.normal_(std=0.1)
        elif family == "mistral3":
            for param in model.model.multi_modal_projector.linear_2.parameters():
                param.mul_(30)
    return TinyVLM(model=model, **files)


def save_tiny_vlm(family: str, output_dir: str | os.PathLike, seed: int = 0) -> str:
    """Writes a tiny random stock VLM to a folder laid out as the family's checkpoints are: weights, config,
    tokenizer with a chat template, image processor, processor config.

    This is the folder `llava-normaligned align` takes; `train` builds the processor of the families in
    `families.processors.TRAINS_WITHOUT_TORCHVISION` without torchvision.

    Args:
        family (`str`):
            A `model_type` of `TINY_VLM_FAMILIES`, e.g. `"idefics3"` or `"llava_next"`.
        output_dir (`str` or `os.PathLike`):
            The folder to write to.
        seed (`int`, *optional*, defaults to 0):
            The seed of the random weights.

    Returns:
        `str`: The folder's path.

    Raises:
        `ValueError`: If `family` is not one of `TINY_VLM_FAMILIES`.
    """
    return tiny_vlm(family, seed=seed).save(output_dir)


if __name__ == "__main__":  # the command line of earlier releases, kept working: the ``tiny`` command runs it
    import importlib

    print("python -m llava_normaligned.tiny is now `llava-normaligned tiny` (the same flags)", file=sys.stderr)
    sys.exit(importlib.import_module("llava_normaligned.commands.tiny").main())
