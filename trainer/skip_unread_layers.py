"""Skip, during training, the vision-tower compute whose result LLaVA never reads.

LLaVA takes ``hidden_states[vision_feature_layer]`` of the vision tower (the penultimate layer in LLaVA-1.5), yet the
tower runs every encoder layer, then the post layernorm and SigLIP's attention-pooling head, whose outputs are
dropped. While training, the encoder layers after the deepest feature layer pass their input through unchanged
(the hidden-state list keeps its length, so ``hidden_states[-2]`` is still the same tensor) and the pooling head
returns nothing. The weights are untouched and everything is restored when the context exits, so saved checkpoints
and inference run the model as written. Nothing LLaVA reads changes: the test suite compares losses and gradients.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager

from llava_normaligned.compat import forwards_replaced
from llava_normaligned.families.anatomy import anatomy_of

from .stages import deepest_feature_layer, llava_base, vision_encoder_layers

logger = logging.getLogger(__name__)


def _pass_through(hidden_states, *args, **kwargs):
    return hidden_states


def _no_pooling(hidden_states, *args, **kwargs):
    return None


def unused_vision_modules(model) -> tuple[list, list]:
    """(encoder layers after the deepest feature layer, pooling heads) of a LLaVA's vision tower; only the pooling
    head for a family whose connector reads the tower's last output (``Family.vision_output``)."""
    owner, layers = vision_encoder_layers(model)
    head = getattr(owner, "head", None)
    heads = [head] if head is not None else []
    if anatomy_of(model).family.vision_output != "hidden_states":
        return [], heads  # every layer is read: only the pooling head runs for nothing
    if layers is None:
        return [], []
    deepest = deepest_feature_layer(llava_base(model).config.vision_feature_layer, len(layers))
    return list(layers)[deepest:], heads


@contextmanager
def skip_unused_vision_compute(model, enabled: bool = True):
    """Within the context, unused vision layers pass their input through and the pooling head is skipped."""
    layers, heads = unused_vision_modules(model) if enabled else ([], [])
    patched = [(module, _pass_through) for module in layers] + [(module, _no_pooling) for module in heads]
    with forwards_replaced(patched):  # back to the class's forward on exit
        if patched:
            logger.info("training skips %d vision layer(s) and %d pooling head(s) whose outputs LLaVA never reads",
                        len(layers), len(heads))
        yield


__all__ = ["skip_unused_vision_compute", "unused_vision_modules"]
