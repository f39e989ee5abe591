"""This package's models inside lmms-eval: ``lmms-eval --model llava_normaligned --model_args pretrained=DIR_OR_ID``.

lmms-eval finds the model through the entry point ``llava_normaligned = llava_normaligned.evaluation.lmms_plugin:
MANIFEST`` in the group ``lmms_eval.models`` (pyproject.toml); nothing of lmms-eval's is edited. It is a *simple*
model (a subclass of ``lmms_eval.api.model.lmms``; lmms-eval's multiple-choice tasks do not run on chat models):
lmms-eval hands it the task's prompt text and the document's images, and it answers

- generation requests ``(context, gen_kwargs, doc_to_visual, doc_id, task, split)`` through the same batched,
  left-padded greedy generation as ``llava-normaligned eval`` (``batches.generate_answers``: one user turn, images
  first, the checkpoint's chat template; image and video placeholder tokens suppressed), the task's text read as
  the own harness reads a question (``prompts.without_image_tags``), the answer cut at the task's ``until`` strings;
- log-likelihood requests ``(context, continuation, doc_to_visual, ...)`` of text-only tasks (HellaSwag, MMLU)
  with the same scoring code as ``llava-normaligned eval`` (``loglik.encode_pair`` and ``loglik.score_pairs``: no
  chat template, the tokenizer's own special tokens), returning the negative summed log-probability, whose argmin
  lmms-eval's multiple choice takes.

lmms-eval then extracts and scores the answers by its task's own rules; ``eval --engine lmms-eval`` reports those
(``lmms_engine.py``; docs/evaluation.md, "Where the two engines differ").

``--model_args``: ``pretrained`` (folder or Hub id), ``revision``, ``load_in_4bit`` / ``load_in_8bit``
(bitsandbytes), ``dtype`` (auto, float32, bfloat16, float16), ``device`` (auto, cpu, cuda, cuda:1), ``batch_size``
(requests per forward; lmms-eval's ``--batch_size`` too), ``trust_remote_code``, ``max_new_tokens`` (overrides
every task's). The checkpoint is loaded by this package's one loader, as every other command loads it.
"""

from __future__ import annotations

import logging
from collections import OrderedDict

from lmms_eval.api.instance import GenerationResult
from lmms_eval.api.model import lmms
from lmms_eval.models.registry_v2 import ModelManifest

from ..generation import without_image_tags
from .batches import chunks, generate_answers, to_rgb
from .loglik import encode_pair, score_pairs
from .prompts import GenerationRequest

logger = logging.getLogger(__name__)

MODEL_ID = "llava_normaligned"
MANIFEST = ModelManifest(model_id=MODEL_ID, simple_class_path="llava_normaligned.evaluation.lmms_plugin.LlavaNormAligned")
DEFAULT_MAX_NEW_TOKENS = 128  # when a task names none


def _flag(name: str, value) -> bool:
    """A model_args boolean: lmms-eval turns "true"/"false" into bools, a bare 1/0 into ints."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "yes", "no", "1", "0"):
        return value.strip().lower() in ("true", "yes", "1")
    raise ValueError(f"llava_normaligned: model_args {name}={value!r}: expected true or false")


def _positive_int(name: str, value) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = 0
    if number < 1 or (isinstance(value, float) and value != number):
        raise ValueError(f"llava_normaligned: {name}={value!r}: expected a positive whole number")
    return number


def _visuals(doc_to_visual, doc) -> list:
    """The document's images as PIL RGB images ([] for a text-only task, whose ``doc_to_visual`` may be None)."""
    if doc_to_visual is None:
        return []
    visuals = doc_to_visual(doc)
    if visuals is None:
        return []
    visuals = visuals if isinstance(visuals, (list, tuple)) else [visuals]
    if any(isinstance(v, str) for v in visuals):
        raise ValueError("llava_normaligned: this model reads images only; the task gave a video or audio path")
    return [to_rgb(v) for v in visuals]


def _cut(text: str, until) -> str:
    """Greedy text up to the first stop string: greedy decoding past a stop string does not change what precedes
    it, so cutting afterwards gives what stopping would have."""
    for stop in [until] if isinstance(until, str) else (until or []):
        if stop and stop in text:
            text = text[: text.index(stop)]
    return text


