"""Forward hooks that read a model as it runs, each a context manager that removes its hooks on exit.

- ``ProjectorTap``: per-token L2 norms of the vision tokens at each stage (vision tower output, projector input,
  projector MLP output, norm output, LLM input) and, for the blog's Experiment 1, the scale alpha applied to the
  vision tokens of the LLM's input embeddings.
- ``ResidualTap``: per-token statistics of the LLM's residual stream h_0 (input embeddings) ... h_L (what each next
  decoder layer reads; the last layer's output, before the final norm), computed layer by layer so that no
  (L, B, S, D) stack is ever held.
- ``AttentionTap``: hands each decoder layer's attention probabilities to a callback (eager attention only).
- ``DeepstackTap``: norms of the deepstack visual features (Qwen3-VL) at the LLM layers they are added to.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from llava_normaligned.compat import attn_implementation
from llava_normaligned.families.probe_points import ProbePoints

from .config import DiagnosticsError

EPS = 1e-12


def _first(output):
    """A module's main output tensor (modules return a tensor, a tuple, or a ModelOutput)."""
    if isinstance(output, torch.Tensor):
        return output
    if hasattr(output, "last_hidden_state"):
        return output.last_hidden_state
    return output[0]


def _hidden_input(args, kwargs) -> torch.Tensor:
    """A decoder layer's hidden-states argument (passed by position or by name)."""
    return args[0] if args else kwargs["hidden_states"]


def _token_norms(x: torch.Tensor) -> torch.Tensor:
    """(..., D) -> (#tokens,) float32 L2 norms on the CPU."""
    return x.detach().float().norm(dim=-1).reshape(-1).cpu()


def cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Cosine similarity along the last dimension, (..., D) x (..., D) -> (...)."""
    return (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1)).clamp_min(EPS)


class _Hooks:
    def __init__(self):
        self._handles = []

    def _add(self, handle):
        self._handles.append(handle)

    def __exit__(self, *exc):
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        return False


class ProjectorTap(_Hooks):
    """Records vision-token norms at each stage and multiplies the vision tokens entering the LLM by ``alpha``.

    Stages (each a list of (#tokens,) tensors, one per forward):
        encoder_output: the vision tower's last hidden state (CLS dropped under the "default" strategy);
        before_projector: the projector's input (the selected vision feature layer);
        after_projector: the projector's MLP output (for a model without a norm: the projector's output);
        after_norm: the projector norm's output (paper §5.1), only when the model has one;
        llm_input: what enters the LLM at the image-token positions, alpha * (the model's own inputs_embeds there).

    The LLM input is read where the language model receives it (its ``inputs_embeds`` at the positions of the image
    token in the base model's ``input_ids``), so that what a family does between its projector and the LLM counts:
    LLaVA-NeXT's unpadding and newline rows, a scaling, a merge. The blog's Experiment 1 scales those positions:
    h_v = alpha * h_v. A projector called on integer ids (Ovis's indicator tokens, rows of its visual embedding
    table) is not a vision-feature pass and is not recorded.
    """

    STAGES = ("encoder_output", "before_projector", "after_projector", "after_norm", "llm_input")

    def __init__(self, points: ProbePoints, alpha: float = 1.0):
        super().__init__()
        self.points = points
        self.alpha = float(alpha)
        self.records = {stage: [] for stage in self.STAGES}
        self._input_ids = None

    def __enter__(self):
        p = self.points
        self._add(p.vision_tower.register_forward_hook(self._on_vision_output))
        self._add(p.projector.register_forward_pre_hook(self._on_projector_input))
        if p.projector_norm is not None:
            self._add(p.projector_norm.register_forward_pre_hook(self._on_norm_input))
            self._add(p.projector_norm.register_forward_hook(self._on_norm_output))
        self._add(p.projector.register_forward_hook(self._on_projector_output))
        self._add(p.base.register_forward_pre_hook(self._on_base_input, with_kwargs=True))
        self._add(p.language_model.register_forward_pre_hook(self._on_llm_input, with_kwargs=True))
        return self

    def _on_vision_output(self, module, args, output):
        hidden = _first(output)  # (B, N(+1), D_vision)
        if self.points.vision_feature_select_strategy == "default":
            hidden = hidden[:, 1:]
        self.records["encoder_output"].append(_token_norms(hidden))

    def _on_projector_input(self, module, args):
        if args and args[0].is_floating_point():
            self.records["before_projector"].append(_token_norms(args[0]))

    def _on_norm_input(self, module, args):
        self.records["after_projector"].append(_token_norms(args[0]))

    def _on_norm_output(self, module, args, output):
        self.records["after_norm"].append(_token_norms(output))

    def _on_projector_output(self, module, args, output):  # (B, N, D_text)
        if self.points.projector_norm is None and args and args[0].is_floating_point():
            self.records["after_projector"].append(_token_norms(output))

    def _on_base_input(self, module, args, kwargs):
        self._input_ids = kwargs.get("input_ids", args[0] if args else None)

    def _on_llm_input(self, module, args, kwargs):
        embeds, ids = kwargs.get("inputs_embeds"), self._input_ids
        if embeds is None or ids is None or ids.shape != embeds.shape[:2]:
            return None
        image = ids.to(embeds.device) == self.points.image_token_id  # (B, S)
        if not image.any():  # a decoding step
            return None
        if self.alpha != 1.0:
            embeds = torch.where(image[..., None], embeds * self.alpha, embeds)
            kwargs = {**kwargs, "inputs_embeds": embeds}
        self.records["llm_input"].append(_token_norms(embeds[image]))
        return (args, kwargs) if self.alpha != 1.0 else None

    def norms(self, stage: str) -> torch.Tensor | None:
        values = self.records[stage]
        return torch.cat(values) if values else None


class ResidualTap(_Hooks):
    """Per-token statistics of the residual stream, one (B, S) tensor per layer l = 0..L in each list of ``stats``.

        norm[l]          ||h_l||
        cos_to_layer0[l] cos(h_l, h_0)
        cos_to_prev[l]   cos(h_l, h_{l-1})            (NaN at l = 0)
        update_abs[l]    ||h_l - h_{l-1}||            (the update written by decoder layer l; NaN at l = 0)
        update_rel[l]    ||h_l - h_{l-1}|| / ||h_{l-1}||
        update_cos[l]    cos(h_l - h_{l-1}, h_{l-1})  (cos of the paper's angle phi between update and state, §3.1)
    """

    STATS = ("norm", "cos_to_layer0", "cos_to_prev", "update_abs", "update_rel", "update_cos")

    def __init__(self, points: ProbePoints):
        super().__init__()
        self.points = points
        self.stats = {name: [] for name in self.STATS}
        self._h0 = self._prev = None

    def __enter__(self):
        # h_l (l < L) is what decoder layer l + 1 reads: layer l's output plus whatever the model adds between layers
        # (Qwen3-VL's deepstack features); h_L is the last layer's output. Without additions the two are the same.
        layers = self.points.layers
        self._add(layers[0].register_forward_pre_hook(self._on_input, with_kwargs=True))
        for layer in layers[1:]:
            self._add(layer.register_forward_pre_hook(self._on_next_input, with_kwargs=True))
        self._add(layers[-1].register_forward_hook(self._on_layer_output))
        return self

    def _on_input(self, module, args, kwargs):
        h0 = _hidden_input(args, kwargs).detach().float()  # (B, S, D)
        for values in self.stats.values():
            values.clear()
        nan = torch.full(h0.shape[:-1], float("nan"))
        self.stats["norm"].append(h0.norm(dim=-1).cpu())
        self.stats["cos_to_layer0"].append(cosine(h0, h0).cpu())
        for name in ("cos_to_prev", "update_abs", "update_rel", "update_cos"):
            self.stats[name].append(nan)
        self._h0 = self._prev = h0

    def _on_next_input(self, module, args, kwargs):
        self._record(_hidden_input(args, kwargs))

    def _on_layer_output(self, module, args, output):
        self._record(_first(output))

    def _record(self, hidden: torch.Tensor):
        h = hidden.detach().float()  # (B, S, D)
        prev = self._prev
        update = h - prev
        update_abs = update.norm(dim=-1)
        self.stats["norm"].append(h.norm(dim=-1).cpu())
        self.stats["cos_to_layer0"].append(cosine(h, self._h0).cpu())
        self.stats["cos_to_prev"].append(cosine(h, prev).cpu())
        self.stats["update_abs"].append(update_abs.cpu())
        self.stats["update_rel"].append((update_abs / prev.norm(dim=-1).clamp_min(EPS)).cpu())
        self.stats["update_cos"].append(cosine(update, prev).cpu())
        self._prev = h

    def stacked(self) -> dict[str, torch.Tensor]:
        """Each statistic as one (L+1, B, S) tensor."""
        if len(self.stats["norm"]) != self.points.num_layers + 1:
            seen, expected = len(self.stats["norm"]), self.points.num_layers + 1
            raise RuntimeError(f"the residual tap saw {seen} hidden states, expected {expected}")
        return {name: torch.stack(values) for name, values in self.stats.items()}


class AttentionTap(_Hooks):
    """Calls ``on_weights(layer_index, probs)`` with each decoder layer's attention probabilities (B, H, Sq, Sk)."""

    def __init__(self, points: ProbePoints, on_weights):
        super().__init__()
        self.points = points
        self.on_weights = on_weights

    def __enter__(self):
        for index, layer in enumerate(self.points.layers):
            self._add(layer.self_attn.register_forward_hook(self._make_hook(index)))
        return self

    def _make_hook(self, index: int):
        def hook(module, args, output):
            weights = output[1] if isinstance(output, tuple) and len(output) > 1 else None
            if weights is None:
                raise DiagnosticsError(
                    "the attention layers returned no attention probabilities: the text model must run with "
                    "eager attention for this probe"
                )
            self.on_weights(index, weights.detach().float())

        return hook


class DeepstackTap(_Hooks):
    """Norms of the deepstack visual features (Qwen3-VL, ``anatomy.Deepstack``) at the LLM layers they enter.

    The text model receives them as forward arguments (features: one (N_vision, D) tensor per entry layer; the image
    positions: (B, S) bool) and adds feature i to the image positions' hidden states after decoder layer
    ``llm_layers[i]``. Per entry layer (lists of (N_vision,) tensors, one per forward):
        features[i]: ||deepstack feature i|| per image token;
        hidden[i]:   ||h|| of the image tokens at the output of that decoder layer, before the feature is added.
    """

    def __init__(self, points: ProbePoints):
        super().__init__()
        self.points = points
        self.layers = list(points.deepstack_llm_layers)
        self.features = {layer: [] for layer in self.layers}
        self.hidden = {layer: [] for layer in self.layers}
        self._mask = None

    def __enter__(self):
        if self.points.deepstack is None:  # a family without deepstack: nothing to read
            return self
        self._add(self.points.language_model.register_forward_pre_hook(self._on_text_model, with_kwargs=True))
        for layer in self.layers:
            self._add(self.points.layers[layer].register_forward_hook(self._on_layer(layer)))
        return self

    def _on_text_model(self, module, args, kwargs):
        spec = self.points.deepstack
        features, mask = kwargs.get(spec.features_kwarg), kwargs.get(spec.mask_kwarg)
        self._mask = None
        if features is None or mask is None:  # a pass without an image
            return
        self._mask = mask.detach().bool()
        for layer, feature in zip(self.layers, features):
            self.features[layer].append(_token_norms(feature))

    def _on_layer(self, layer: int):
        def hook(module, args, output):
            if self._mask is not None:
                hidden = _first(output)  # (B, S, D)
                self.hidden[layer].append(_token_norms(hidden[self._mask.to(hidden.device)]))

        return hook


@contextmanager
def eager_attention(model):
    """Run the language model with eager attention (the only kind that returns probabilities), then restore it."""
    text_config = getattr(model.config, "text_config", model.config)
    previous = attn_implementation(text_config) or "sdpa"
    if previous == "eager":
        yield
        return
    model.set_attn_implementation({"text_config": "eager"})
    try:
        yield
    finally:
        model.set_attn_implementation({"text_config": previous})
