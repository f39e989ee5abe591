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

Rendering every row through jinja twice is most of the up-front cost at LLaVA-558K scale, so placeholder rendering
has a fast path (``fast=True``, the default) that gives the same text and spans. Once per conversation *shape* (the
roles in order and where the images are) the template is rendered with a placeholder in every text slot: the
*skeleton*, the template's own text between the slots. Probe contents with leading and trailing whitespace,
newlines, quotes, backslashes and jinja syntax then show, for each slot, whether the template writes the content as
given or strips it (``trim``, ``lstrip('\n')``, ...). A shape whose probes do not fit one such rule is rendered by
jinja, row by row. A row of a fitted shape is the skeleton with its contents put in, unless a content is blank or
contains a string the template tests content against (a literal the template uses with ``in``, a method call or a
filter, such as Qwen3's ``'</think>' in content``): such rows, whose rendering may branch on their text, go through
jinja. Every shape's first row and one row in ``VERIFY_EVERY`` are also rendered by jinja and compared; a difference
raises ``FastRenderMismatch``, and ``prepare_dataset`` then renders every row by jinja (``fast=False``) and says so.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Callable

from transformers.utils.chat_template_utils import render_jinja_template

GENERATION_MARKER = re.compile(r"\{%-?\s*generation\s*-?%\}")
PLACEHOLDER = "@@llava-normaligned answer {}@@"  # plain text: survives `trim` and friends unchanged
MARKED_TEMPLATE_HINT = (
    "Use a template with {% generation %}...{% endgeneration %} around assistant answers (--chat_template_path "
    "FILE.jinja; TRL ships marked versions of common templates as trl/chat_templates/*_training.jinja)."
)


SLOT = "@@llava-normaligned text {}@@"
_UNFITTED = object()  # a shape whose skeleton has not been fitted yet
VERIFY_EVERY = 128  # fast-rendered rows compared with jinja's rendering: each shape's first row and one in this many

# How a template may write a message's content: as given or stripped (jinja's `trim` is str.strip()).
CONTENT_RULES: tuple[tuple[str, Callable[[str], str]], ...] = (
    ("as given", lambda text: text),
    ("strip", str.strip),
    ("lstrip", str.lstrip),
    ("rstrip", str.rstrip),
    ("strip newlines", lambda text: text.strip("\n")),
    ("lstrip newlines", lambda text: text.lstrip("\n")),
    ("rstrip newlines", lambda text: text.rstrip("\n")),
)
# Probe contents around a slot's placeholder: they tell the rules apart, and catch escaping or re-rendering.
PROBES: tuple[Callable[[str], str], ...] = (
    lambda slot: f" {slot} ",
    lambda slot: f"\n{slot}\n",
    lambda slot: f"\n\n \t{slot}\t \n",
    lambda slot: f" \n{slot} \n\n",
    lambda slot: f"{slot} {{{{ x }}}} {{% if %}} {{# c #}} \\ ' \" & < > %s \u00e9 \u4e2d 1.\n- * #",
)
# Where a string constant in a template only builds output or compares a role/type: not a test of the content.
_INERT_PARENTS = ("Output", "Concat", "Add", "Getitem", "Getattr", "Assign", "CondExpr", "Pair", "Dict", "List",
                  "Tuple", "Keyword")


class TemplateError(ValueError):
    """The chat template cannot show where the assistant's answers are."""


class FastRenderMismatch(RuntimeError):
    """A fast-rendered row differs from jinja's rendering of it (``prepare_dataset`` then renders every row by jinja)."""


@dataclass(frozen=True)
class _Skeleton:
    """A conversation shape's rendering: ``segments[0] + rule[0](text[0]) + segments[1] + ... + segments[n]``."""

    segments: tuple[str, ...]
    rules: tuple[Callable[[str], str], ...]

    def fill(self, texts: list[str]) -> str:
        out = [self.segments[0]]
        for rule, text, segment in zip(self.rules, texts, self.segments[1:]):
            out += (rule(text), segment)
        return "".join(out)

    def fill_at(self, texts: list[str]) -> tuple[str, list[int], list[int]]:
        """``fill`` with where each slot's content starts and ends in the text."""
        out, starts, ends = [self.segments[0]], [], []
        position = len(self.segments[0])
        for rule, text, segment in zip(self.rules, texts, self.segments[1:]):
            piece = rule(text)
            starts.append(position)
            position += len(piece)
            ends.append(position)
            out += (piece, segment)
            position += len(segment)
        return "".join(out), starts, ends


def _texts(parts: list[dict]) -> list[str]:
    return [item["text"] for message in parts for item in message["content"] if item["type"] == "text"]


def _with_texts(parts: list[dict], texts: list[str]) -> list[dict]:
    given = iter(texts)
    return [{"role": message["role"],
             "content": [dict(item, text=next(given)) if item["type"] == "text" else item
                         for item in message["content"]]}
            for message in parts]


def _pieces(rendered: str, segments: tuple[str, ...]) -> list[str] | None:
    """What a rendering holds between the skeleton's segments, or ``None`` when it is not laid out like them."""
    if not rendered.startswith(segments[0]):
        return None
    pieces, position, last = [], len(segments[0]), len(segments) - 1
    for k, segment in enumerate(segments[1:], start=1):
        if k == last:
            end = len(rendered) - len(segment) if rendered.endswith(segment) else -1
            if end < position:
                return None
        else:
            end = rendered.find(segment, position)
            if end < 0:
                return None
        pieces.append(rendered[position:end])
        position = end + len(segment)
    return pieces


_TODAY = re.compile(r"""if\s+not\s+date_string\s+is\s+defined.*?strftime_now\(\s*["']([^"']+)["']\s*\)""", re.S)


def _one_date(template: str) -> dict:
    """``{"date_string": today}`` for a template that writes today's date unless given one (Llama 3.x:
    ``strftime_now("%d %b %Y")``), so that every row of one preparation carries the same date, however long it runs
    (a run over midnight would otherwise write two dates, and its fast rendering would differ from jinja's)."""
    import datetime

    match = _TODAY.search(template)
    return {"date_string": datetime.datetime.now().strftime(match.group(1))} if match else {}


def content_literals(template: str) -> tuple[str, ...] | None:
    """The string constants a template tests text against (``'x' in content``, ``content.split('x')``,
    ``content | replace('x', ...)``); ``None`` when the template does not parse here (no fast path then)."""
    from jinja2 import nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    try:
        tree = ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols"]).parse(template)
    except Exception:
        return None
    found: set[str] = set()

    def visit(node, parent):
        if isinstance(node, nodes.Const) and isinstance(node.value, str) and node.value:
            inert = parent is not None and type(parent).__name__ in _INERT_PARENTS
            if isinstance(parent, nodes.Compare):  # == / != against a role or a type; `in` tests the text
                inert = all(op.op in ("eq", "ne") for op in parent.ops)
            if isinstance(parent, nodes.Operand):
                inert = parent.op in ("eq", "ne")
            if not inert:
                found.add(node.value)
        for child in node.iter_child_nodes():
            visit(child, node)

    visit(tree, None)
    return tuple(sorted(found))


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

    def __init__(self, processor, chat_template: str | None = None, fast: bool = True):
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
        self.template_kwargs.update(_one_date(self.template))
        self.header = self.end_of_turn = ""
        if not self.uses_markers:
            self.header, self.end_of_turn = self._turn_text()
        literals = None if self.uses_markers or not fast else content_literals(self.template)
        self.fast = literals is not None
        self._literals = literals or ()
        self._skeletons: dict[tuple, _Skeleton | None] = {}
        # texts the fast path must not lay into a skeleton: a slot placeholder's prefix, a tested literal
        self._refused = (SLOT[:12], *self._literals)
        self.rows_fast = self.rows_jinja = 0
        self._verified: set[tuple] = set()

    @property
    def method(self) -> str:
        return "generation-markers" if self.uses_markers else "placeholder-rendering"

    def __getstate__(self):  # datasets hashes and pickles the renderer: the per-process state is left out
        state = dict(self.__dict__)
        state.update(_skeletons={}, rows_fast=0, rows_jinja=0, _verified=set())
        return state

    def _skeleton(self, key: tuple, parts: list[dict]) -> _Skeleton | None:
        """The skeleton and content rules of the shape ``key`` (module docstring), or ``None``: rows of this shape
        go through jinja."""
        if key not in self._skeletons:
            self._skeletons[key] = self._fit_skeleton(parts)
        return self._skeletons[key]

    def _fit_skeleton(self, parts: list[dict]) -> _Skeleton | None:
        slots = [SLOT.format(k) for k in range(len(_texts(parts)))]
        try:
            segments = _split_on(self._render(_with_texts(parts, slots))[0], slots)
            if segments is None or not all(segments[1:-1]):
                return None
            segments = tuple(segments)
            allowed = [list(CONTENT_RULES) for _ in slots]
            for probe in PROBES:
                contents = [probe(slot) for slot in slots]
                pieces = _pieces(self._render(_with_texts(parts, contents))[0], segments)
                if pieces is None:
                    return None
                for k, (content, piece) in enumerate(zip(contents, pieces)):
                    allowed[k] = [(name, rule) for name, rule in allowed[k] if rule(content) == piece]
                    if not allowed[k]:
                        return None
        except Exception:  # a template may raise anything on probe contents: jinja renders this shape then
            return None
        return _Skeleton(segments, tuple(rules[0][1] for rules in allowed))

    def _fast_render(self, messages: list[dict], n_images: int, name: str
                     ) -> tuple[str, list[tuple[int, int]]] | None:
        """The row laid into its shape's skeleton, with its answer spans, or ``None`` (jinja renders it).

        Works on the string-content messages: every message is one text slot, the images come before the first
        user text (``template_messages``), so the roles and the image count are the shape."""
        texts = [message["content"] for message in messages]
        joined = "\0".join(texts)  # one search per refused text (a match across two contents: jinja, safe)
        for refused in self._refused:
            if refused in joined:
                return None
        for text in texts:
            if not text or text.isspace():  # blank: jinja renders it (templates treat it apart)
                return None
        roles = tuple(message["role"] for message in messages)
        key = (n_images, roles)
        skeleton = self._skeletons.get(key, _UNFITTED)
        if skeleton is _UNFITTED:
            skeleton = self._skeleton(key, template_messages(messages, n_images))
        if skeleton is None:
            return None
        text, starts, ends = skeleton.fill_at(texts)
        spans = self._spans_at(text, [k for k, role in enumerate(roles) if role == "assistant"], starts, ends)
        parts = None
        if spans is None:
            parts = template_messages(messages, n_images)
            spans = self._located_spans(parts, text, name)
        self.rows_fast += 1
        if key not in self._verified or self.rows_fast % VERIFY_EVERY == 0:
            self._verified.add(key)
            parts = parts or template_messages(messages, n_images)
            exact = self._render(parts)[0]
            if exact != text or self._located_spans(parts, exact, name) != spans:
                raise FastRenderMismatch(f"{name}: the fast rendering differs from the chat template's")
        return text, spans

    def _spans_at(self, text: str, answers: list[int], starts: list[int], ends: list[int]
                  ) -> list[tuple[int, int]] | None:
        """``_located_spans`` of a fast-rendered row, from where its answers' contents lie: the same spans (the
        same header and end-of-turn rules, and an answer ends where the placeholder rendering's following text is
        first found, as there); ``None`` where that search would find another place (then ``_located_spans``)."""
        spans, position = [], 0
        for k, slot in enumerate(answers):
            start, end = starts[slot], ends[slot]
            if k + 1 < len(answers):  # the text up to the next answer: first found at this answer's end?
                if text.find(text[end:starts[answers[k + 1]]], start) != end:
                    return None
            trained = self._trained(text, position, start, end)
            if trained is None:
                return None
            if trained[1] > trained[0]:
                spans.append(trained)
            position = end
        return spans

    def _trained(self, text: str, turn_start: int, start: int, end: int) -> tuple[int, int] | None:
        """The span trained on for an answer whose content is ``text[start:end]`` (its turn begins at
        ``turn_start``): from the end of the assistant header when it is there (train on what the model emits after
        the header at inference: Qwen3's think block), to the end of the end-of-turn text; ``None`` when the
        end-of-turn text does not follow the answer."""
        if self.header:
            header_at = text.rfind(self.header, turn_start, start)
            if header_at >= 0:
                start = header_at + len(self.header)
        stop = end
        if self.end_of_turn:
            if not text.startswith(self.end_of_turn, end):
                return None
            stop += len(self.end_of_turn)
        return start, stop

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
        if self.uses_markers:
            text, spans = self._render(template_messages(messages, n_images), markers=True)
            spans = [(int(s), int(e)) for s, e in spans if e > s]
        else:
            fast = self._fast_render(messages, n_images, name) if self.fast else None
            if fast is not None:
                text, spans = fast
            else:
                parts = template_messages(messages, n_images)
                self.rows_jinja += 1
                text, _ = self._render(parts)
                spans = self._located_spans(parts, text, name)
        if not spans:
            raise TemplateError(f"{name}: the chat template rendered no assistant text to train on")
        return text, spans

    def _located_spans(self, parts: list[dict], text: str, name: str, probe_text: str | None = None
                       ) -> list[tuple[int, int]]:
        """The answer spans of ``text`` (the rendering of ``parts``), by placeholder rendering (module docstring);
        ``probe_text``: the placeholder rendering when it is known already (the fast path)."""
        answers = [i for i, message in enumerate(parts) if message["role"] == "assistant"]
        placeholders = [PLACEHOLDER.format(k) for k in range(len(answers))]
        if any(p in text for p in placeholders):
            raise TemplateError(f"{name}: the conversation contains the text {PLACEHOLDER.format('N')!r}")
        if probe_text is None:
            probe = list(parts)
            for placeholder, i in zip(placeholders, answers):
                probe[i] = _text_message("assistant", placeholder)
            probe_text = self._render(probe)[0]
        segments = _split_on(probe_text, placeholders)

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
            trained = self._trained(text, turn_start, position, end)
            if trained is None:
                raise refuse(k, f"the template does not end it with {self.end_of_turn!r}")
            if trained[1] > trained[0]:
                spans.append(trained)
            position = end
        return spans


__all__ = ["ConversationRenderer", "FastRenderMismatch", "TemplateError", "has_generation_markers",
           "template_messages", "content_literals"]
