"""The chat page: an image, a question, the answer streamed token by token, and beside it the image's norms.

``ChatModel`` is one loaded model with its probe points; ``Answering`` answers a question about an image with each
model in turn (the norms first: one forward pass each; then the answers, streamed); ``build_page`` lays them out as
a Gradio page whose answer event is the API endpoint ``/answer``. Gradio is imported when the page is built.

Bad input (no image, a file that is no image, an empty question) and an error while answering are a message in the
page (the endpoint's first output): the event ends, the server keeps serving.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from llava_normaligned.families.probe_points import ProbePoints
from llava_normaligned.generation import check_image_path, open_image, stream_answer

from .readings import figure, image_readings, summary_line

API_NAME = "answer"  # the endpoint: Client(url).predict(handle_file(image), question, api_name="/answer")
OUTPUTS_PER_MODEL = ("answer", "norms", "plot", "readings")  # what /answer returns per model, after the message
NOT_AN_IMAGE = "{name} is not an image this page can read: upload a PNG, JPEG, WebP, BMP or GIF file."
# system fonts: the default theme's web font would be fetched from the internet by the browser that opens the page
FONTS = ["ui-sans-serif", "system-ui", "sans-serif"]
MONO_FONTS = ["ui-monospace", "monospace"]
UPDATE_SECONDS = 0.1  # the page is sent the growing answer at most this often (each update sends every output)
CSS = "#message p { color: #b42318; font-weight: 600; }"


@dataclass
class ChatModel:
    """A loaded model: ``name`` as given on the command line, its processor and its probe points (``.model``)."""

    name: str
    processor: object
    points: ProbePoints

    @property
    def model(self):
        return self.points.model


class ChatError(ValueError):
    """Bad input: shown in the page as a message."""


def check_inputs(image_path: str | None, question: str | None) -> str:
    """The question, stripped; a ``ChatError`` saying what to do for no image, a file that is no image, or no
    question."""
    if not image_path:
        raise ChatError("Upload an image first.")
    try:
        check_image_path(image_path)
    except (FileNotFoundError, ValueError):
        raise ChatError(NOT_AN_IMAGE.format(name=os.path.basename(image_path))) from None
    question = (question or "").strip()
    if not question:
        raise ChatError("Type a question about the image.")
    return question


def stream(chat: ChatModel, image_path: str, question: str, max_new_tokens: int) -> Iterator[str]:
    """The greedy answer as it grows (transformers' ``TextIteratorStreamer``, fed by ``generation.stream_answer`` in
    a thread); the last value is ``stream_answer``'s own answer. An error in the thread is raised here."""
    from transformers import TextIteratorStreamer

    streamer = TextIteratorStreamer(chat.processor.tokenizer, skip_prompt=True, skip_special_tokens=True)
    done: dict = {}

    def generate():
        try:
            done["answer"] = stream_answer(chat.model, chat.processor, question, image_path,
                                           max_new_tokens=max_new_tokens, streamer=streamer)
        except Exception as error:  # noqa: BLE001 - handed to the caller's thread below
            done["error"] = error
            streamer.end()  # generate ends the stream only when it finishes

    thread = threading.Thread(target=generate, name=f"generate {chat.name}", daemon=True)
    thread.start()
    text, shown = "", ""
    for piece in streamer:
        text += piece
        if text.strip() != shown:  # the streamer also hands out empty pieces
            shown = text.strip()
            yield shown
    thread.join()
    if "error" in done:
        raise done["error"]
    yield done["answer"]


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


class Answering:
    """The answer event: ``__call__(image_path, question)`` yields the page's outputs, the message and, for each
    model, ``OUTPUTS_PER_MODEL``: the answer so far, the norm summary line, the figure, the readings (a dict)."""

    def __init__(self, models: list[ChatModel], max_new_tokens: int, folder: str):
        self.models = models
        self.max_new_tokens = max_new_tokens
        self.folder = folder  # where the figures are written

    @staticmethod
    def _outputs(message: str, state: list[dict]) -> tuple:
        values = [message]
        for entry in state:
            values += [entry.get(key) for key in OUTPUTS_PER_MODEL]
        return tuple(values)

    def __call__(self, image_path: str | None, question: str | None):
        state = [{} for _ in self.models]
        try:
            question = check_inputs(image_path, question)
        except ChatError as error:
            yield self._outputs(f"Error: {error}", state)
            return
        chat = self.models[0]
        try:
            for chat, entry in zip(self.models, state):  # the norms first: one forward pass per model
                readings = image_readings(chat.points, chat.processor, image_path, question, chat.name)
                entry.update(norms=summary_line(readings), plot=figure(readings, self.folder), readings=readings)
                yield self._outputs("", state)
            for chat, entry in zip(self.models, state):
                sent = 0.0
                for text in stream(chat, image_path, question, self.max_new_tokens):
                    entry["answer"] = text
                    if time.monotonic() - sent >= UPDATE_SECONDS:
                        yield self._outputs("", state)
                        sent = time.monotonic()
                yield self._outputs("", state)  # the whole answer
        except Exception as error:  # noqa: BLE001 - whatever fails while answering: a message; the server goes on
            yield self._outputs(f"Error: {chat.name} could not answer: {_first_line(error)}", state)


