"""Which characters of a rendered conversation are the assistant's answers, for any chat template.

Loss goes on assistant answers only: prompts, system text and image tokens are never in the labels. This file finds
the answers as character spans of the rendered text; the collator turns them into token labels through the
tokenizer's offset mapping, after the processor has expanded each image tag.

Two ways to find the spans, in this order:

1. The template marks them with ``{% generation %}`` blocks (the tiny template, TRL's ``*_training.jinja``
   templates): the spans are exactly what the template author marked.
2. Otherwise (the official templates of Llama 3.2, Qwen2.5, Qwen3 and SmolLM2 have no markers), by placeholder
   rendering. The conversation is rendered as it is (the text trained on) and once more with each assistant
   message's content replaced by a placeholder: that second rendering is the template's own text around the
   answers, and laid over the first it shows where each answer's text starts and ends. Nothing is assumed about how
   the template renders a conversation's beginning (Qwen3 writes an empty ``<think>`` block in the last assistant
   turn only, so a conversation's first turns do not render as a prefix of the whole). An answer's span runs

   * from the end of the assistant header, the text ``add_generation_prompt`` writes and the model is prompted with
     at inference, so what the template puts before the answer inside the turn (Qwen3's empty think block) is
     trained on: the model has to emit it;
   * to the end of the template's end-of-turn text (``<|im_end|>``, ``<|eot_id|>``, found once per template from a
     probe conversation), which the model has to learn to emit; the whitespace after it is not trained on.

   A row is refused, with a message naming it, only when the placeholder rendering cannot be laid over the real
   one: the template writes an answer in a way that depends on the answer's own text (Qwen3 moving
   ``<think>...</think>`` reasoning of the last turn into its think block, for instance), or drops or repeats an
   assistant message. Such rows need a template with ``{% generation %}`` markers.
"""

from __future__ import annotations

import os
import re

from transformers.utils.chat_template_utils import render_jinja_template

GENERATION_MARKER = re.compile(r"\{%-?\s*generation\s*-?%\}")
PLACEHOLDER = "@@llava-normaligned answer {}@@"  # plain text: survives `trim` and friends unchanged
MARKED_TEMPLATE_HINT = (
    "Use a template with {% generation %}...{% endgeneration %} around assistant answers (--chat_template_path "
    "FILE.jinja; TRL ships marked versions of common templates as trl/chat_templates/*_training.jinja)."
)


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


def _text_message(role: str, text: str) -> dict:
    return {"role": role, "content": [{"type": "text", "text": text}]}


