"""transformers' common model tests, run for stock LLaVA and for this package's classes with one tiny configuration.

``StockLlavaCommonTest`` runs them for ``LlavaModel`` / ``LlavaForConditionalGeneration``, ``NormAlignedCommonTest``
for ``LlavaNormAlignedModel`` / ``LlavaNormAlignedForConditionalGeneration``: the same ``ModelTesterMixin`` (from the
installed transformers' sdist, ``transformers_tests_source``), the same ``ConfigTester``, this project's generation
tests (``common_generation``), the same tiny model (``TinyLlavaTester``), the same skips. The norm-aligned
configuration adds only the projector norm's fields, set as ``compose`` writes them.

This module is not collected by a plain ``pytest`` run (its name does not start with ``test_``):
``tests/test_transformers_common.py`` runs it in a subprocess and compares the two classes' outcomes test by test.
To run it by hand: ``python -m pytest tests/common_model_tests.py -k NormAligned``.
"""

from __future__ import annotations

import copy
import unittest

import torch
from common_generation import GenerationTesterMixin
from parameterized import parameterized
from transformers import LlavaConfig, LlavaForConditionalGeneration, LlavaModel
from transformers.models.auto import modeling_auto
from transformers_tests_source import import_common_tests

from modeling_llava_normaligned import (
    LlavaNormAlignedConfig,
    LlavaNormAlignedForConditionalGeneration,
    LlavaNormAlignedModel,
)

_modeling_common, _configuration_common = import_common_tests(GenerationTesterMixin)
ModelTesterMixin = _modeling_common.ModelTesterMixin
ConfigTester = _configuration_common.ConfigTester
floats_tensor = _modeling_common.floats_tensor
ids_tensor = _modeling_common.ids_tensor

# The common tests pick the inputs and labels of a class by its name in transformers' static name tables (an
# image-text-to-text model gets LM labels in the training tests, for instance). A model inside transformers is listed
# there; ours are registered with the Auto classes at run time, which those tables do not see. Listing them under
# their model_type, as transformers lists LLaVA, makes the tests treat both alike.
_MODEL_TYPE = LlavaNormAlignedConfig.model_type
modeling_auto.MODEL_MAPPING_NAMES.setdefault(_MODEL_TYPE, LlavaNormAlignedModel.__name__)
modeling_auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES.setdefault(
    _MODEL_TYPE, LlavaNormAlignedForConditionalGeneration.__name__
)

# The projector norm's fields as `compose` writes them: T given (compose measures it on the LLM), gain T / sqrt(D).
NORM_FIELDS = {"projector_norm": "layernorm", "norm_target": 0.5, "norm_init": "target", "gradient_compensation": True}


class TinyLlavaTester:
    """A tiny LLaVA: 2-layer, 32-wide Llama (vocabulary 99) and 2-layer, 32-wide CLIP vision model on 8x8 images in
    2x2 patches (16 image tokens, CLS dropped); a batch of 3 rows of 16 image tokens then 7 text tokens."""

    def __init__(self, parent, config_class, **extra_config):
        self.parent = parent
        self.config_class = config_class
        self.extra_config = extra_config
        self.batch_size = 3
        self.is_training = True
        self.image_token_index = 0
        self.pad_token_id = 1
        self.text_config = {
            "model_type": "llama",
            "vocab_size": 99,
            "hidden_size": 32,
            "intermediate_size": 37,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "hidden_act": "silu",
            "max_position_embeddings": 512,
            "initializer_range": 0.02,
            "pad_token_id": self.pad_token_id,
        }
        self.vision_config = {
            "model_type": "clip_vision_model",
            "image_size": 8,
            "patch_size": 2,
            "num_channels": 3,
            "hidden_size": 32,
            "intermediate_size": 37,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "projection_dim": 32,
            "dropout": 0.1,
            "attention_dropout": 0.1,
            "initializer_range": 0.02,
        }
        self.num_image_tokens = (self.vision_config["image_size"] // self.vision_config["patch_size"]) ** 2
        self.text_length = 7
        self.seq_length = self.num_image_tokens + self.text_length
        self.encoder_seq_length = self.seq_length
        self.vocab_size = self.text_config["vocab_size"]
        self.hidden_size = self.text_config["hidden_size"]
        self.num_hidden_layers = self.text_config["num_hidden_layers"]
        self.num_attention_heads = self.text_config["num_attention_heads"]

    def get_config(self):
        return self.config_class(
            text_config=copy.deepcopy(self.text_config),
            vision_config=copy.deepcopy(self.vision_config),
            image_token_index=self.image_token_index,
            projector_hidden_act="gelu",
            vision_feature_select_strategy="default",
            vision_feature_layer=-1,
            image_seq_length=self.num_image_tokens,
            **self.extra_config,
        )

    def prepare_config_and_inputs(self):
        size = self.vision_config["image_size"]
        pixel_values = floats_tensor([self.batch_size, self.vision_config["num_channels"], size, size])
        return self.get_config(), pixel_values

    def prepare_config_and_inputs_for_common(self):
        config, pixel_values = self.prepare_config_and_inputs()
        # text ids from 2 up (0 is the image token, 1 the pad), then the image's placeholders in front
        input_ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size - 2) + 2
        input_ids[:, : self.num_image_tokens] = self.image_token_index
        attention_mask = torch.ones_like(input_ids)
        return config, {"pixel_values": pixel_values, "input_ids": input_ids, "attention_mask": attention_mask}


