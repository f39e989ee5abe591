"""Pre-train the CPU demo's tiny LLM on text, so that it starts out knowing the language, like Llama or Qwen.

LLaVA connects a pre-trained vision encoder to a pre-trained LLM: stage 1 teaches the projector to turn image
features into inputs the frozen LLM can use, which only works if the LLM can already produce the answers from some
input. A random tiny LLM cannot, so stage 1 would train against noise. The stand-in is a few seconds of causal-LM
pre-training on text conversations about scenes of the training partition, where the scene is *written out* where
the image will later go:

    user:      Scene: A red circle at the top left and a blue cross at the bottom right.
               What colour is the shape at the top left?
    assistant: Red

The LLM learns the words, the question templates and how to answer from a description; it never sees an image. The
answers are balanced per question (``synthetic.TEMPLATES``), so it learns no answer prior to fall back on, and what it
answers about an image depends on what the projector gives it.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import asdict, dataclass

import torch
from tqdm.auto import tqdm

from . import synthetic

SCENE_PREFIX = "Scene: "


@dataclass
class TextPretrainConfig:
    """How long and on what the tiny LLM is pre-trained."""

    num_conversations: int = 8192
    steps: int = 400
    batch_size: int = 32
    learning_rate: float = 2e-3
    seed: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


def conversations(num: int, seed: int, split: str = "train", caption_share: float = 0.2) -> list[list[dict]]:
    """``num`` chat conversations about scenes of ``split``'s partition: a template question, or (with probability
    ``caption_share``) the request for a description, answered by the caption."""
    rng = random.Random(seed)
    out = []
    while len(out) < num:
        template = rng.choice(synthetic.TEMPLATES)
        slot, answer = rng.choice(template.slots), rng.choice(template.answers)
        scene = synthetic.Scene(tuple(template.scene(rng, slot, answer)))
        if synthetic.is_test_scene(scene.key()) != (split == "test"):
            continue
        if rng.random() < caption_share:
            question, reply = synthetic.CAPTION_PROMPT, scene.caption()
        else:
            question, reply = template.question_text(slot), synthetic.capitalise(answer)
        out.append([{"role": "user", "content": f"{SCENE_PREFIX}{scene.caption()}\n{question}"},
                    {"role": "assistant", "content": reply}])
    return out


def tokenize(tokenizer, convs: list[list[dict]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Input ids (N, L) right-padded and LM labels (N, L) with padding set to -100."""
    texts = [tokenizer.apply_chat_template(c, tokenize=False) for c in convs]
    side = tokenizer.padding_side
    tokenizer.padding_side = "right"
    try:
        batch = tokenizer(texts, padding=True, return_tensors="pt", add_special_tokens=False)
    finally:
        tokenizer.padding_side = side
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    return batch["input_ids"], labels


@dataclass
class TextPretrainResult:
    answer_accuracy: float  # greedy first answer token right, on held-out test-partition conversations
    seconds: float
    losses: list


def pretrain_text(model, tokenizer, config: TextPretrainConfig, progress: bool = True) -> TextPretrainResult:
    """Causal-LM pre-training of ``model`` (in place) on ``conversations``; cosine schedule, AdamW."""
    start = time.perf_counter()
    torch.manual_seed(config.seed)
    input_ids, labels = tokenize(tokenizer, conversations(config.num_conversations, config.seed))
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate, weight_decay=0.0)
    warmup = max(1, config.steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, config.steps) / config.steps))
    )
    generator = torch.Generator().manual_seed(config.seed)
    losses = []
    model.train()
    for _ in tqdm(range(config.steps), desc="LLM pre-training (text)", unit="step", disable=not progress):
        index = torch.randint(0, input_ids.shape[0], (config.batch_size,), generator=generator)
        ids, lab = input_ids[index], labels[index]
        width = int((lab != -100).sum(dim=1).max())  # drop all-padding columns: (B, width)
        loss = model(input_ids=ids[:, :width], labels=lab[:, :width]).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        losses.append(float(loss.detach()))
    model.eval()
    return TextPretrainResult(answer_accuracy=answer_accuracy(model, tokenizer, config.seed + 1),
                              seconds=time.perf_counter() - start, losses=losses)


@torch.no_grad()
def answer_accuracy(model, tokenizer, seed: int, num: int = 512) -> float:
    """How often the first answer token is right when the scene is written out (questions only, no captions)."""
    held_out = conversations(num, seed, split="test", caption_share=0.0)
    prompts = [tokenizer.apply_chat_template(c[:1], tokenize=False, add_generation_prompt=True) for c in held_out]
    targets = [tokenizer(c[1]["content"], add_special_tokens=False)["input_ids"][0] for c in held_out]
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    try:
        batch = tokenizer(prompts, padding=True, return_tensors="pt", add_special_tokens=False)
    finally:
        tokenizer.padding_side = side
    logits = model(**batch).logits[:, -1]  # (N, V): next token after the assistant opener
    return float((logits.argmax(-1) == torch.tensor(targets)).float().mean())

