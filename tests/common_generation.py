"""Generation tests for the common model test classes (``tests/common_model_tests.py``).

transformers tests ``generate`` with a ``GenerationTesterMixin`` that lives in ``tests/generation/test_utils.py`` of
its repository, a file its sdist does not ship. This mixin takes its place (``transformers_tests_source`` hands it to
``test_modeling_common.py`` under that name): for every class of ``all_generative_model_classes`` it runs each
generation mode transformers implements in the library (greedy, multinomial sampling, beam search, beam sampling,
assisted decoding, prompt-lookup decoding; contrastive, DoLa, group and constrained beam search live on the Hub
and are not fetched) and checks each against the model's own forward pass, and the cache paths (dynamic, none,
static, continued, left padding) against each other. Image placeholder tokens are never generated
(``suppress_tokens``), as a tiny random model would otherwise emit them.
"""

from __future__ import annotations

import copy

import torch
from transformers import GenerationMixin

from tests.support.numerics import F32_EPS, assert_close_scaled

# Rounding of float32 logits of a 2-layer, 32-wide model computed by two paths (cached decode vs a full forward,
# padded vs unpadded): a few hundred units of float32 rounding relative to the largest logit.
LOGIT_RTOL = 512 * F32_EPS


class GenerationTesterMixin:
    max_new_tokens = 4

    # ---------------------------------------------------------------------------------------------- helpers

    def _generation_setup(self, batch_size: int = 2):
        """(config, inputs): the tester's inputs cut to ``batch_size`` rows; no end-of-sequence token, so that every
        call runs exactly ``max_new_tokens`` steps."""
        config, inputs = self.model_tester.prepare_config_and_inputs_for_common()
        inputs = {k: v[:batch_size] for k, v in inputs.items()}
        text = config.get_text_config(decoder=True)
        text.eos_token_id = None
        return config, inputs

    def _generative_models(self, config, attn_implementation: str | None = None):
        for model_class in self.all_generative_model_classes:
            torch.manual_seed(0)
            model = model_class(copy.deepcopy(config)).eval()
            if attn_implementation is not None:
                model.set_attn_implementation(attn_implementation)
            model.generation_config.eos_token_id = None
            yield model

    def _no_placeholders(self, model) -> dict:
        return {"suppress_tokens": [model.config.image_token_id], "pad_token_id": self.model_tester.pad_token_id}

    def _generate(self, model, inputs, **kwargs):
        options = {"max_new_tokens": self.max_new_tokens, "do_sample": False, **self._no_placeholders(model)}
        options.update(kwargs)
        with torch.no_grad():
            return model.generate(**inputs, **options)

    def _forward_last_logits(self, model, sequences, inputs):
        """Raw last-position logits of a full forward pass over ``sequences`` (no cache), with the image."""
        with torch.no_grad():
            return model(
                input_ids=sequences, pixel_values=inputs["pixel_values"], attention_mask=torch.ones_like(sequences)
            ).logits[:, -1, :]

    # ------------------------------------------------------------------------------------------------ tests

    def test_generation_mixin_is_a_direct_base(self):
        """transformers requires a model that generates to name GenerationMixin among its direct bases."""
        self.assertTrue(self.all_generative_model_classes)
        for model_class in self.all_generative_model_classes:
            self.assertIn(GenerationMixin, model_class.__bases__, model_class.__name__)

    def test_greedy_matches_forward_argmax(self):
        """Greedy decoding with the cache: each new token is the argmax of a full forward pass over the sequence so
        far, and the returned raw logits are that pass's."""
        config, inputs = self._generation_setup()
        for model in self._generative_models(config):
            out = self._generate(model, inputs, return_dict_in_generate=True, output_logits=True, output_scores=True)
            prompt = inputs["input_ids"].shape[1]
            self.assertEqual(tuple(out.sequences.shape), (2, prompt + self.max_new_tokens))
            self.assertEqual(len(out.logits), self.max_new_tokens)
            self.assertEqual(len(out.scores), self.max_new_tokens)
            for step in range(self.max_new_tokens):
                expected = self._forward_last_logits(model, out.sequences[:, : prompt + step], inputs)
                assert_close_scaled(out.logits[step], expected, rtol=LOGIT_RTOL, what=f"step {step} logits")
                expected[:, model.config.image_token_id] = -float("inf")
                self.assertEqual(out.sequences[:, prompt + step].tolist(), expected.argmax(-1).tolist())

    def test_greedy_attentions_and_hidden_states(self):
        """return_dict_in_generate with attentions and hidden states: one entry per step, one tensor per layer, the
        prompt at the first step and one position after."""
        config, inputs = self._generation_setup()
        layers = config.get_text_config().num_hidden_layers
        heads = config.get_text_config().num_attention_heads
        width = config.get_text_config().hidden_size
        for model in self._generative_models(config, attn_implementation="eager"):
            out = self._generate(model, inputs, return_dict_in_generate=True, output_attentions=True,
                                 output_hidden_states=True)
            prompt = inputs["input_ids"].shape[1]
            self.assertEqual(len(out.attentions), self.max_new_tokens)
            self.assertEqual(len(out.hidden_states), self.max_new_tokens)
            for step, (attentions, hidden) in enumerate(zip(out.attentions, out.hidden_states)):
                queries = prompt if step == 0 else 1
                self.assertEqual(len(attentions), layers)
                self.assertEqual(len(hidden), layers + 1)  # embeddings, then each layer
                for layer in attentions:
                    self.assertEqual(tuple(layer.shape), (2, heads, queries, prompt + step))
                    torch.testing.assert_close(layer.sum(-1), torch.ones_like(layer.sum(-1)))  # softmax rows
                for state in hidden:
                    self.assertEqual(tuple(state.shape), (2, queries, width))

    def test_greedy_without_cache_matches_with_cache(self):
        config, inputs = self._generation_setup()
        for model in self._generative_models(config):
            cached = self._generate(model, inputs, use_cache=True)
            uncached = self._generate(model, inputs, use_cache=False)
            self.assertEqual(cached.tolist(), uncached.tolist())

    def test_static_cache_matches_dynamic_cache(self):
        config, inputs = self._generation_setup()
        for model in self._generative_models(config):
            dynamic = self._generate(model, inputs)
            static = self._generate(model, inputs, cache_implementation="static")
            self.assertEqual(dynamic.tolist(), static.tolist())

    def test_generate_continues_from_its_cache(self):
        """Two tokens, then two more from the returned cache (the image is in it already), give the four tokens of
        one call."""
        config, inputs = self._generation_setup()
        for model in self._generative_models(config):
            whole = self._generate(model, inputs)
            first = self._generate(model, inputs, max_new_tokens=2, return_dict_in_generate=True)
            # transformers 5.2x names the cache `cache`; earlier releases `past_key_values`
            name = "cache" if "cache" in first.keys() else "past_key_values"
            resumed = {"input_ids": first.sequences, "attention_mask": torch.ones_like(first.sequences),
                       name: first[name]}
            rest = self._generate(model, resumed, max_new_tokens=self.max_new_tokens - 2)
            self.assertEqual(rest.tolist(), whole.tolist())

    def test_left_padding_keeps_next_token_logits(self):
        """A row left-padded (pad tokens masked out) predicts what it predicts unpadded."""
        config, inputs = self._generation_setup()
        pad = self.model_tester.pad_token_id
        for model in self._generative_models(config):
            with torch.no_grad():
                plain = model(**inputs).logits[:, -1, :]
                padded_ids = torch.cat([torch.full((2, 3), pad), inputs["input_ids"]], dim=1)
                mask = torch.cat([torch.zeros(2, 3, dtype=torch.long), inputs["attention_mask"]], dim=1)
                padded = model(input_ids=padded_ids, attention_mask=mask, pixel_values=inputs["pixel_values"])
            assert_close_scaled(padded.logits[:, -1, :], plain, rtol=LOGIT_RTOL, what="left-padded logits")

    def test_sample_is_seeded_and_top_k_1_is_greedy(self):
        config, inputs = self._generation_setup()
        for model in self._generative_models(config):
            runs = []
            for _ in range(2):
                torch.manual_seed(7)
                runs.append(self._generate(model, inputs, do_sample=True, num_return_sequences=3, top_k=10,
                                           top_p=0.9, temperature=0.8))
            self.assertEqual(tuple(runs[0].shape), (6, inputs["input_ids"].shape[1] + self.max_new_tokens))
            self.assertEqual(runs[0].tolist(), runs[1].tolist())
            self.assertNotIn(model.config.image_token_id, runs[0][:, inputs["input_ids"].shape[1]:].tolist()[0])
            torch.manual_seed(7)
            top1 = self._generate(model, inputs, do_sample=True, top_k=1)
            self.assertEqual(top1.tolist(), self._generate(model, inputs).tolist())

    def test_beam_search_scores_are_sequence_log_probabilities(self):
        """Beam search (3 beams, 2 returned, no length penalty): each returned score is the sum of the log
        probabilities of its new tokens under a full forward pass, and the beams come best first."""
        config, inputs = self._generation_setup()
        prompt = inputs["input_ids"].shape[1]
        for model in self._generative_models(config):
            out = self._generate(model, inputs, num_beams=3, num_return_sequences=2, length_penalty=0.0,
                                 early_stopping=False, return_dict_in_generate=True, output_scores=True)
            self.assertEqual(tuple(out.sequences.shape), (4, prompt + self.max_new_tokens))
            self.assertEqual(tuple(out.sequences_scores.shape), (4,))
            pixel_values = inputs["pixel_values"].repeat_interleave(2, dim=0)
            with torch.no_grad():
                logits = model(input_ids=out.sequences, pixel_values=pixel_values).logits
            log_probs = torch.log_softmax(logits[:, prompt - 1 : -1, :].float(), dim=-1)
            expected = log_probs.gather(-1, out.sequences[:, prompt:, None]).squeeze(-1).sum(-1)
            assert_close_scaled(out.sequences_scores, expected, rtol=LOGIT_RTOL, what="beam scores",
                                scale=float(log_probs.abs().max()) * self.max_new_tokens)
            for row in range(2):
                self.assertGreaterEqual(float(out.sequences_scores[2 * row]), float(out.sequences_scores[2 * row + 1]))

    def test_beam_sample_is_seeded(self):
        config, inputs = self._generation_setup()
        for model in self._generative_models(config):
            runs = []
            for _ in range(2):
                torch.manual_seed(3)
                runs.append(self._generate(model, inputs, do_sample=True, num_beams=2, num_return_sequences=2,
                                           return_dict_in_generate=True, output_scores=True))
            self.assertEqual(tuple(runs[0].sequences.shape), (4, inputs["input_ids"].shape[1] + self.max_new_tokens))
            self.assertEqual(runs[0].sequences.tolist(), runs[1].sequences.tolist())
            self.assertTrue(torch.isfinite(runs[0].sequences_scores).all())

    def test_assisted_decoding_matches_greedy(self):
        """Assisted decoding with a copy of the model as assistant returns the greedy tokens (batch of 1, as
        assisted decoding requires)."""
        config, inputs = self._generation_setup(batch_size=1)
        for model in self._generative_models(config):
            assistant = copy.deepcopy(model)
            greedy = self._generate(model, inputs)
            assisted = self._generate(model, inputs, assistant_model=assistant)
            self.assertEqual(assisted.tolist(), greedy.tolist())

    def test_prompt_lookup_decoding_matches_greedy(self):
        config, inputs = self._generation_setup(batch_size=1)
        for model in self._generative_models(config):
            greedy = self._generate(model, inputs)
            lookup = self._generate(model, inputs, prompt_lookup_num_tokens=2, max_matching_ngram_size=1)
            self.assertEqual(lookup.tolist(), greedy.tolist())
