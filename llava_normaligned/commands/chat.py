"""The ``chat`` command: serve the chat page on this machine.

    llava-normaligned chat ./llava-na-3b [--compare ./llava-stock] [--port 7860]

Loading is ``llava_normaligned.loading``'s (the options of ``shared.flags``' loading group, read into a
``LoadOptions`` per model); the page is ``chat.page``'s. Every argument is checked and every model loaded before the
page is served: a model that cannot be loaded, or a port that is taken, is one line and exit code 2. Gradio is
imported only then. Ctrl-C, as the served page says, stops the server: ``llava-normaligned chat: stopped``, exit
code 0 (``serve``).
"""

from __future__ import annotations

import signal
import socket
import sys
import time
from dataclasses import dataclass

from llava_normaligned.checks import POSITIVE_COUNT, BadInput, NumberRule, check_numbers
from llava_normaligned.loading import LoadOptions, SourceNotFound, check_source

from .shared import TERMINATED, CommandParser, arguments_accepted, fail, option
from .shared.flags import LoadingOptions, dtype_option

DEFAULT_PORT = 7860
DTYPE_ON_CPU = "float32"
NUMBERS = {"port": NumberRule(low=1, high=65535), "max_new_tokens": POSITIVE_COUNT}


@dataclass(frozen=True, kw_only=True)
class ChatConfig(LoadingOptions):
    """``chat``'s options: the model (and one to compare), where to serve, decoding, how to load the models."""

    model: str = option(help="folder or Hub repo id of a norm-aligned, stock or aligned VLM")
    compare: str | None = option("--compare", metavar="MODEL2", default=None,
                                 help="a second model answered and measured beside MODEL (e.g. stock against aligned)")
    host: str = option("--host", default="127.0.0.1",
                       help="address to serve on (default 127.0.0.1: this machine only; no share links)")
    port: int = option("--port", type=int, default=DEFAULT_PORT, help=f"port to serve on (default {DEFAULT_PORT})")
    max_new_tokens: int = option("--max-new-tokens", type=int, default=256,
                                 help="tokens generated at most per answer (default 256)")
    # this command's own --dtype default: float32 on the CPU
    dtype: str | None = dtype_option(None, f"{DTYPE_ON_CPU} on the CPU, as stored on an accelerator")


def make_parser() -> CommandParser:
    return CommandParser(
        config_class=ChatConfig,
        prog="llava-normaligned chat",
        description="Serve a local web page (Gradio) that answers questions about an uploaded image, streamed token "
        "by token, and shows the image's vision/text norm ratio at the LLM input and its per-layer norms and "
        "cosines; --compare shows a second model beside it. The answer is also an API endpoint, /answer "
        "(gradio_client). See docs/chat.md.",
    )

def _check_port(host: str, port: int) -> None:
    """The address can be served on: a port another program holds fails here, before any model loads."""
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server will: a closed one's port
            probe.bind((host, port))
    except OSError as error:
        raise BadInput(f"--host {host} --port {port}: cannot serve there ({error.strerror or error}); "
                       "give another --port") from None


def _check_gradio() -> None:
    try:
        import gradio  # noqa: F401
    except ImportError:
        raise BadInput("the chat page needs gradio: pip install 'llava-normaligned[chat]'") from None


def _options(args) -> list[LoadOptions]:
    """One ``LoadOptions`` per model; ``--dtype`` unset is float32 on the CPU and as stored elsewhere."""
    from llava_normaligned.loading import resolve_device

    dtype = args.dtype
    if dtype is None:
        try:
            on_cpu = resolve_device(args.device).type == "cpu"
        except (ValueError, RuntimeError) as error:
            raise BadInput(f"--device: {error}") from None
        dtype = DTYPE_ON_CPU if on_cpu else "auto"
    options = [LoadOptions.from_args(args, dtype=dtype)]
    if args.compare:
        options.append(LoadOptions.from_args(args, source=args.compare, revision=None, dtype=dtype))
    return options


def load_chat_model(options: LoadOptions):
    """``page.ChatModel`` of one model: loaded, and its probe points found (a model whose parts this package cannot
    find is refused here, not at the first question)."""
    from llava_normaligned.chat.page import ChatModel
    from llava_normaligned.families.probe_points import locate

    model, processor = options.load()
    return ChatModel(options.source, processor, locate(model, options.source))


def _stop(number, frame):
    raise SystemExit(TERMINATED)


STOPPED = "llava-normaligned chat: stopped"  # the line a server stopped with Ctrl-C ends with


def serve(models, args) -> None:
    """Serve the page until Ctrl-C (or the process is stopped). Ctrl-C is how the page says to stop the server: it
    ends with ``STOPPED`` and exit code 0, not as an interruption (that is Ctrl-C before the page is served, while
    the models load: exit code 130, as every command). SIGTERM: exit code 143, the figures' folder removed."""
    import tempfile

    from llava_normaligned.chat.page import build_page

    signal.signal(signal.SIGTERM, _stop)  # a stopped server still removes its figures' folder
    stopped = False
    with tempfile.TemporaryDirectory(prefix="llava-na-chat-") as folder:  # the figures
        page, theme, css = build_page(models, args.max_new_tokens, folder)
        page.queue(default_concurrency_limit=1)  # one answer at a time: the models are shared
        page.launch(server_name=args.host, server_port=args.port, share=False, prevent_thread_lock=True, quiet=True,
                    ssr_mode=False, mcp_server=False, theme=theme, css=css, allowed_paths=[folder])
        try:
            host = f"[{args.host}]" if ":" in args.host else args.host
            print(f"llava-normaligned chat: serving http://{host}:{args.port} (Ctrl-C stops)", file=sys.stderr,
                  flush=True)
            while page.is_running:
                time.sleep(0.2)
        except KeyboardInterrupt:  # Ctrl-C: the documented way to stop serving
            stopped = True
        finally:
            page.close(verbose=False)  # gradio's own "Closing server running on port" line: ours says it
    if stopped:
        print(STOPPED, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_config(argv)
    try:
        check_numbers(args, NUMBERS)
        check_source(args.model, revision=args.revision)  # first: a mistyped model fails before anything loads
        if args.compare:
            check_source(args.compare, "--compare")
        options = _options(args)
        _check_port(args.host, args.port)
        _check_gradio()
    except (SourceNotFound, BadInput) as error:
        return fail("chat", error)
    arguments_accepted()
    models = []
    for load in options:
        try:
            models.append(load_chat_model(load))
        except Exception as error:  # noqa: BLE001 - whatever stops a model from loading: one line, nothing served
            return fail("chat", f"cannot load {load.source}: {error}")
    serve(models, args)
    return 0
