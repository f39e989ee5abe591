"""Reward functions for TRL's ``GRPOTrainer`` (``reward_funcs=[exact_answer]`` or ``--reward_funcs exact_answer``).

TRL calls a reward function with the batch's ``prompts`` and ``completions`` and every other dataset column as a
keyword argument (here ``solution``, which ``rl_data.prompt_rows`` writes), and takes one float per completion.
"""

from __future__ import annotations


def completion_text(completion) -> str:
    """A completion as text: a string as is; a conversational one (a list of messages whose content is a string or a
    list of ``{"type": "text", "text": ...}`` parts) as the text of its messages."""
    if isinstance(completion, str):
        return completion
    texts = []
    for message in completion:
        content = message.get("content") if isinstance(message, dict) else message
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            texts.extend(part.get("text") or "" for part in content
                         if isinstance(part, dict) and part.get("type") == "text")
    return "".join(texts)


def normalize_answer(text: str) -> str:
    """The one rule an exact answer is compared by, here and in the demo's scoring (``demo.scoring``), so that GRPO is
    rewarded by what the held-out accuracy counts: stripped, lower-cased, a trailing full stop dropped, runs of spaces
    made one: ``" Red.\\n"`` -> ``"red"``."""
    return " ".join(str(text).strip().lower().rstrip(".").split())


def exact_answer(completions, solution, **kwargs) -> list[float]:
    """1.0 for each completion whose normalized text equals its row's normalized ``solution``, else 0.0."""
    if len(completions) != len(solution):
        raise ValueError(f"exact_answer: {len(completions)} completions for {len(solution)} solutions")
    return [float(normalize_answer(completion_text(c)) == normalize_answer(s)) for c, s in zip(completions, solution)]


# name -> function: what ``--reward_funcs NAME`` of the ``grpo`` command takes besides TRL's own names and dotted paths
REWARD_FUNCS = {"exact_answer": exact_answer}
