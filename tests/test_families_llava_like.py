"""``diagnose`` on the LLaVA-like families of transformers 5: LLaVA-NeXT, LLaVA-OneVision, Gemma3, PaliGemma, Mistral3,
InternVL and Ovis2. Each is a tiny random model built in code from its real classes, with a processor built offline
(a BPE tokenizer trained here holding the family's special tokens, the family's image processor at tiny sizes, a chat
template writing the family's image placeholder), saved as a user's folder and diagnosed from it.

Answers known by construction: the vision norm reported at the LLM input is what an independent hook on the language
model's ``inputs_embeds`` sees at the image positions; scaling the connector's output layer by k scales the reported
vision/text ratio by k.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from llava_normaligned.diagnostics import DiagnoseConfig, main
from llava_normaligned.diagnostics.default_inputs import default_images_dir, default_prompts_file
from llava_normaligned.diagnostics.inputs import list_images, load_prompts, pair_samples
from llava_normaligned.tiny import DEFAULT_CORPUS_WORDS

BASE_SPECIALS = ["<pad>", "<s>", "</s>", "<unk>", "<|im_start|>", "<|im_end|>"]


def chat_template(image: str) -> str:
    """ChatML whose image part writes ``image`` (the family's placeholder)."""
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


def tokenizer(specials: list[str], named: dict[str, str], template: str | None, vocab_size: int = 300):
    """A byte-level BPE trained here: the base specials, then the family's (``named``: attribute -> token)."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=BASE_SPECIALS + specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    words = list(DEFAULT_CORPUS_WORDS)
    tok.train_from_iterator([" ".join(words)] * 4 + [f" {w}" for w in words], trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="<|im_end|>", unk_token="<unk>",
                                   pad_token="<pad>", extra_special_tokens=named, chat_template=template,
                                   padding_side="left", model_max_length=4096)


def tiny_llama(vocab_size: int, **extra) -> dict:
    return dict(model_type="llama", vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024, **extra)


def tiny_qwen2(vocab_size: int) -> dict:
    return dict(model_type="qwen2", vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)


def tiny_siglip(**extra) -> dict:
    return dict(model_type="siglip_vision_model", hidden_size=24, intermediate_size=48, num_hidden_layers=1,
                num_attention_heads=2, image_size=32, patch_size=8, **extra)


def tiny_clip(**extra) -> dict:
    return dict(model_type="clip_vision_model", hidden_size=24, intermediate_size=48, num_hidden_layers=2,
                num_attention_heads=2, image_size=32, patch_size=8, projection_dim=24, **extra)


# --------------------------------------------------------------------------------------------- the families


def build_llava_next(out: str):
    from transformers import LlavaNextConfig, LlavaNextForConditionalGeneration, LlavaNextProcessor
    from transformers.models.llava_next.image_processing_pil_llava_next import LlavaNextImageProcessorPil

    tok = tokenizer(["<image>"], {"image_token": "<image>"}, chat_template("<image>"))
    pinpoints = [[32, 32], [32, 64], [64, 32]]
    config = LlavaNextConfig(vision_config=tiny_clip(), text_config=tiny_llama(len(tok)),
                             image_token_index=tok.image_token_id, image_grid_pinpoints=pinpoints,
                             vision_feature_select_strategy="default", vision_feature_layer=-1)
    images = LlavaNextImageProcessorPil(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32},
                                        image_grid_pinpoints=pinpoints)
    processor = LlavaNextProcessor(images, tok, patch_size=8, vision_feature_select_strategy="default",
                                   num_additional_image_tokens=1, chat_template=tok.chat_template)
    return LlavaNextForConditionalGeneration(config), processor


def build_llava_onevision(out: str):
    from transformers import LlavaOnevisionConfig, LlavaOnevisionForConditionalGeneration
    from transformers.models.llava_onevision.image_processing_pil_llava_onevision import (
        LlavaOnevisionImageProcessorPil,
    )

    tok = tokenizer(["<image>", "<video>"], {"image_token": "<image>", "video_token": "<video>"},
                    chat_template("<image>"))
    pinpoints = [[32, 32], [32, 64], [64, 32]]
    config = LlavaOnevisionConfig(vision_config=tiny_siglip(), text_config=tiny_qwen2(len(tok)),
                                  image_token_index=tok.image_token_id, video_token_index=tok.video_token_id,
                                  image_grid_pinpoints=pinpoints, vision_feature_layer=-1)
    images = LlavaOnevisionImageProcessorPil(size={"height": 32, "width": 32}, image_grid_pinpoints=pinpoints)
    kwargs = {"num_image_tokens": 16, "vision_feature_select_strategy": "full"}
    return LlavaOnevisionForConditionalGeneration(config), ("LlavaOnevisionProcessor", images, tok, kwargs)


def tiny_gemma3_text(vocab_size: int) -> dict:
    return dict(model_type="gemma3_text", vocab_size=vocab_size, hidden_size=32, intermediate_size=64,
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                query_pre_attn_scalar=8, sliding_window=64, max_position_embeddings=1024)


def build_gemma3(out: str):
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration, Gemma3Processor
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    named = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"}
    tok = tokenizer(list(named.values()), named, chat_template("<start_of_image>"))
    config = Gemma3Config(vision_config=tiny_siglip(), text_config=tiny_gemma3_text(len(tok)), mm_tokens_per_image=4,
                          boi_token_index=tok.boi_token_id, eoi_token_index=tok.eoi_token_id,
                          image_token_index=tok.image_token_id)
    images = Gemma3ImageProcessorPil(size={"height": 32, "width": 32})
    processor = Gemma3Processor(images, tok, image_seq_length=4, chat_template=tok.chat_template)
    return Gemma3ForConditionalGeneration(config), processor


def build_paligemma(out: str):
    """PaliGemma as its checkpoints ship: no chat template; the prompt is the prefix after the image and BOS."""
    from transformers import PaliGemmaConfig, PaliGemmaForConditionalGeneration, PaliGemmaProcessor
    from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil

    tok = tokenizer(["<image>"], {"image_token": "<image>"}, None)
    text = dict(model_type="gemma", vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=1, head_dim=8, max_position_embeddings=1024)
    config = PaliGemmaConfig(vision_config=tiny_siglip(projection_dim=32), text_config=text, projection_dim=32,
                             hidden_size=32, image_token_index=tok.image_token_id, vocab_size=len(tok))
    images = SiglipImageProcessorPil(size={"height": 32, "width": 32})
    images.image_seq_length = 16
    processor = PaliGemmaProcessor(images, tok)
    return PaliGemmaForConditionalGeneration(config), processor


def build_mistral3(out: str):
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration
    from transformers.models.pixtral.image_processing_pil_pixtral import PixtralImageProcessorPil

    named = {"image_token": "[IMG]", "image_break_token": "[IMG_BREAK]", "image_end_token": "[IMG_END]"}
    tok = tokenizer(list(named.values()), named, chat_template("[IMG]"))
    vision = dict(model_type="pixtral", hidden_size=24, intermediate_size=48, num_hidden_layers=1,
                  num_attention_heads=2, head_dim=12, image_size=32, patch_size=8)
    text = dict(model_type="mistral", vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=1024)
    config = Mistral3Config(vision_config=vision, text_config=text, image_token_index=tok.image_token_id,
                            spatial_merge_size=2, vision_feature_layer=-1)
    images = PixtralImageProcessorPil(size={"longest_edge": 32}, patch_size=8)
    kwargs = {"patch_size": 8, "spatial_merge_size": 2}
    return Mistral3ForConditionalGeneration(config), ("PixtralProcessor", images, tok, kwargs)


def build_internvl(out: str):
    from transformers import InternVLConfig, InternVLForConditionalGeneration
    from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import GotOcr2ImageProcessorPil

    named = {"start_image_token": "<img>", "end_image_token": "</img>", "context_image_token": "<IMG_CONTEXT>",
             "video_token": "<video>"}
    tok = tokenizer(list(named.values()), named, chat_template("<IMG_CONTEXT>"))
    vision = dict(model_type="internvl_vision", hidden_size=24, intermediate_size=48, num_hidden_layers=1,
                  num_attention_heads=2, image_size=32, patch_size=8)
    config = InternVLConfig(vision_config=vision, text_config=tiny_qwen2(len(tok)),
                            image_token_id=tok.context_image_token_id, image_seq_length=4, downsample_ratio=0.5)
    images = GotOcr2ImageProcessorPil(size={"height": 32, "width": 32}, crop_to_patches=False)
    return InternVLForConditionalGeneration(config), ("InternVLProcessor", images, tok, {"image_seq_length": 4})


def build_ovis2(out: str):
    from transformers import Ovis2Config, Ovis2ForConditionalGeneration, Ovis2Processor
    from transformers.models.ovis2.image_processing_pil_ovis2 import Ovis2ImageProcessorPil

    indicators = ["<IMG_START>", "<IMG_GRID>", "<IMG_COL>", "<IMG_ROW>", "<IMG_END>"]
    tok = tokenizer(["<image>", "<IMG_ATOM>", *indicators], {"image_token": "<image>"}, chat_template("<image>"))
    vision = dict(hidden_size=24, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2, image_size=32,
                  patch_size=8, hidden_stride=2, vocab_size=64, num_visual_indicator_tokens=5)
    config = Ovis2Config(vision_config=vision, text_config=tiny_qwen2(len(tok)), hidden_size=32, vocab_size=len(tok),
                         image_token_id=tok.convert_tokens_to_ids("<IMG_ATOM>"),
                         visual_indicator_token_ids=tok.convert_tokens_to_ids(indicators))
    images = Ovis2ImageProcessorPil(size={"height": 32, "width": 32}, crop_to_patches=False)
    processor = Ovis2Processor(images, tok, image_seq_length=4, chat_template=tok.chat_template)
    return Ovis2ForConditionalGeneration(config), processor


FAMILIES = {
    "llava_next": build_llava_next,
    "llava_onevision": build_llava_onevision,
    "gemma3": build_gemma3,
    "paligemma": build_paligemma,
    "mistral3": build_mistral3,
    "internvl": build_internvl,
    "ovis2": build_ovis2,
}


def save_family(name: str, out: str) -> str:
    """The family's tiny model and processor saved as a user's folder. A processor transformers cannot build without
    torchvision is saved as its checkpoints hold it: image processor, tokenizer, processor_config.json."""
    torch.manual_seed(0)
    model, processor = FAMILIES[name](out)
    model.save_pretrained(out)
    if isinstance(processor, tuple):
        processor_class, images, tok, kwargs = processor
        images.save_pretrained(out)
        tok.save_pretrained(out)
        with open(os.path.join(out, "processor_config.json"), "w", encoding="utf-8") as f:
            json.dump({"processor_class": processor_class, **kwargs}, f)
    else:
        processor.save_pretrained(out)
    return out
