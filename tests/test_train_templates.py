"""Answer-only labels with the official chat templates of the LLMs the paper and users pair with LLaVA: Llama 3.2
Instruct, Qwen2.5 Instruct, Qwen3 and SmolLM2 Instruct, vendored below as shipped (no ``{% generation %}`` markers,
so answers are located by placeholder rendering, ``masking.py``). Multi-turn rows with a system message and an
image, through the real processor, the up-front preparation and the collator; what cannot be masked is refused."""

from __future__ import annotations

import os

import pytest

from llava_normaligned.compose import multimodal_chat_template
from llava_normaligned.trainer.collator import IGNORE_INDEX, LlavaTrainingCollator
from llava_normaligned.trainer.data import load_llava_json
from llava_normaligned.trainer.masking import ConversationRenderer, TemplateError, template_messages
from llava_normaligned.trainer.preprocess import prepare_dataset
from tests.support.templates import SMOLLM2, TEMPLATES, multimodal_template
from tests.support.training import write_llava_dataset

# ----------------------------------------------------------------------------------------- the official templates
# Byte for byte as their tokenizers ship them (TRL keeps identical copies for its template identification; the
# first test compares). Llama 3.2 and Qwen2.5 end with a newline, Qwen3 and SmolLM2 do not.





TRL_COPIES = {"llama3.2": "llama3_2.jinja", "qwen2.5": "qwen2_5.jinja", "qwen3": "qwen3.jinja"}

# What each template trains on in a two-turn row (answers "red", then "no"): the answer and the end-of-turn token.
# Qwen3 writes an empty think block in the last assistant turn only: it belongs to what the model emits there.
EXPECTED = {
    "llama3.2": ["red<|eot_id|>", "no<|eot_id|>"],
    "qwen2.5": ["red<|im_end|>", "no<|im_end|>"],
    "qwen3": ["red<|im_end|>", "<think>\n\n</think>\n\nno<|im_end|>"],
    "smollm2": ["red<|im_end|>", "no<|im_end|>"],
}
SYSTEM = {"role": "system", "content": "Answer in one word."}




def test_vendored_templates_are_the_shipped_ones():
    import trl

    folder = os.path.join(os.path.dirname(trl.__file__), "chat_templates")
    for name, file in TRL_COPIES.items():
        with open(os.path.join(folder, file), encoding="utf-8") as handle:
            assert handle.read() == TEMPLATES[name], name
    # SmolLM2's documented rendering: its default system prompt, ChatML turns
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, _ = render_jinja_template(conversations=[[{"role": "user", "content": "Hi"}]], chat_template=SMOLLM2,
                                        add_generation_prompt=True)
    assert rendered[0] == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                           "<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize("name", list(TEMPLATES))
def test_multi_turn_answers_are_located_exactly(tiny_processor, name):
    renderer = ConversationRenderer(tiny_processor, multimodal_template(tiny_processor, name))
    assert renderer.method == "placeholder-rendering"
    # the second question contains the first answer's word: the answers are found by position, not by their text
    messages = [SYSTEM, {"role": "user", "content": "what colour is it ?"}, {"role": "assistant", "content": "red"},
                {"role": "user", "content": "is it red and round ?"}, {"role": "assistant", "content": "no"}]
    text, spans = renderer.render(messages, n_images=1, name="row id 'x'")
    assert [text[s:e] for s, e in spans] == EXPECTED[name]
    assert text.count("<image>") == 1 and "Answer in one word." in text
    # what is not trained on: everything up to each answer's header, and what follows each end-of-turn token
    assert "what colour" not in "".join(text[s:e] for s, e in spans)
    if name == "qwen3":  # the old prefix method refused this row: the first turns render differently alone
        first_turns, _ = renderer._render(template_messages(messages[:3], n_images=1))
        assert not text.startswith(first_turns)


@pytest.mark.parametrize("name", list(TEMPLATES))
def test_labels_through_the_collator(tiny_processor, tmp_path, name):
    path, images = write_llava_dataset(tmp_path, n_rows=4, text_only=1)
    dataset = load_llava_json(path, images)
    prepared, report = prepare_dataset(dataset, tiny_processor, max_length=None,
                                       chat_template=multimodal_template(tiny_processor, name))
    assert report.masking == "placeholder-rendering" and report.rows_out == 5
    batch = LlavaTrainingCollator(tiny_processor)([prepared[i] for i in (0, 1, 4)])  # two-turn, one-turn, text-only
    tok = tiny_processor.tokenizer
    trained = [tok.decode(batch["input_ids"][b][batch["labels"][b] != IGNORE_INDEX]) for b in range(3)]
    last = EXPECTED[name][1].replace("no", "{}")
    assert trained == ["".join(EXPECTED[name]), last.format("green"), last.format("one")]
    assert not (batch["labels"] == tiny_processor.image_token_id).any()


def test_qwen3_reasoning_in_an_earlier_turn_is_dropped_as_the_template_does(tiny_processor):
    renderer = ConversationRenderer(tiny_processor, multimodal_template(tiny_processor, "qwen3"))
    messages = [{"role": "user", "content": "colour ?"},
                {"role": "assistant", "content": "<think>\nit looks red\n</think>\n\nred"},
                {"role": "user", "content": "shape ?"}, {"role": "assistant", "content": "circle"}]
    text, spans = renderer.render(messages, n_images=0)
    assert "it looks red" not in text  # the template drops earlier reasoning; nothing of it is trained
    assert [text[s:e] for s, e in spans] == ["red<|im_end|>", "<think>\n\n</think>\n\ncircle<|im_end|>"]


def test_what_cannot_be_located_is_refused_naming_the_row(tiny_processor):
    # Qwen3 moves the last turn's reasoning into its think block: the answer's rendering depends on its own text
    renderer = ConversationRenderer(tiny_processor, multimodal_template(tiny_processor, "qwen3"))
    messages = [{"role": "user", "content": "colour ?"},
                {"role": "assistant", "content": "<think>\nit looks red\n</think>\n\nred"}]
    with pytest.raises(TemplateError, match=r"row id 'r7'.*assistant message 1.*generation"):
        renderer.render(messages, n_images=0, name="row id 'r7'")
    # a template that keeps only the last assistant message
    dropping = ("{% for message in messages %}{% if message['role'] != 'assistant' or loop.last %}"
                "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}{% endif %}"
                "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
    with pytest.raises(TemplateError, match="does not write assistant messages as given"):
        ConversationRenderer(tiny_processor, multimodal_chat_template(dropping, tiny_processor.tokenizer))
