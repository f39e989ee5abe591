"""The fast rendering path (trainer/masking.py) gives jinja's text and spans exactly, and knows when it cannot."""

import random

import pytest

from llava_normaligned.trainer.masking import ConversationRenderer, FastRenderMismatch, content_literals
from llava_normaligned.trainer.preprocess import prepare_dataset
from tests.support.templates import TEMPLATES, multimodal_template

PIECES = ["red", "a dog", "  leading", "trailing  ", "\nnew line first", "last line\n", "\n\n both \n", "tab\there",
          "quote ' and \"", "{{ not jinja }}", "{% if x %}", "back\\slash", "caf\u00e9 \u4e2d", "</think>", "<think>",
          "- item\n- item", "<tool_response>x</tool_response>", "100%", "#", "ok"]


def _conversation(rng: random.Random) -> tuple[list[dict], int]:
    def text():
        return " ".join(rng.choice(PIECES) for _ in range(rng.randint(1, 3)))

    messages = [{"role": "system", "content": text()}] if rng.random() < 0.3 else []
    for _ in range(rng.randint(1, 3)):
        messages += [{"role": "user", "content": text()}, {"role": "assistant", "content": text()}]
    return messages, rng.choice((0, 1, 1, 2))


def _both(fast: ConversationRenderer, exact: ConversationRenderer, messages, n_images):
    try:
        expected = exact.render(messages, n_images)
    except Exception as err:  # a row jinja's path refuses must be refused the same way
        with pytest.raises(type(err)):
            fast.render(messages, n_images)
        return None
    assert fast.render(messages, n_images) == expected
    return expected


@pytest.mark.parametrize("name", list(TEMPLATES))
def test_fast_path_equals_jinja_row_for_row(tiny_processor, name):
    template = multimodal_template(tiny_processor, name)
    fast = ConversationRenderer(tiny_processor, template)
    exact = ConversationRenderer(tiny_processor, template, fast=False)
    assert fast.fast and not exact.fast
    rng = random.Random(name)
    compared = plain = 0
    for _ in range(400):
        messages, n_images = _conversation(rng)
        if _both(fast, exact, messages, n_images) is not None:
            compared += 1
            plain += not any(literal in m["content"] for m in messages for literal in fast._literals)
    assert compared > 300 and exact.rows_fast == 0
    # every row of a fitted shape took the fast path unless it holds a string the template tests content against
    assert fast.rows_fast == plain > 20, (fast.rows_fast, plain, fast._literals)
    if name == "qwen3":
        assert {"</think>", "<tool_response>"} <= set(fast._literals)


def test_content_rules_are_read_from_the_template(tiny_processor):
    stripping = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] | trim + '<|im_end|>\n' }}"
                 "{% endfor %}")
    renderer = ConversationRenderer(tiny_processor, _wrap(tiny_processor, stripping))
    messages = [{"role": "user", "content": "  hi \n"}, {"role": "assistant", "content": "\n yes  "}]
    text, spans = renderer.render(messages, 0)
    assert renderer.rows_fast == 1 and text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyes<|im_end|>\n"
    assert [text[s:e] for s, e in spans] == ["yes<|im_end|>"]


@pytest.mark.parametrize("template, fast_rows", [
    # the content is changed in a way no rule describes: every row of the shape goes through jinja
    ("{% for m in messages %}{{ m['role'] + ': ' + m['content'] | e + '\n' }}{% endfor %}", 0),
    # the rendering branches on a literal: rows holding it go through jinja, the others are fast
    ("{% for m in messages %}{% if 'secret' in m['content'] %}{{ m['role'] + ': [hidden]\n' }}{% else %}"
     "{{ m['role'] + ': ' + m['content'] + '\n' }}{% endif %}{% endfor %}", 1),
])
def test_what_the_probes_and_literals_send_to_jinja(tiny_processor, template, fast_rows):
    fast = ConversationRenderer(tiny_processor, _wrap(tiny_processor, template))
    exact = ConversationRenderer(tiny_processor, _wrap(tiny_processor, template), fast=False)
    for content in ("plain & answer", "a secret answer"):
        messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": content}]
        text, _ = fast.render(messages, 0)
        assert (text, _) == exact.render(messages, 0)
    assert fast.rows_fast == fast_rows and fast.rows_fast + fast.rows_jinja == 2


