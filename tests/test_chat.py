"""``llava-normaligned chat``: the real command serving on a local port, driven with ``gradio_client`` as docs/chat.md
shows. Its ``/answer`` endpoint must give the greedy answer ``generation.generate_batch`` gives for the same image and
question, stream it, and report the vision/text norm ratio at the LLM input as computed here directly (the image
features' mean L2 norm over ``part_metrics.text_embedding_norm``); for our model against a stock LLaVA side by side
(``--compare``) and for an aligned folder of another family (Idefics3, ``align``'s output). Bad input is a message
and the server answers the next request; a model that cannot be loaded is one line and exit code 2, before serving.
Ctrl-C, the page's documented way to stop the server, stops it calmly: exit code 0, no error.
"""

from __future__ import annotations

import math
import shutil
import signal
import socket
import subprocess

import pytest

from tests.support.chat_server import (
    MAX_NEW_TOKENS,
    QUESTION,
    ChatServer,
    chat_environment,
    direct,
    free_port,
    not_an_image,
    solid_image,
)
from tests.support.messages import number
from tests.support.processes import CONSOLE, send_or_skip, wait_after_signal

pytest.importorskip("gradio")
from gradio_client import Client, handle_file

pytestmark = pytest.mark.usefixtures("one_thread")

PER_MODEL = 4  # answer, norm line, figure, readings


def per_model(outputs) -> list[dict]:
    """The endpoint's outputs after the message, one dict per model."""
    outputs = list(outputs)
    assert (len(outputs) - 1) % PER_MODEL == 0, outputs
    return [dict(zip(("answer", "norms", "plot", "readings"), outputs[i : i + PER_MODEL]))
            for i in range(1, len(outputs), PER_MODEL)]


def check_model_outputs(entry: dict, expected: dict, name: str) -> None:
    readings = entry["readings"]
    assert entry["answer"] == expected["answer"]
    assert readings["model_id"] == name
    assert math.isclose(readings["vision_text_norm_ratio"], expected["ratio"], rel_tol=1e-5), \
        (readings["vision_text_norm_ratio"], expected["ratio"])
    shown = number(r"norm ratio at the LLM input: \*\*([\d.e+-]+)\*\*", entry["norms"])  # in bold
    assert shown == pytest.approx(readings["vision_text_norm_ratio"], rel=5e-3)  # to 3 significant digits
    layers = readings["layers"]
    assert layers["index"] == list(range(expected["num_layers"] + 1))
    for modality in ("vision", "text"):
        assert len(layers[modality]["norm"]) == len(layers["index"]) and all(v > 0 for v in layers[modality]["norm"])
        cosines = layers[modality]["cos_to_prev"]
        assert cosines[0] is None and all(-1 <= c <= 1 for c in cosines[1:])
    assert math.isclose(layers["vision"]["norm"][0], readings["image_token_norm"], rel_tol=1e-5)
    with open(entry["plot"], "rb") as handle:
        assert handle.read(8) == b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------------------------------------------------------ servers


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    folder = tmp_path_factory.mktemp("chat_images")
    return {"red": solid_image(folder / "red.png"), "text": not_an_image(folder / "notes.png")}


@pytest.fixture(scope="module")
def compare_server(tiny_model_dir, stock_model_dir):
    server = ChatServer([tiny_model_dir, "--compare", stock_model_dir, "--max-new-tokens", str(MAX_NEW_TOKENS)])
    yield server
    server.stop()


@pytest.fixture(scope="module")
def aligned_idefics3(tmp_path_factory):
    """``align``'s output for a tiny stock Idefics3 (another family: the norm at its connector)."""
    from llava_normaligned.align import align, save_aligned
    from llava_normaligned.tiny import save_tiny_vlm

    root = tmp_path_factory.mktemp("chat_idefics3")
    stock = save_tiny_vlm("idefics3", str(root / "stock"))
    save_aligned(align(stock), str(root / "aligned"), stock)
    return str(root / "aligned")


# ------------------------------------------------------------------------------------------------------- tests


def test_compare_mode_answers_and_measures_both_models_as_computed_directly(compare_server, images, tiny_model_dir,
                                                                              stock_model_dir):
    client = Client(compare_server.url, verbose=False)
    assert "/answer" in client.view_api(print_info=False, return_format="dict")["named_endpoints"]
    outputs = client.predict(handle_file(images["red"]), QUESTION, api_name="/answer")
    assert outputs[0] == ""  # no message
    aligned, stock = per_model(outputs)
    check_model_outputs(aligned, direct(tiny_model_dir, images["red"]), tiny_model_dir)
    check_model_outputs(stock, direct(stock_model_dir, images["red"]), stock_model_dir)
    # the aligned model's image tokens enter at the text norm; the stock one's do not
    assert abs(aligned["readings"]["vision_text_norm_ratio"] - 1) < 0.05
    assert abs(stock["readings"]["vision_text_norm_ratio"] - aligned["readings"]["vision_text_norm_ratio"]) > 0.05