def _split_on(skeleton: str, placeholders: list[str]) -> list[str] | None:
    """``skeleton = seg[0] + ph[0] + seg[1] + ... + ph[n-1] + seg[n]`` -> ``seg``; ``None`` when a placeholder is
    missing or repeated (the template dropped or duplicated an assistant message)."""
    segments, rest = [], skeleton
    for placeholder in placeholders:
        before, found, rest = rest.partition(placeholder)
        if not found or placeholder in rest:
            return None
        segments.append(before)
    return [*segments, rest]


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
        self.header = self.end_of_turn = ""
        if not self.uses_markers:
            self.header, self.end_of_turn = self._turn_text()

    @property
    def method(self) -> str:
        return "generation-markers" if self.uses_markers else "placeholder-rendering"

    def _render(self, messages: list[dict], add_generation_prompt: bool = False, markers: bool = False):
        rendered, spans = render_jinja_template(
            conversations=[messages],
            chat_template=self.template,
            add_generation_prompt=add_generation_prompt,
            return_assistant_tokens_mask=markers,
            **self.template_kwargs,
        )
        return rendered[0], (spans[0] if markers else [])

    def _turn_text(self) -> tuple[str, str]:
        """(assistant header, end-of-turn text) of the template, from probe conversations.

        Header: what ``add_generation_prompt`` appends ("" when it appends nothing). End of turn: what every
        assistant turn is followed by (the common start of the text after an earlier and after the last answer),
        trailing whitespace excluded.
        """
        user = _text_message("user", "hi")
        placeholders = [PLACEHOLDER.format(k) for k in range(2)]
        try:
            prompt, _ = self._render([user])
            prompted, _ = self._render([user], add_generation_prompt=True)
            skeleton, _ = self._render([user, _text_message("assistant", placeholders[0]), user,
                                        _text_message("assistant", placeholders[1])])
        except Exception as err:  # a template may raise anything (jinja's raise_exception, TypeError, ...)
            raise TemplateError(f"the chat template fails on a two-turn conversation ({type(err).__name__}: {err})") \
                from err
        segments = _split_on(skeleton, placeholders)
        if segments is None:
            raise TemplateError(f"the chat template does not write assistant messages as given. {MARKED_TEMPLATE_HINT}")
        header = prompted[len(prompt):] if prompted.startswith(prompt) else ""
        after_earlier = segments[1] + placeholders[1] + segments[2]
        end_of_turn = os.path.commonprefix([after_earlier, segments[2]]).rstrip()
        return header, end_of_turn

    def render(self, messages: list[dict], n_images: int, name: str = "row") -> tuple[str, list[tuple[int, int]]]:
        parts = template_messages(messages, n_images)
        if self.uses_markers:
            text, spans = self._render(parts, markers=True)
            spans = [(int(s), int(e)) for s, e in spans if e > s]
        else:
            text, _ = self._render(parts)
            spans = self._located_spans(parts, text, name)
        if not spans:
            raise TemplateError(f"{name}: the chat template rendered no assistant text to train on")
        return text, spans

    def _located_spans(self, parts: list[dict], text: str, name: str) -> list[tuple[int, int]]:
        """The answer spans of ``text`` (the rendering of ``parts``), by placeholder rendering (module docstring)."""
        answers = [i for i, message in enumerate(parts) if message["role"] == "assistant"]
        placeholders = [PLACEHOLDER.format(k) for k in range(len(answers))]
        if any(p in text for p in placeholders):
            raise TemplateError(f"{name}: the conversation contains the text {PLACEHOLDER.format('N')!r}")
        probe = list(parts)
        for placeholder, i in zip(placeholders, answers):
            probe[i] = _text_message("assistant", placeholder)
        segments = _split_on(self._render(probe)[0], placeholders)

        def refuse(number: int, why: str):
            return TemplateError(
                f"{name}: assistant message {answers[number]} cannot be located in the rendered conversation ({why}). "
                + MARKED_TEMPLATE_HINT
            )

        if segments is None:
            raise refuse(0, "the chat template drops or repeats assistant messages")
        spans, position = [], 0
        for k in range(len(answers)):
            turn_start, before, after = position, segments[k], segments[k + 1]
            if not text.startswith(before, position):
                raise refuse(k, "the template writes the text before it differently depending on the answers")
            position += len(before)  # the answer's own text starts here
            if k + 1 < len(answers):
                end = text.find(after, position) if after else -1
            else:
                end = len(text) - len(after) if text.endswith(after) and len(text) - len(after) >= position else -1
            if end < 0:
                raise refuse(k, "the template writes the text after it differently depending on the answers")
            start = position
            if self.header:  # train on what the model emits after the header at inference (Qwen3's think block)
                header_at = text.rfind(self.header, turn_start, position)
                if header_at >= 0:
                    start = header_at + len(self.header)
            stop = end
            if self.end_of_turn:
                if not text.startswith(self.end_of_turn, end):
                    raise refuse(k, f"the template does not end it with {self.end_of_turn!r}")
                stop += len(self.end_of_turn)
            if stop > start:
                spans.append((start, stop))
            position = end
        return spans


__all__ = ["ConversationRenderer", "TemplateError", "has_generation_markers", "template_messages"]