def test_literals_are_the_tested_strings_only():
    template = ("{% if messages[0]['role'] == 'system' %}{{ 'SYS' }}{% endif %}{% for m in messages %}"
                "{% if m.content.startswith('<tool>') or '</think>' in m.content %}{{ m.content.split('</think>')[-1] }}"
                "{% else %}{{ '<|im_start|>' + m.role + m.content | replace('\\t', '    ') }}{% endif %}{% endfor %}")
    assert content_literals(template) == ("\t", "    ", "</think>", "<tool>")
    assert content_literals("{% if %}") is None  # does not parse: no fast path


def test_a_difference_the_checks_miss_is_caught_and_every_row_re_rendered(tiny_processor, tmp_path):
    # a branch on the content's length: neither a rule nor a literal shows it; the compared rows do
    template = _wrap(tiny_processor, "{% for m in messages %}{{ m['role'] + ': ' + m['content'] }}"
                     "{% if m['content'] | length > 200 %}{{ ' [long]' }}{% endif %}{{ '\n' }}{% endfor %}")
    renderer = ConversationRenderer(tiny_processor, template)
    long_row = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "word " * 60}]
    with pytest.raises(FastRenderMismatch, match="row"):
        renderer.render(long_row, 0)  # a shape's first row is always compared

    import json

    from PIL import Image

    from llava_normaligned.trainer.data import load_llava_json

    (tmp_path / "images").mkdir()
    rows = []
    for i in range(6):
        Image.new("RGB", (32, 32), (40 * i, 0, 0)).save(tmp_path / "images" / f"{i}.png")
        rows.append({"id": f"r{i}", "image": f"{i}.png", "conversations": [
            {"from": "human", "value": "<image>\nwhat is it ?"}, {"from": "gpt", "value": "word " * (60 - i)}]})
    (tmp_path / "data.json").write_text(json.dumps(rows))
    dataset = load_llava_json(str(tmp_path / "data.json"), str(tmp_path / "images"))
    prepared, report = prepare_dataset(dataset, tiny_processor, max_length=None, chat_template=template)
    assert report.rendering == "jinja" and report.rows_rendered_fast == 0
    assert all(" [long]" in row for row in prepared["rendered"])
    fast_prepared, fast_report = prepare_dataset(dataset.select(range(2)), tiny_processor, max_length=None,
                                                 chat_template=multimodal_template(tiny_processor, "llama3.2"))
    assert fast_report.rendering == "fast" and fast_report.rows_rendered_fast == 2


def _wrap(processor, template):
    from llava_normaligned.compose import multimodal_chat_template

    return multimodal_chat_template(template, processor.tokenizer)


def test_one_date_for_a_whole_preparation(tiny_processor):
    import datetime

    renderer = ConversationRenderer(tiny_processor, multimodal_template(tiny_processor, "llama3.2"))
    today = datetime.datetime.now().strftime("%d %b %Y")
    assert renderer.template_kwargs["date_string"] == today  # fixed once: a run over midnight keeps one date
    text, _ = renderer.render([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yes"}], 0)
    assert f"Today Date: {today}" in text
    assert "date_string" not in ConversationRenderer(tiny_processor, multimodal_template(tiny_processor, "qwen2.5")
                                                     ).template_kwargs


@pytest.mark.parametrize("name", list(TEMPLATES))
def test_an_answer_holding_the_text_after_it_is_located_as_jinja_locates_it(tiny_processor, name):
    """Spans of a fast-rendered row come from where its contents lie, except where the placeholder rendering's
    search for the text after an answer would stop inside the answer: then both paths give that search's spans."""
    template = multimodal_template(tiny_processor, name)
    fast = ConversationRenderer(tiny_processor, template)
    exact = ConversationRenderer(tiny_processor, template, fast=False)
    plain = [{"role": "user", "content": "q one"}, {"role": "assistant", "content": "a one"},
             {"role": "user", "content": "q two"}, {"role": "assistant", "content": "a two"}]
    text, _ = exact.render(plain, 1)
    between = text[text.index("a one") + len("a one"):text.index("a two")]  # the template's text and the question
    laid_out = 0
    for answer in (f"see {between} here", f"{between}", f"x{between[: len(between) // 2]}"):
        messages = [dict(plain[0]), {"role": "assistant", "content": answer}, *plain[2:]]
        if _both(fast, exact, messages, 1) is not None:
            laid_out += not any(literal in answer for literal in fast._literals)
    assert fast.rows_fast == laid_out  # the rows with no literal the template tests took the fast path
    if name != "qwen3":  # Qwen3 tests content against its own tags, which the text between holds
        assert laid_out >= 2
