"""Runs every probe on one model, batch by batch, and returns its numbers as one JSON-ready dict.

Per batch, in order (the passes that need attention probabilities run with eager attention, the others as loaded):
    1. greedy decoding of n tokens with the real image;
    2. the reference pass (eager): prompt + the first n-1 greedy tokens, teacher-forced, alpha = 1. It feeds RQ2
       (vision norms), RQ3 (residual stream), the attention masses, and the references of the alpha sweep;
    3. one pass per alpha (eager), compared to the reference;
    4. the prompt with a blank image and with no image (the blog's Ablation 1);
    5. the KV-cache substitution (the blog's Experiment 3).
"""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass, replace

import torch

from llava_normaligned.checks import BadInput, check_output_folder
from llava_normaligned.families.anatomy import AnatomyError
from llava_normaligned.families.probe_points import ProbePoints, locate
from llava_normaligned.generation import placeholder_token_ids

from . import blog, passes, probes
from .config import DiagnoseConfig, DiagnosticsError
from .inputs import Batch, Sample
from .readings import directions
from .taps import AttentionTap, DeepstackTap, ProjectorTap, ResidualTap, eager_attention
from .theory import compare_rotation


def _progress(iterable, enabled: bool, **kwargs):
    if not enabled:
        return iterable
    from tqdm.auto import tqdm

    return tqdm(iterable, **kwargs)


def _fan_out(*callbacks):
    def call(layer, probs):
        for callback in callbacks:
            callback(layer, probs)

    return call


def check_model(model_id: str, revision: str | None, config: DiagnoseConfig, what: str = "model") -> None:
    """What can be told of a model before it loads: a folder or Hub id with a config (and, for a folder, weights)
    of a vision-language model. A DiagnosticsError names it (``what``: ``model`` or ``--baseline``)."""
    from llava_normaligned.loading import check_source, load_config

    try:
        check_source(model_id, what, revision=revision)
        model_config = load_config(model_id, revision=revision, trust_remote_code=config.trust_remote_code)
    except (ValueError, OSError) as err:
        raise DiagnosticsError(f"cannot read the config of {model_id!r}: {err}") from err
    if getattr(model_config, "vision_config", None) is None:
        raise DiagnosticsError(
            f"cannot probe {model_id!r}: it is not a vision-language model (its config, model_type "
            f"{model_config.model_type!r}, has no vision_config, so no vision tower or projector)"
        )


def load(model_id: str, revision: str | None, config: DiagnoseConfig):
    """(model, processor) of a Hub id or folder; a DiagnosticsError for every way loading can fail (config, device,
    missing package, not a vision-language model)."""
    from llava_normaligned.families.processors import ProcessorUnavailable
    from llava_normaligned.loading import load_model

    check_model(model_id, revision, config)
    try:
        return load_model(
            model_id,
            revision=revision,
            device=config.device,
            dtype=config.dtype,
            trust_remote_code=config.trust_remote_code,
        )
    except AnatomyError as err:  # loaded, but its parts are not where any family keeps them
        raise DiagnosticsError(f"cannot probe {err}") from None
    except ProcessorUnavailable as err:  # AutoProcessor failed and so did the family's builder
        raise DiagnosticsError(f"cannot probe {err}") from None
    except (ValueError, KeyError, OSError, RuntimeError, ImportError) as err:  # RuntimeError: a device it lacks
        raise DiagnosticsError(f"cannot load {model_id!r} as an image-text-to-text model: {err}") from err


@dataclass
class Accumulators:
    vision_norms: dict
    layers: probes.LayerStats
    attention: blog.AttentionMass
    vision_attention: blog.VisionAttention
    sweep: blog.AlphaSweep
    ablations: blog.Ablations
    kv: blog.KVSubstitution
    generated: list
    text_rules: set
    deepstack: dict  # "features" / "hidden": LLM layer -> list of (N,) norms (Qwen3-VL; empty for other families)

    @classmethod
    def new(cls, num_layers: int, alphas) -> Accumulators:
        return cls(
            vision_norms={stage: [] for stage in ProjectorTap.STAGES},
            layers=probes.LayerStats(),
            attention=blog.AttentionMass(num_layers),
            vision_attention=blog.VisionAttention(num_layers),
            sweep=blog.AlphaSweep(alphas, num_layers),
            ablations=blog.Ablations(),
            kv=blog.KVSubstitution(),
            generated=[],
            text_rules=set(),
            deepstack={"features": {}, "hidden": {}},
        )


