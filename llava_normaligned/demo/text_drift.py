"""How far training moved a row's LLM on text alone (the paper's MMLU claim: the norm keeps the language model's
text ability): the KL divergence of its next-token distributions from the original LLM's, on held-out text prompts
that share nothing with the demo's data.

Each prompt is rendered with the LLM's own chat template as a user turn, followed by the original LLM's greedy answer
(``ANSWER_TOKENS`` tokens, generated once from the untrained LLM); both models then read the same tokens and the KL
is taken at every answer position, KL(original || trained), over the original vocabulary (the composed model's added
image token left out). A row's reading is the mean over answer positions and prompts; the tables give its mean and
interval over seeds. No offline text benchmark with answers ships with the demo, so there is no text accuracy here;
``evaluate --tasks mmlu`` reads one where it is cached.
"""

from __future__ import annotations

import torch

ANSWER_TOKENS = 24
# Held-out prompts: general topics, none of the demo's shapes, colours or places.
PROMPTS = (
    "Explain why the sky looks blue during the day.",
    "Write two sentences about the history of the printing press.",
    "What is the difference between weather and climate?",
    "Give three tips for writing a clear email.",
    "Why do we have seasons on Earth?",
    "Describe how a bicycle converts pedalling into motion.",
    "What does a librarian do in a typical day?",
    "Summarise the plot of a story about a lost dog finding its way home.",
    "How does a refrigerator keep food cold?",
    "Name some benefits of drinking water.",
    "What is photosynthesis, in simple words?",
    "Why is sleep important for students?",
    "How do bees help plants grow?",
    "Explain what a budget is and why people make one.",
    "What are the main parts of a computer?",
    "Write a short thank-you note to a teacher.",
    "How do vaccines train the immune system?",
    "What makes a good friend?",
    "Explain how rain forms.",
    "Why do leaves change colour in autumn?",
    "What is the role of a referee in football?",
    "How can someone learn a new language faster?",
    "Describe the water cycle in three steps.",
    "What is gravity?",
    "Give a simple recipe for scrambled eggs.",
    "Why do people recycle paper and plastic?",
    "What is the purpose of a map legend?",
    "Explain what an elevator does and how it is powered.",
    "How do airplanes stay in the air?",
    "What should you pack for a weekend camping trip?",
    "Why is exercise good for the heart?",
    "Explain the rules of tic-tac-toe.",
)


def _encode(tokenizer, prompt: str) -> list[int]:
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                             add_generation_prompt=True)
    return tokenizer(rendered, add_special_tokens=False)["input_ids"]


@torch.no_grad()
def reference_answers(text_model, tokenizer, prompts=PROMPTS, answer_tokens: int = ANSWER_TOKENS) -> list[dict]:
    """For each prompt, ``{"ids": prompt + greedy answer token ids, "answer_start": index of the first answer token,
    "logprobs": (answer_tokens, V) float32 log-probabilities of the original LLM at the answer positions}``."""
    text_model.eval()
    out = []
    for prompt in prompts:
        ids = _encode(tokenizer, prompt)
        generated = text_model.generate(torch.tensor([ids]), max_new_tokens=answer_tokens, do_sample=False,
                                        pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id)
        full = generated[0].tolist()
        start = len(ids)
        if len(full) <= start:
            continue
        logits = text_model(torch.tensor([full])).logits[0, start - 1:len(full) - 1].float()
        out.append({"ids": full, "answer_start": start, "logprobs": torch.log_softmax(logits, dim=-1)})
    if not out:
        raise ValueError("the original LLM answered none of the text prompts")
    return out


@torch.no_grad()
def text_kl(model, references: list[dict]) -> dict:
    """``{"kl": mean KL(original || model) per answer token, "kl_per_prompt": [...], "top1_agreement": the fraction
    of answer positions where both models' most likely token is the same}`` for ``model`` (a composed VLM, read on
    text alone, or a causal LM)."""
    was_training = model.training
    model.eval()
    per_prompt, agree, positions = [], 0, 0
    try:
        for ref in references:
            ids = torch.tensor([ref["ids"]], device=model.device)
            start, end = ref["answer_start"], len(ref["ids"])
            logits = model(input_ids=ids).logits[0, start - 1:end - 1].float().cpu()
            reference = ref["logprobs"]
            logprobs = torch.log_softmax(logits[:, :reference.shape[-1]], dim=-1)
            kl = (reference.exp() * (reference - logprobs)).sum(dim=-1)  # (answer tokens,)
            per_prompt.append(float(kl.mean()))
            agree += int((logprobs.argmax(-1) == reference.argmax(-1)).sum())
            positions += kl.numel()
    finally:
        model.train(was_training)
    return {"kl": sum(per_prompt) / len(per_prompt), "kl_per_prompt": per_prompt,
            "top1_agreement": agree / positions, "prompts": len(per_prompt)}