class LlavaNormAligned(lmms):
    """A norm-aligned (or stock) LLaVA checkpoint as an lmms-eval simple model; see the module docstring."""

    is_simple = True

    def __init__(self, pretrained: str, revision=None, load_in_4bit=False, load_in_8bit=False, dtype="auto",
                 device=None, batch_size=1, max_batch_size=None, trust_remote_code=None, max_new_tokens=None,
                 **unknown) -> None:
        super().__init__()
        if unknown:
            raise ValueError(f"llava_normaligned: unknown model_args {sorted(unknown)}; known: pretrained, revision, "
                             "load_in_4bit, load_in_8bit, dtype, device, batch_size, trust_remote_code, max_new_tokens")
        four, eight = _flag("load_in_4bit", load_in_4bit), _flag("load_in_8bit", load_in_8bit)
        if four and eight:
            raise ValueError("llava_normaligned: load_in_4bit and load_in_8bit exclude each other")
        self.batch_size_per_gpu = 1 if str(batch_size).startswith("auto") else _positive_int("batch_size", batch_size)
        self.max_new_tokens = None if max_new_tokens is None else _positive_int("max_new_tokens", max_new_tokens)
        from llava_normaligned.loading import load_model  # the package's one loader

        self.model, self.processor = load_model(
            str(pretrained),
            revision=None if revision is None else str(revision),
            quantization="4bit" if four else "8bit" if eight else None,
            device=device or "auto",
            dtype=dtype,
            trust_remote_code=None if trust_remote_code is None else _flag("trust_remote_code", trust_remote_code),
        )
        self.tokenizer = self.processor.tokenizer
        self.pretrained = str(pretrained)

    @property
    def batch_size(self) -> int:
        return self.batch_size_per_gpu

    def _doc(self, task: str, split: str, doc_id):
        return self.task_dict[task][split][doc_id]

    # ---- generation ----
    def generate_until(self, requests) -> list[str]:
        answers: list[str | None] = [None] * len(requests)
        groups: OrderedDict[tuple, list[int]] = OrderedDict()  # one gen_kwargs per batch, in the requests' order
        for i, request in enumerate(requests):
            context, gen_kwargs, _, _, task, split = request.args
            groups.setdefault((task, split, repr(sorted((gen_kwargs or {}).items()))), []).append(i)
        for indices in groups.values():
            gen_kwargs = dict(requests[indices[0]].args[1] or {})
            if gen_kwargs.get("do_sample") and float(gen_kwargs.get("temperature") or 0) > 0:
                logger.warning("llava_normaligned: the task asks for sampling; answering greedily (paper §5.2)")
            max_new = self.max_new_tokens or int(gen_kwargs.get("max_new_tokens") or DEFAULT_MAX_NEW_TOKENS)
            for batch in chunks(indices, self.batch_size):
                built = []
                for i in batch:
                    context, _, doc_to_visual, doc_id, task, split = requests[i].args
                    images = _visuals(doc_to_visual, self._doc(task, split, doc_id))
                    built.append(GenerationRequest(doc_id=str(doc_id), prompt=self._prompt(context), images=images,
                                                   gold=None))
                texts = generate_answers(self.model, self.processor, built, max_new)
                for i, text in zip(batch, texts):
                    answers[i] = _cut(text, gen_kwargs.get("until"))
        return answers

    def _prompt(self, context: str) -> str:
        """The task's text as the own harness gives a question (``prompts.without_image_tags``): without typed image
        tags (a few tasks write ``<image>``; the chat template places one per image), outer white space trimmed."""
        token = getattr(self.processor, "image_token", None) or getattr(self.tokenizer, "image_token", None)
        return without_image_tags(context, token)

    # ---- log-likelihood ----
    def loglikelihood(self, requests) -> list[GenerationResult]:
        """(negative summed log-probability, is greedy) per request, wrapped so that lmms-eval 0.7.x keeps the pair
        (it turns a bare tuple into a string)."""
        pairs = []
        for request in requests:
            context, continuation, doc_to_visual, doc_id, task, split = request.args[:6]
            doc = self._doc(task, split, doc_id)
            if callable(continuation):
                continuation = continuation(doc)
            if _visuals(doc_to_visual, doc):
                raise NotImplementedError("llava_normaligned: log-likelihood requests with images are not supported "
                                          f"(task {task}); the text-only ones (HellaSwag, MMLU) are")
            pairs.append(encode_pair(self.tokenizer, context, continuation))
        return [GenerationResult(text=(-logprob, greedy))
                for logprob, greedy in score_pairs(self.model, self.tokenizer, pairs, self.batch_size)]

    def generate_until_multi_round(self, requests):
        raise NotImplementedError("llava_normaligned: multi-round generation is not supported")