@dataclass
class Positions:
    """Masks over the teacher-forced sequence (prompt of S_p tokens + n-1 greedy tokens), each (B, S_p + n - 1)."""

    vision: torch.Tensor  # image tokens
    prompt_text: torch.Tensor  # the tokens of the prompt's own text
    template: torch.Tensor  # the prompt's other non-padding tokens (BOS, chat-template tokens)
    text_keys: torch.Tensor  # every non-padding non-image token, template and generated ones included (as keys,
    # vision and text then share all the attention)
    prefill_queries: torch.Tensor  # prompt text tokens after the first image token
    decode_queries: torch.Tensor  # the generated tokens fed back
    scored: slice  # the n positions predicting the greedy tokens
    prompt_length: int

    @classmethod
    def of(cls, batch: Batch, new_tokens: int) -> Positions:
        extra = new_tokens - 1
        pad = torch.zeros(batch.image_mask.shape[0], extra, dtype=torch.bool)
        after_image = batch.image_mask.long().cumsum(-1) > 0
        prompt_length = batch.image_mask.shape[1]
        return cls(
            vision=torch.cat([batch.image_mask, pad], 1),
            prompt_text=torch.cat([batch.text_mask, pad], 1),
            template=torch.cat([batch.template_mask, pad], 1),
            text_keys=torch.cat([batch.text_mask | batch.template_mask, ~pad], 1),
            prefill_queries=torch.cat([batch.text_mask & after_image, pad], 1),
            decode_queries=torch.cat([torch.zeros_like(batch.image_mask), ~pad], 1),
            scored=slice(prompt_length - 1, prompt_length + extra),
            prompt_length=prompt_length,
        )


def _reference_pass(points: ProbePoints, batch: Batch, appended, pos: Positions, acc: Accumulators, n: int):
    """Teacher-forced pass with the real image at alpha = 1 (eager). Returns (log-probs (B, n, V), cache)."""
    mass = acc.attention.hook(
        pos.vision, pos.text_keys, {"prefill": pos.prefill_queries, "decode": pos.decode_queries}
    )
    capture = acc.vision_attention.capture(pos.vision, pos.scored)
    model = points.model
    with eager_attention(model), ProjectorTap(points) as projector, ResidualTap(points) as residual:
        with AttentionTap(points, _fan_out(mass, capture)), DeepstackTap(points) as deepstack:
            out = passes.run(model, batch.inputs, appended=appended, logits_to_keep=n, use_cache=True)
    for stage, values in projector.records.items():
        acc.vision_norms[stage] += values
    for kind, records in (("features", deepstack.features), ("hidden", deepstack.hidden)):
        for layer, values in records.items():
            acc.deepstack[kind].setdefault(layer, []).extend(values)
    stacked = residual.stacked()
    acc.layers.add(stacked, {"vision": pos.vision, "text": pos.prompt_text, "template": pos.template,
                             "all": pos.vision | pos.prompt_text})
    acc.ablations.add("real", stacked, pos.prompt_text)
    return torch.log_softmax(out.logits.float(), dim=-1).cpu(), passes.output_cache(out)


def _alpha_pass(points, batch, appended, pos, acc, n, alpha, ref_logprobs, ref_cache):
    attention_kl, decode_mass = acc.sweep.attention_sinks(alpha)
    callbacks = _fan_out(
        acc.vision_attention.compare(pos.vision, pos.scored, attention_kl),
        decode_mass.hook(pos.vision, pos.text_keys, {"decode": pos.decode_queries}),
    )
    with eager_attention(points.model), ProjectorTap(points, alpha) as projector:
        with AttentionTap(points, callbacks):
            out = passes.run(points.model, batch.inputs, appended=appended, logits_to_keep=n, use_cache=True)
    acc.sweep.add_outputs(
        alpha,
        ref_logprobs,
        out.logits,
        passes.cache_layers(ref_cache),
        passes.cache_layers(passes.output_cache(out)),
        pos.vision,
        projector.norms("llm_input"),
    )


def _ablation_passes(points, batch: Batch, acc: Accumulators, first_token_logprobs):
    text_mask = batch.text_mask
    with ResidualTap(points) as residual:
        out = passes.run(points.model, batch.inputs, pixel_values=batch.blank_pixel_values, logits_to_keep=1)
    acc.ablations.add("blank", residual.stacked(), text_mask)
    acc.ablations.add_next_token("blank", first_token_logprobs, out.logits[:, -1])
    with ResidualTap(points) as residual:
        out = passes.run(points.model, batch.text_only, logits_to_keep=1)
    acc.ablations.add("no_image", residual.stacked(), batch.text_only_mask)
    acc.ablations.add_next_token("no_image", first_token_logprobs, out.logits[:, -1])