def preview(image_path: str | None):
    """The upload event: (the image to show, a message): a file that is no image is said at once."""
    if not image_path:
        return None, ""
    try:
        return open_image(image_path), ""
    except (FileNotFoundError, ValueError):
        return None, "Error: " + NOT_AN_IMAGE.format(name=os.path.basename(image_path))


def build_page(models: list[ChatModel], max_new_tokens: int, folder: str):
    """The Gradio page (``gr.Blocks``) for one model, or two side by side (``--compare``): the inputs on top, one
    column per model below; the figures are written under ``folder`` (give it to ``launch``'s ``allowed_paths``).
    Returns (page, theme, css): Gradio 6 takes the theme and the style sheet at launch."""
    os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"  # read when gradio is imported: no request leaves the machine
    import gradio as gr

    theme = gr.themes.Default(font=FONTS, font_mono=MONO_FONTS)
    names = " vs ".join(os.path.basename(chat.name.rstrip("/")) or chat.name for chat in models)
    with gr.Blocks(title=f"llava-normaligned chat: {names}", analytics_enabled=False) as page:
        gr.Markdown(
            "## llava-normaligned chat\n"
            "Upload an image and ask about it. The answer is greedy and streamed. Beside it, for this image and "
            "question: the vision/text norm ratio at the LLM input (mean L2 norm of the image tokens there over T, "
            "the mean L2 norm of the non-zero text-embedding rows; 1 when aligned) and, per layer, the mean norm and "
            "cos(h<sub>l</sub>, h<sub>l-1</sub>) of the image tokens and of the question's text tokens (the paper's "
            "Fig. 4 for one image)."
        )
        with gr.Row(equal_height=False):
            with gr.Column(scale=1, min_width=240):
                upload = gr.File(label="image file", file_count="single", type="filepath", elem_id="image-file",
                                 height=120)
                shown = gr.Image(label="image", type="pil", interactive=False, height=200, elem_id="image-preview")
            with gr.Column(scale=2):
                question = gr.Textbox(label="question", placeholder="What is in the picture?", lines=2,
                                      elem_id="question")
                ask = gr.Button("Ask", variant="primary", elem_id="ask")
                message = gr.Markdown("", label="message", elem_id="message")
        outputs = [message]
        with gr.Row(equal_height=False):
            for index, chat in enumerate(models):
                with gr.Column(elem_id=f"model-{index}"):
                    gr.Markdown(f"### {chat.name}")
                    outputs += [
                        gr.Textbox(label="answer", lines=3, interactive=False, elem_id=f"answer-{index}"),
                        gr.Markdown("", label="norms", elem_id=f"norms-{index}"),
                        gr.Image(label="per-layer norms and cosines (paper Fig. 4)", show_label=False,  # titled
                                 type="filepath", format="png", interactive=False, elem_id=f"plot-{index}"),
                    ]
                    with gr.Accordion("numbers", open=False):
                        outputs.append(gr.JSON(label="readings", elem_id=f"readings-{index}"))
        upload.change(preview, inputs=upload, outputs=[shown, message], api_visibility="private")
        answering = Answering(models, max_new_tokens, folder)

        def answer(image_path, question):  # a generator function: Gradio streams what it yields
            yield from answering(image_path, question)

        # one model call at a time, however the question is sent (the button, or Enter in the question box)
        ask.click(answer, inputs=[upload, question], outputs=outputs, api_name=API_NAME, concurrency_limit=1,
                  concurrency_id="model")
        question.submit(answer, inputs=[upload, question], outputs=outputs, api_visibility="private",
                        concurrency_limit=1, concurrency_id="model")
    return page, theme, CSS


__all__ = ["API_NAME", "OUTPUTS_PER_MODEL", "Answering", "ChatError", "ChatModel", "build_page", "check_inputs",
           "preview", "stream"]
