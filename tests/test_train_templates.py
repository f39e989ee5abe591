"""Answer-only labels with the official chat templates of the LLMs the paper and users pair with LLaVA: Llama 3.2
Instruct, Qwen2.5 Instruct, Qwen3 and SmolLM2 Instruct, vendored below as shipped (no ``{% generation %}`` markers,
so answers are located by placeholder rendering, ``masking.py``). Multi-turn rows with a system message and an
image, through the real processor, the up-front preparation and the collator; what cannot be masked is refused."""

from __future__ import annotations

import os

import pytest
from llava_normaligned.trainer.collator import IGNORE_INDEX, LlavaTrainingCollator
from llava_normaligned.trainer.data import load_llava_json
from llava_normaligned.trainer.masking import ConversationRenderer, TemplateError, template_messages
from llava_normaligned.trainer.preprocess import prepare_dataset
from test_train_support import write_llava_dataset

from llava_normaligned.compose import multimodal_chat_template

# ----------------------------------------------------------------------------------------- the official templates
# Byte for byte as their tokenizers ship them (TRL keeps identical copies for its template identification; the
# first test compares). Llama 3.2 and Qwen2.5 end with a newline, Qwen3 and SmolLM2 do not.

# meta-llama/Llama-3.2-1B-Instruct (and 3B): tokenizer_config.json "chat_template"
LLAMA_3_2 = r"""{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message #}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\n\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"""

# Qwen/Qwen2.5-7B-Instruct (every Qwen2.5 Instruct size)
QWEN_2_5 = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

# Qwen/Qwen3-8B (every Qwen3 hybrid-thinking size)
QWEN_3 = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"""

# HuggingFaceTB/SmolLM2-135M-Instruct (and 360M, 1.7B)
SMOLLM2 = r"""{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system
You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>
' }}{% endif %}{{'<|im_start|>' + message['role'] + '
' + message['content'] + '<|im_end|>' + '
'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant
' }}{% endif %}"""

TEMPLATES = {"llama3.2": LLAMA_3_2, "qwen2.5": QWEN_2_5, "qwen3": QWEN_3, "smollm2": SMOLLM2}
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


def _multimodal(processor, name):
    return multimodal_chat_template(TEMPLATES[name], processor.tokenizer)


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
    renderer = ConversationRenderer(tiny_processor, _multimodal(tiny_processor, name))
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
                                       chat_template=_multimodal(tiny_processor, name))
    assert report.masking == "placeholder-rendering" and report.rows_out == 5
    batch = LlavaTrainingCollator(tiny_processor)([prepared[i] for i in (0, 1, 4)])  # two-turn, one-turn, text-only
    tok = tiny_processor.tokenizer
    trained = [tok.decode(batch["input_ids"][b][batch["labels"][b] != IGNORE_INDEX]) for b in range(3)]
    last = EXPECTED[name][1].replace("no", "{}")
    assert trained == ["".join(EXPECTED[name]), last.format("green"), last.format("one")]
    assert not (batch["labels"] == tiny_processor.image_token_id).any()


def test_qwen3_reasoning_in_an_earlier_turn_is_dropped_as_the_template_does(tiny_processor):
    renderer = ConversationRenderer(tiny_processor, _multimodal(tiny_processor, "qwen3"))
    messages = [{"role": "user", "content": "colour ?"},
                {"role": "assistant", "content": "<think>\nit looks red\n</think>\n\nred"},
                {"role": "user", "content": "shape ?"}, {"role": "assistant", "content": "circle"}]
    text, spans = renderer.render(messages, n_images=0)
    assert "it looks red" not in text  # the template drops earlier reasoning; nothing of it is trained
    assert [text[s:e] for s, e in spans] == ["red<|im_end|>", "<think>\n\n</think>\n\ncircle<|im_end|>"]


def test_what_cannot_be_located_is_refused_naming_the_row(tiny_processor):
    # Qwen3 moves the last turn's reasoning into its think block: the answer's rendering depends on its own text
    renderer = ConversationRenderer(tiny_processor, _multimodal(tiny_processor, "qwen3"))
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