def _kv_substitution(points, batch: Batch, acc: Accumulators):
    model, inputs = points.model, batch.inputs
    real = passes.prefix_cache(model, inputs)
    blank = passes.prefix_cache(model, inputs, pixel_values=batch.blank_pixel_values)
    hybrid = passes.splice_cache(real, blank, batch.image_mask[:, :-1])
    last, mask, deltas = inputs["input_ids"][:, -1:], inputs["attention_mask"], passes.rope_deltas(model, inputs)
    logits = [passes.step(model, cache, last, mask, deltas)[0] for cache in (real, blank, hybrid)]
    acc.kv.add(*logits)


def diagnose_batch(points: ProbePoints, batch: Batch, config: DiagnoseConfig, acc: Accumulators, tokenizer,
                   stage=lambda name: None, suppress=()):
    """All passes of one batch; ``stage(name)`` is called as each begins (for the progress bar); ``suppress``: the
    token ids greedy decoding never picks (``generation.placeholder_token_ids``)."""
    if batch.image_mask[:, -1].any():
        raise DiagnosticsError("a formatted prompt ends with an image token: the probes need a text token last")
    n = config.max_new_tokens
    acc.text_rules.add(batch.text_rule)
    stage("greedy decoding")
    greedy = passes.greedy_continuation(points.model, batch.inputs, n, suppress)  # (B, n)
    acc.generated += tokenizer.batch_decode(greedy, skip_special_tokens=False)
    appended = greedy[:, : n - 1] if n > 1 else None
    pos = Positions.of(batch, n)
    stage("reference pass")
    ref_logprobs, ref_cache = _reference_pass(points, batch, appended, pos, acc, n)
    for alpha in config.alphas:
        stage(f"alpha={alpha:g}")
        _alpha_pass(points, batch, appended, pos, acc, n, alpha, ref_logprobs, ref_cache)
    del ref_cache
    stage("blank/no-image ablations")
    _ablation_passes(points, batch, acc, ref_logprobs[:, 0])
    stage("KV substitution")
    _kv_substitution(points, batch, acc)


def _model_facts(model_id: str, revision, points: ProbePoints) -> dict:
    from ..local_paths import public_name

    config = points.model.config
    text_config = getattr(config, "text_config", config)
    vision_config = getattr(config, "vision_config", None)
    return {
        "model_id": public_name(model_id),
        "revision": revision,
        "model_class": type(points.model).__name__,
        "model_type": getattr(config, "model_type", None),
        "family": points.family.name,
        "image_tokens": points.family.image_tokens,  # where the image tokens enter the LLM
        "projector_norm": type(points.projector_norm).__name__ if points.projector_norm is not None else None,
        "norm_target": getattr(config, "norm_target", None),
        "text_model_type": getattr(text_config, "model_type", None),
        "vision_model_type": getattr(vision_config, "model_type", None),
        "hidden_size": getattr(text_config, "hidden_size", None),
        "num_layers": points.num_layers,
        "dtype": str(next(points.model.parameters()).dtype).replace("torch.", ""),
    }


def deepstack_summary(points: ProbePoints, acc: Accumulators, target: float | None) -> dict | None:
    """Per LLM layer receiving deepstack features (Qwen3-VL): their norm statistics, the ratio of their mean norm to
    T and to the mean ||h|| of the image tokens they are added to. None for a family without deepstack."""
    if points.deepstack is None:
        return None
    layers = []
    for llm_layer, vision_layer in zip(points.deepstack_llm_layers, points.deepstack_vision_layers):
        features = probes.norm_stats(_cat(acc.deepstack["features"].get(llm_layer)))
        hidden = probes.norm_stats(_cat(acc.deepstack["hidden"].get(llm_layer)))
        layers.append({
            "llm_layer": llm_layer,  # added to the image positions after this decoder layer (0-based)
            "vision_layer": vision_layer,  # the vision block whose output the deepstack merger reads
            "norm": features,
            "ratio_to_text": features["mean"] / target if features and target else None,
            "hidden_norm": hidden,
            "ratio_to_hidden": features["mean"] / hidden["mean"] if features and hidden and hidden["mean"] else None,
        })
    entry = "each added to the image tokens' hidden states after the LLM layer shown (0-based)"
    return {"entry": entry, "layers": layers}


def _cat(values):
    return torch.cat(values) if values else None


