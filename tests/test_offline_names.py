"""A model name that is no local folder, on a machine that cannot reach the Hub: one line naming it, exit 2, at once.

The Hub client retries an unreachable Hub for about 25 s per lookup before it gives up, so a mistyped relative folder
(``runs/ckpt``, which reads as a Hub id) used to take 25-55 s to be refused. ``loading.check_source`` now asks once
whether the Hub endpoint can be reached at all (``hub_unreachable``: DNS and a TCP connect) and refuses such a name
right away when it cannot. The commands run in a subprocess with ``HF_ENDPOINT`` on a local port nothing listens on,
so they are offline whatever this machine's network is; with an endpoint that answers, the lookup goes ahead as
before (``test_a_reachable_hub_is_still_asked``).
"""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from tests.support.processes import CONSOLE

MISSING = "runs/ckpt"  # a relative folder that is not there: shaped like a Hub id


def closed_endpoint() -> str:
    """An endpoint on this machine that refuses every connection: a port bound, read, then released."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def hub_env(tmp_path, endpoint: str) -> dict:
    """The user's environment (no HF_HUB_OFFLINE, no proxy) with the Hub at ``endpoint`` and an empty Hub cache."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HF_", "HUGGING_FACE")) and k.lower() not in ("http_proxy", "https_proxy", "all_proxy")}
    env.update(HF_ENDPOINT=endpoint, HF_HOME=str(tmp_path / "hf_home"), HF_HUB_DISABLE_TELEMETRY="1",
               OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    return env


COMMANDS = {
    "generate": ["generate", MISSING, "--image", "x.png", "--prompt", "hi"],
    "compose": ["compose", "--vision-model", MISSING, "--text-model", MISSING, "--output-dir", "out"],
    "eval": ["eval", MISSING, "--tasks", "pope", "--output-dir", "out"],  # pope's data would come from the Hub
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_missing_name_offline_is_one_line_exit_2_at_once(command, tmp_path):
    from PIL import Image

    Image.new("RGB", (8, 8)).save(tmp_path / "x.png")
    endpoint = closed_endpoint()
    start = time.perf_counter()
    result = subprocess.run([CONSOLE, *COMMANDS[command]], cwd=str(tmp_path), env=hub_env(tmp_path, endpoint),
                            capture_output=True, text=True, timeout=300, check=False, stdin=subprocess.DEVNULL)
    seconds = time.perf_counter() - start
    err = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, result.stderr[-3000:]
    assert len(err) == 1, err
    line = err[0]
    assert f"'{MISSING}'" in line  # the input, as given
    assert os.path.join(str(tmp_path), MISSING) in line  # where it was looked for as a folder
    assert endpoint in line and "reach" in line  # the Hub it could not ask
    assert f"./{MISSING}" in line  # the way to say "a local path"
    assert seconds < 20, (command, seconds)  # the Hub client's retries alone take about 25 s


# Answers 'no such repo' to everything and records what was asked: a Hub that is there but holds none.
class NotFound(http.server.BaseHTTPRequestHandler):
    asked: list[str] = []

    def _answer(self):
        NotFound.asked.append(self.path)
        self.send_response(404)
        self.send_header("X-Error-Code", "RepoNotFound")  # what the Hub says of a repo it does not hold
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_HEAD = do_POST = _answer

    def log_message(self, *args):  # quiet
        pass


@pytest.fixture
def answering_hub():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    NotFound.asked.clear()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


REACHABLE_CHECK = """
from llava_normaligned.loading import SourceNotFound, hub_unreachable, load_config
print("unreachable:", hub_unreachable())
try:
    load_config("runs/ckpt")
except SourceNotFound as error:
    print("error:", error)
"""


def test_a_reachable_hub_is_still_asked(answering_hub, tmp_path):
    """Where the endpoint answers, the check lets the lookup happen: the Hub is asked for the name, and its answer
    is the one reported."""
    result = subprocess.run([sys.executable, "-c", REACHABLE_CHECK], cwd=str(tmp_path),
                            env=hub_env(tmp_path, answering_hub), capture_output=True, text=True, timeout=300,
                            check=False, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = dict(line.split(": ", 1) for line in result.stdout.splitlines() if ": " in line)
    assert lines["unreachable"] == "None"
    assert any(MISSING in path for path in NotFound.asked), NotFound.asked  # the Hub was asked for it
    assert MISSING in lines["error"] and "could not be loaded as a Hub repo" in lines["error"]
    assert "cannot be reached" not in lines["error"]


def test_a_reachable_endpoint_is_asked_once_an_unreachable_one_again_and_a_proxy_counts(answering_hub, monkeypatch):
    import huggingface_hub.constants

    from llava_normaligned import loading

    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    monkeypatch.setattr(loading, "_HUB_REACHED", set())
    connects = []
    create_connection = socket.create_connection
    monkeypatch.setattr(socket, "create_connection",
                        lambda address, *args, **kwargs: connects.append(tuple(address)) or create_connection(
                            address, *args, **kwargs))
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", answering_hub)
    assert loading.hub_unreachable() is None and loading.hub_unreachable() is None
    assert len(connects) == 1  # remembered
    closed = closed_endpoint()
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", closed)
    assert loading.hub_unreachable() is not None
    # the Hub client would go through the proxy: whether the proxy answers is what counts
    monkeypatch.setenv("HTTP_PROXY", answering_hub)
    assert loading.hub_unreachable() is None
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", answering_hub)
    monkeypatch.setenv("HTTP_PROXY", closed)
    assert loading.hub_unreachable() is not None
    # the reachable place asked once, whether as the endpoint or as its proxy; the unreachable one each time (a
    # network that comes back is seen)
    assert connects == [("127.0.0.1", int(url.rsplit(":", 1)[1])) for url in (answering_hub, closed, closed)]