def test_the_answer_streams(compare_server, images):
    client = Client(compare_server.url, verbose=False)
    job = client.submit(handle_file(images["red"]), QUESTION, api_name="/answer")
    final = per_model(job.result())[0]["answer"]
    seen = [per_model(outputs)[0]["answer"] for outputs in job.outputs()]
    partial = list(dict.fromkeys(a for a in seen if a and a != final))  # the answer so far, in order, once each
    assert final and partial, seen
    assert all(final.startswith(text) for text in partial), (partial, final)


@pytest.mark.parametrize("case", ["not an image", "no image", "empty question", "image token in the question"])
def test_bad_input_is_a_message_and_the_server_answers_the_next_request(compare_server, images, tiny_model_dir,
                                                                         case):
    client = Client(compare_server.url, verbose=False)
    image, question = handle_file(images["red"]), QUESTION
    if case == "not an image":
        image = handle_file(images["text"])
    elif case == "no image":
        image = None
    elif case == "empty question":
        question = "   "
    else:  # an error while answering: the processor refuses a second image token
        question = "what is <image> ?"
    outputs = client.predict(image, question, api_name="/answer")
    expected = {
        "not an image": "Error: notes.png is not an image this page can read",
        "no image": "Error: Upload an image first.",
        "empty question": "Error: Type a question about the image.",
        "image token in the question": f"Error: {tiny_model_dir} could not answer: ",
    }[case]
    assert outputs[0].startswith(expected), outputs[0]
    assert not any(entry["answer"] for entry in per_model(outputs))
    assert compare_server.running(), compare_server.output()[-3000:]
    outputs = client.predict(handle_file(images["red"]), QUESTION, api_name="/answer")
    assert outputs[0] == "" and per_model(outputs)[0]["answer"] == direct(tiny_model_dir, images["red"])["answer"]


def test_an_aligned_model_of_another_family(aligned_idefics3, images):
    server = ChatServer([aligned_idefics3, "--max-new-tokens", str(MAX_NEW_TOKENS)])
    try:
        outputs = Client(server.url, verbose=False).predict(handle_file(images["red"]), QUESTION, api_name="/answer")
    finally:
        server.stop()
    assert outputs[0] == ""
    [entry] = per_model(outputs)
    expected = direct(aligned_idefics3, images["red"])
    check_model_outputs(entry, expected, aligned_idefics3)
    assert abs(expected["ratio"] - 1) < 1e-3  # the aligned norm at the connector: the text norm


def _refused(args: list[str]) -> list[str]:
    done = subprocess.run([CONSOLE, "chat", *args], check=False, capture_output=True, text=True, timeout=300,
                          env=chat_environment(), stdin=subprocess.DEVNULL)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and done.stdout == "" and len(lines) == 1, (done.returncode, done.stdout, lines)
    assert lines[0].startswith("llava-normaligned chat: error: "), lines
    return lines


def test_a_model_that_fails_to_load_is_one_line_and_exit_code_2(tiny_model_dir, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_model_dir, broken)
    (broken / "model.safetensors").write_bytes(b"\x00" * 64)  # not a safetensors file
    port = str(free_port())
    [line] = _refused([str(broken), "--port", port])
    assert f"cannot load {broken}: " in line
    [line] = _refused([tiny_model_dir, "--compare", str(tmp_path / "absent"), "--port", port])
    assert "--compare" in line and "absent" in line
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        [line] = _refused([tiny_model_dir, "--port", str(taken.getsockname()[1])])
    assert "--port" in line and "give another --port" in line


def test_ctrl_c_stops_the_server_calmly_with_exit_code_0(tiny_model_dir):
    """The page says "Ctrl-C stops": doing so is how the server is meant to end, not an error. The command ends with
    ``llava-normaligned chat: stopped`` and exit code 0; no error line, no traceback, not gradio's own closing line.
    (``train`` and ``demo`` report Ctrl-C as an interruption, exit code 130: there it cuts work short.)"""
    server = ChatServer([tiny_model_dir])
    try:
        send_or_skip(server.proc, signal.SIGINT)
        code = wait_after_signal(server.proc, signal.SIGINT, 60, server.output)
    finally:
        server.stop()  # a server that did not exit: terminated; the output read to its end
    lines = [line for line in server.lines if line.strip()]
    assert code == 0, (code, lines)
    assert lines[-1] == "llava-normaligned chat: stopped", lines
    assert not [line for line in lines if "error" in line.lower() or "Traceback" in line or "Closing" in line], lines
