"""Tiny vision encoders, causal LMs, tokenizers and processors built in code, offline.

They stand in for SigLIP / CLIP and Llama / Qwen in tests and in the CPU demo: same classes, same files on disk,
a few hundred kilobytes. Nothing here downloads anything.
"""

from __future__ import annotations

import os
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


def train_tokenizer(words=DEFAULT_CORPUS_WORDS, vocab_size: int = 400, with_image_token: bool = True):
    """A byte-level BPE tokenizer trained in code on ``words``, with ChatML special tokens and a chat template."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = [" ".join(words)] * 4 + [f" {w}" for w in words] + [w.capitalize() for w in words]
    tok.train_from_iterator(corpus, trainer=trainer)
    extra = {"image_token": IMAGE_TOKEN} if with_image_token else {}
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="<|im_end|>",
        unk_token="<unk>",
        pad_token="<pad>",
        extra_special_tokens=extra,
        chat_template=CHATML_TEMPLATE,
        padding_side="left",
        model_max_length=2048,
    )


@dataclass
class TinyVisionSpec:
    kind: str = "siglip"  # "siglip" (no CLS token) or "clip" (CLS token)
    hidden_size: int = 48
    intermediate_size: int = 96
    num_hidden_layers: int = 2
    num_attention_heads: int = 2
    image_size: int = 32
    patch_size: int = 8


@dataclass
class TinyTextSpec:
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
    """A randomly initialised SigLIP or CLIP vision model and its image processor."""
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
    """A randomly initialised Llama, Qwen2 or Qwen3 causal LM sized to ``tokenizer`` (without the image token)."""
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
    """Write a tiny vision encoder (``<dir>/vision``) and a tiny causal LM (``<dir>/text``) as transformers folders,
    the inputs ``compose`` takes. Returns the two folder paths."""
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
