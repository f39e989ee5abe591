"""Which characters of a rendered conversation are the assistant's answers, for any chat template.

Loss goes on assistant answers only: prompts, system text and image tokens are never in the labels. This file finds
the answers as character spans of the rendered text; the collator turns them into token labels through the
tokenizer's offset mapping, after the processor has expanded each image tag.

Two ways to find the spans, in this order:

1. The template marks them with ``{% generation %}`` blocks (the tiny template, TRL's training templates): the spans
   are exactly what the template author marked.
2. Otherwise (Llama 3.2's, Qwen2.5's and SmolLM2's own templates have no markers), by rendering the conversation
   prefix by prefix: for the assistant message ``i``, ``render(messages[:i], add_generation_prompt=True)`` ends where
   the answer starts and ``render(messages[:i + 1])`` ends where the answer's turn ends. The answer span is the text
   between the two, trailing whitespace excluded (it is the end-of-turn token that the model must learn to emit, not
   the newline the template writes after it). A template that does not render prefixes as prefixes of the whole
   conversation (e.g. one that rewrites earlier turns) is refused with a message naming the row.
"""

from __future__ import annotations

import re

from transformers.utils.chat_template_utils import render_jinja_template

GENERATION_MARKER = re.compile(r"\{%-?\s*generation\s*-?%\}")


class TemplateError(ValueError):
    """The chat template cannot show where the assistant's answers are."""


def has_generation_markers(template: str | None) -> bool:
    return bool(template) and GENERATION_MARKER.search(template) is not None


def template_messages(messages: list[dict], n_images: int) -> list[dict]:
    """String-content messages -> the list-of-parts form processors render, with ``n_images`` image parts before the
    first user message's text (LLaVA-1.5's placement, and TRL's)."""
    out, placed = [], n_images == 0
    for message in messages:
        parts = []
        if message["role"] == "user" and not placed:
            parts += [{"type": "image"} for _ in range(n_images)]
            placed = True
        parts.append({"type": "text", "text": message["content"]})
        out.append({"role": message["role"], "content": parts})
    if not placed:
        raise TemplateError("a row with images has no user message to put them in")
    return out


class ConversationRenderer:
    """Renders a conversation with a processor's chat template and returns the assistant spans.

    ``render(messages, n_images) -> (text, [(start, end), ...])``, character offsets into ``text`` (image tags not
    yet expanded).
    """

    def __init__(self, processor, chat_template: str | None = None):
        self.processor = processor
        self.template = chat_template or processor.chat_template
        if not self.template:
            raise TemplateError(
                "the processor has no chat template; save one with the processor (compose keeps the LM's) or pass "
                "--chat_template_path"
            )
        if isinstance(self.template, dict):  # named variants: the default one renders conversations
            self.template = self.template["default"]
        self.uses_markers = has_generation_markers(self.template)
        # The processor passes the tokenizer's special tokens (bos_token, ...) to the template; so do we.
        self.template_kwargs = dict(processor.tokenizer.special_tokens_map)

    @property
    def method(self) -> str:
        return "generation-markers" if self.uses_markers else "prefix-rendering"

    def _render(self, messages: list[dict], add_generation_prompt: bool = False, markers: bool = False):
        rendered, spans = render_jinja_template(
            conversations=[messages],
            chat_template=self.template,
            add_generation_prompt=add_generation_prompt,
            return_assistant_tokens_mask=markers,
            **self.template_kwargs,
        )
        return rendered[0], (spans[0] if markers else [])

    def render(self, messages: list[dict], n_images: int, name: str = "row") -> tuple[str, list[tuple[int, int]]]:
        parts = template_messages(messages, n_images)
        if self.uses_markers:
            text, spans = self._render(parts, markers=True)
            spans = [(int(s), int(e)) for s, e in spans if e > s]
        else:
            text, _ = self._render(parts)
            spans = self._check_prefixes(text, self._prefix_spans(parts, name), name)
        if not spans:
            raise TemplateError(f"{name}: the chat template rendered no assistant text to train on")
        return text, spans

    def _prefix_spans(self, parts: list[dict], name: str) -> list[tuple[str, str]]:
        pairs = []
        for i, message in enumerate(parts):
            if message["role"] != "assistant":
                continue
            before, _ = self._render(parts[:i], add_generation_prompt=True)
            through, _ = self._render(parts[: i + 1])
            pairs.append((before, through))
        return pairs

    def _check_prefixes(self, text: str, pairs: list[tuple[str, str]], name: str) -> list[tuple[int, int]]:
        spans = []
        for before, through in pairs:
            if not (through.startswith(before) and text.startswith(through)):
                raise TemplateError(
                    f"{name}: the chat template does not render a conversation's beginning as a prefix of the whole "
                    "conversation, so the assistant answers cannot be located. Use a template with "
                    "{% generation %}...{% endgeneration %} around assistant answers (--chat_template_path FILE.jinja)."
                )
            end = len(through.rstrip())
            start = len(before)
            if end > start:
                spans.append((start, end))
        return spans


__all__ = ["ConversationRenderer", "TemplateError", "has_generation_markers", "template_messages"]
