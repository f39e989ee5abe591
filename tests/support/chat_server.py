"""``llava-normaligned chat`` as the tests start it: the real command in a child process on a free local port, offline,
waited for until it serves, stopped at the end. Shared by tests/test_chat.py (driven with ``gradio_client``) and
tests/test_chat_browser.py (driven with a real browser)."""

from __future__ import annotations

import functools
import os
import socket
import subprocess
import threading
import time

import pytest

from tests.support.processes import spawn_console

SERVING = "llava-normaligned chat: serving "
QUESTION = "what colour is the shape ?"
MAX_NEW_TOKENS = 12  # what the tests serve with: --max-new-tokens


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def chat_environment() -> dict:
    """Offline (the Hub switched off), one thread per process (the tests compare answers with ones computed here)."""
    return {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


class ChatServer:
    """``llava-normaligned chat ARGS --port <free>`` running until ``stop``; ``seconds_to_serve``: from the start of the
    process to its "serving" line."""

    def __init__(self, args: list[str], timeout: float = 240):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.lines: list[str] = []
        start = time.perf_counter()
        self.proc = spawn_console(["chat", *args, "--port", str(self.port)], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, env=chat_environment())
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        while not any(line.startswith(SERVING) for line in self.lines):
            if self.proc.poll() is not None or time.perf_counter() - start > timeout:
                self.stop()
                pytest.fail(f"`llava-normaligned chat` did not serve (exit code {self.proc.returncode}):\n"
                            + self.output()[-4000:], pytrace=False)
            time.sleep(0.1)
        self.seconds_to_serve = time.perf_counter() - start

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def output(self) -> str:
        return "\n".join(self.lines)

    def running(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(timeout=5)


def solid_image(path, colour=(220, 30, 30), size=(32, 32)) -> str:
    from PIL import Image

    Image.new("RGB", size, colour).save(path)
    return str(path)


def not_an_image(path) -> str:
    """A file named like an image that holds text."""
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("this is text, not an image\n")
    return str(path)


@functools.cache
def direct(model_dir: str, image: str, question: str = QUESTION) -> dict:
    """What the page must show for ``model_dir``, computed here without it: the greedy answer
    (``generation.generate_batch``), the vision/text norm ratio at the LLM input (the image features' mean L2 norm
    over ``part_metrics.text_embedding_norm``) and the number of decoder layers."""
    import torch

    from llava_normaligned.generation import generate_batch, prepare_inputs
    from llava_normaligned.loading import load_model
    from llava_normaligned.part_metrics import text_embedding_norm, vision_text_norm_ratio

    model, processor = load_model(model_dir, dtype="float32")
    answer = generate_batch(model, processor, [question], [image], max_new_tokens=MAX_NEW_TOKENS)[0]
    inputs = prepare_inputs(model, processor, [question], [[image]])
    with torch.no_grad():
        if "pixel_attention_mask" in inputs:  # Idefics3: the connector's output, its aligned norm included
            features = model.model.get_image_features(pixel_values=inputs["pixel_values"],
                                                      pixel_attention_mask=inputs["pixel_attention_mask"])
            features = getattr(features, "pooler_output", features)
            tokens = torch.cat([f.reshape(-1, f.shape[-1]) for f in features])
            ratio = float(tokens.norm(dim=-1).mean()) / text_embedding_norm(model)
        else:  # LLaVA: the projector's output
            ratio = vision_text_norm_ratio(model, inputs["pixel_values"])["vision_text_ratio"]
    num_layers = len(model.get_decoder().layers)
    return {"answer": answer, "ratio": ratio, "num_layers": num_layers}