def summarise(acc: Accumulators, text_norm: dict, samples: list[Sample]) -> dict:
    target = text_norm["T"]
    vision_norm = probes.vision_norm(acc.vision_norms, target)
    layers = acc.layers.summary()
    pooled = {name: curve.tolist() for name, curve in acc.layers.mean_curves("all").items()}
    llm_input = vision_norm["llm_input"]
    text_layer0 = layers["text"]["norm"][0] if layers.get("text") else None
    text_median0 = layers["text"]["norm_median"][0] if layers.get("text") else None
    numbers = {
        "num_samples": len(samples),
        "samples": [
            {"image": os.path.basename(s.image_path), "prompt": s.prompt, "greedy_tokens": g}
            for s, g in zip(samples, acc.generated)
        ],
        "text_embedding_norm": text_norm,
        "vision_norm": vision_norm,
        "vision_text_norm_ratio": llm_input["mean"] / target if llm_input and target else None,
        "vision_text_norm_ratio_prompt": (
            layers["vision"]["norm"][0] / text_layer0 if layers.get("vision") and text_layer0 else None
        ),
        "vision_text_norm_ratio_prompt_median": (
            layers["vision"]["norm_median"][0] / text_median0 if layers.get("vision") and text_median0 else None
        ),
        "text_tokens": {
            "rule": ", ".join(sorted(acc.text_rules)),  # inputs.TEXT_RULE_SPAN, or the fallback
            "text": "the tokens of the prompt's own text",
            "template": "the other non-image tokens of the formatted prompt (BOS, chat-template tokens), reported "
            "apart from the text",
        },
        "layers": layers,
        "attention": acc.attention.summary(),
        "alpha_sweep": acc.sweep.summary(target),
        "ablations": acc.ablations.summary(),
        "kv_substitution": acc.kv.summary(),
        "theory": compare_rotation(layers, pooled),
    }
    numbers["directions"] = directions(numbers)  # which way each measurement points (readings.RULES)
    return numbers


def probe_model(model, processor, config: DiagnoseConfig, samples: list[Sample], model_id: str = "model",
                revision=None, label: str = "model") -> dict:
    """Every probe on a model already in memory (as ``load_model`` returns it, in eval mode)."""
    from .family_batches import batches_for

    try:
        points = locate(model, model_id)
    except AnatomyError as error:
        raise DiagnosticsError(str(error)) from None
    batches = batches_for(model.config)(
        processor, model.config, samples, config.batch_size, config.max_new_tokens, config.prompts or "prompts"
    )
    text_norm = probes.text_embedding_norm(points, processor.tokenizer, config.top_k)
    acc = Accumulators.new(points.num_layers, config.alphas)
    bar = _progress(batches, config.progress, desc=f"diagnose {label}", unit="batch")
    stage = bar.set_postfix_str if config.progress else (lambda name: None)
    suppress = placeholder_token_ids(model, processor)
    for batch in bar:
        diagnose_batch(points, batch, config, acc, processor.tokenizer, stage, suppress)
    summary = summarise(acc, text_norm, samples)
    deepstack = deepstack_summary(points, acc, text_norm["T"])
    extra = {"deepstack": deepstack} if deepstack else {}
    if points.family is not None and points.family.projector_input == "visual_vocabulary":  # Ovis: paper RQ4
        from .visual_vocabulary import measure

        extra["visual_tokens"] = measure(points, batches, text_norm["T"])
    return {**_model_facts(model_id, revision, points), **summary, **extra}


def diagnose_model(config: DiagnoseConfig, model_id: str, revision, samples: list[Sample], label: str) -> dict:
    """Load a model, run every probe on it, and free it."""
    model, processor = load(model_id, revision, config)
    try:
        return probe_model(model, processor, config, samples, model_id, revision, label)
    finally:
        del model
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def diagnose(config: DiagnoseConfig) -> tuple[dict, list[str]]:
    """Run every probe on ``config.model`` (and ``config.baseline``), write the outputs; returns (document, paths).

    The inputs are checked before any model is loaded, and nothing is written until every number is computed.
    """
    from .default_inputs import default_images_dir, default_prompts_file
    from .inputs import list_images, load_prompts, pair_samples
    from .output_files import build_document, json_safe, write_outputs

    if config.plots:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise DiagnosticsError(
                "the figures need matplotlib: pip install 'llava-normaligned[diagnostics]', or pass --no-plots"
            ) from None
    # the defaults resolved into a copy: the caller's config is only read
    config = replace(config, images=config.images or default_images_dir(),
                     prompts=config.prompts or default_prompts_file())
    samples = pair_samples(list_images(config.images), load_prompts(config.prompts), config.max_samples)
    try:
        check_output_folder("--output-dir", config.output_dir)
    except BadInput as err:
        raise DiagnosticsError(str(err)) from None
    check_model(config.model, config.revision, config)
    if config.baseline:  # before the main model's diagnosis: a wrong baseline fails in seconds
        check_model(config.baseline, config.baseline_revision, config, "--baseline")
    main = diagnose_model(config, config.model, config.revision, samples, "model")
    baseline = None
    if config.baseline:
        baseline = diagnose_model(config, config.baseline, config.baseline_revision, samples, "baseline")
    document = build_document(config.to_dict(), main, baseline)
    figures = []
    if config.plots:
        from .plots import write_figures

        figures = write_figures(json_safe(document), config.output_dir)  # the numbers as the JSON holds them
    return document, write_outputs(document, config.output_dir, figures)