class _LlavaCommonTests(ModelTesterMixin, GenerationTesterMixin):
    """The tests of one pair of (base model, model with LM head) classes; subclasses name the classes."""

    config_class = None
    extra_config: dict = {}
    _is_composite = True
    # transformers runs test_can_init_all_missing_weights for a model whose configuration file carries a copyright
    # year of 2023 or later (LLaVA's does); ours carries none, so the flag that runs it regardless is set, for both.
    test_can_init_all_missing_weights_before_2023 = True

    def setUp(self):
        self.model_tester = TinyLlavaTester(self, self.config_class, **self.extra_config)
        self.config_tester = ConfigTester(
            self,
            config_class=self.config_class,
            has_text_modality=False,
            common_properties=["image_token_index", "vision_feature_layer", "image_seq_length"],
        )

    def test_config(self):
        self.config_tester.run_common_tests()

    def test_image_and_placeholder_counts_must_agree(self):
        """A row with image placeholders and no image, or two placeholder runs for one image, is an error; two
        images for two runs are not."""
        config, inputs = self.model_tester.prepare_config_and_inputs_for_common()
        for model_class in self.all_model_classes:
            model = model_class(config).eval()
            with torch.no_grad():
                model(**inputs)
                fewer = dict(inputs, pixel_values=inputs["pixel_values"][:1])
                with self.assertRaises((RuntimeError, ValueError)):
                    model(**fewer)
                two_rows = torch.cat([inputs["input_ids"][:1]] * 2)
                with self.assertRaises((RuntimeError, ValueError)):
                    model(input_ids=two_rows, pixel_values=inputs["pixel_values"][:1])
                model(input_ids=two_rows, pixel_values=torch.cat([inputs["pixel_values"][:1]] * 2))

    @parameterized.expand([(-1,), ([-1],), ([-1, -2],)])
    def test_vision_feature_layers(self, layers):
        """One vision layer or several, concatenated: the projector's input width follows, and the model runs."""
        config, inputs = self.model_tester.prepare_config_and_inputs_for_common()
        config.vision_feature_layer = layers
        count = 1 if isinstance(layers, int) else len(layers)
        for model_class in self.all_model_classes:
            model = model_class(config).eval()
            base = getattr(model, "model", model)
            self.assertEqual(base.multi_modal_projector.linear_1.in_features, count * config.vision_config.hidden_size)
            with torch.no_grad():
                model(**inputs)


# Tests transformers' own LLaVA tests skip, with their reasons: skipped here for both classes alike (those this
# transformers' ModelTesterMixin does not have are left out).
_GRADIENT_CHECKPOINTING = "skipped for LLaVA by transformers: gradients under gradient checkpointing (its PR 27124)"
LLAVA_SKIPS = {
    "test_training_gradient_checkpointing": _GRADIENT_CHECKPOINTING,
    "test_training_gradient_checkpointing_use_reentrant": _GRADIENT_CHECKPOINTING,
    "test_training_gradient_checkpointing_use_reentrant_false": _GRADIENT_CHECKPOINTING,
    "test_training_gradient_checkpointing_use_reentrant_true": _GRADIENT_CHECKPOINTING,
    "test_flash_attention_2_padding_matches_padding_free_with_position_ids":
        "skipped for LLaVA by transformers: pad-free VLM inputs are tested with the LLMs",
}
for _name, _reason in LLAVA_SKIPS.items():
    if hasattr(ModelTesterMixin, _name):
        setattr(_LlavaCommonTests, _name, unittest.skip(_reason)(getattr(ModelTesterMixin, _name)))


class StockLlavaCommonTest(_LlavaCommonTests, unittest.TestCase):
    """Stock transformers LLaVA: the reference."""

    all_model_classes = (LlavaModel, LlavaForConditionalGeneration)
    config_class = LlavaConfig


class NormAlignedCommonTest(_LlavaCommonTests, unittest.TestCase):
    """This package's classes, with the projector norm and GWC on."""

    all_model_classes = (LlavaNormAlignedModel, LlavaNormAlignedForConditionalGeneration)
    config_class = LlavaNormAlignedConfig
    extra_config = NORM_FIELDS
