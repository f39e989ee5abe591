"""What a reader of a command's output sees: the library notices nobody asked for are gone, the command's own lines
stay, and a log file (stderr not a terminal) gets plain lines, not progress bars redrawn with carriage returns.

Every check runs the real command in a fresh Python whose stdout and stderr are pipes, as in a log file; the
controls show each notice or bar where it is expected (without the filter, or on a pseudo-terminal), so that a check
finding nothing means the filter worked, not that the notice never came.
"""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
import textwrap

import pytest

DEEPSPEED_NOTICE = "Setting accelerator to CPU"
BNB_NOTICE = "pip install kernels"
RESIZE_NOTICE = "initialized from a multivariate normal"
DEPRECATION = "gradient_checkpointing` is deprecated"


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HF_", "HUGGING_FACE", "TQDM_", "ACCELERATE_"))}
    env.update(HF_HUB_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1", TOKENIZERS_PARALLELISM="false",
               OMP_NUM_THREADS="1", **extra)
    return env


def _cli(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llava_normaligned.cli", *args], capture_output=True, text=True,
                          env=_env(), cwd=cwd, timeout=900, stdin=subprocess.DEVNULL)


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=_env(),
                          timeout=900, stdin=subprocess.DEVNULL)


def _deepspeed_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("deepspeed") is not None


def test_compose_to_a_log_file_prints_its_summary_and_no_library_notice(tiny_parts, tmp_path):
    vision, text = tiny_parts
    done = _cli("compose", "--vision-model", vision, "--text-model", text, "--output-dir", str(tmp_path / "model"))
    assert done.returncode == 0, done.stderr
    out = done.stdout + done.stderr
    assert done.stdout.startswith(f"wrote {tmp_path / 'model'}: projector_norm=layernorm")  # what the user needs
    for notice in (RESIZE_NOTICE, DEEPSPEED_NOTICE, BNB_NOTICE):
        assert notice not in out, notice
    assert "\r" not in out  # transformers' "Loading weights" / "Writing model shards" bars
    # the control: the same compose and save without the command's filters prints transformers' two notices
    # (and DeepSpeed's, where it is installed), each once
    control = _python(f"""
        from llava_normaligned.compose import compose, save
        model, processor = compose({vision!r}, {text!r})
        save(model, processor, {str(tmp_path / 'control')!r})
    """)
    assert control.returncode == 0, control.stderr
    both = control.stdout + control.stderr
    assert both.count(RESIZE_NOTICE) == 2  # the embeddings and lm_head
    assert (DEEPSPEED_NOTICE in both) == _deepspeed_installed()


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    folder = tmp_path_factory.mktemp("notices") / "shapes"
    done = _cli("make-data", "--output-dir", str(folder), "--train-per-template", "16", "--test-per-template", "16")
    assert done.returncode == 0, done.stderr
    assert "\r" not in done.stdout + done.stderr and done.stdout.startswith(f"wrote {folder}")
    return folder


def test_train_to_a_log_file_prints_plain_log_lines_and_no_library_notice(shapes, tiny_model_dir, tmp_path):
    done = _cli("train", "--stage", "1", "--model", tiny_model_dir, "--data-path", str(shapes / "pretrain.json"),
                "--image-folder", str(shapes), "--output-dir", str(tmp_path / "s1"), "--max_steps", "2",
                "--per_device_train_batch_size", "4", "--logging_steps", "1", "--save_strategy", "no")
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout + done.stderr
    assert "\r" not in out  # the Trainer's bar, transformers' loading bars, datasets' map bars
    for notice in (DEEPSPEED_NOTICE, BNB_NOTICE, RESIZE_NOTICE, DEPRECATION):
        assert notice not in out, notice
    assert done.stdout.count("{'loss': ") == 2  # each logged step, one plain line
    assert f"stage 1 done: {tmp_path / 's1'}" in done.stdout
    assert "stage 1: what trains" in done.stderr  # the command's own log lines stay


def test_make_data_draws_its_bar_on_a_terminal_only(tmp_path):
    """stderr a pseudo-terminal: the bar is drawn (carriage returns); a pipe: one plain line on stdout."""
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a new pty is 0 columns wide
    try:
        done = subprocess.run([sys.executable, "-m", "llava_normaligned.cli", "make-data", "--output-dir",
                               str(tmp_path / "tty"), "--train-per-template", "16", "--test-per-template", "16"],
                              stdout=subprocess.PIPE, stderr=terminal, env=_env(), timeout=600,
                              stdin=subprocess.DEVNULL)
        os.close(terminal)
        terminal = None
        drawn = b""
        while True:
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # the terminal's other end is closed: all read
                break
            if not chunk:
                break
            drawn += chunk
    finally:
        if terminal is not None:
            os.close(terminal)
        os.close(controller)
    assert done.returncode == 0
    assert b"\r" in drawn and b"make-data: images" in drawn
    piped = _cli("make-data", "--output-dir", str(tmp_path / "log"), "--train-per-template", "16",
                 "--test-per-template", "16")
    assert piped.returncode == 0 and "\r" not in piped.stdout + piped.stderr and "make-data: images" not in piped.stderr


WORKER = """
    import multiprocessing, sys
    from concurrent.futures import ProcessPoolExecutor
    from llava_normaligned.demo.run import worker_init
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                             initializer=worker_init if sys.argv[-1] == "filtered" else None) as pool:
        pool.submit(exec, "import bitsandbytes{deepspeed}").result()
"""


@pytest.mark.parametrize("library,notice", [("bitsandbytes", BNB_NOTICE), ("deepspeed", DEEPSPEED_NOTICE)])
def test_the_demo_s_spawned_workers_install_the_filters(library, notice):
    """The demo trains in spawned worker processes, which start without the command's filters: each installs them
    (``run.worker_init``). A worker that imports bitsandbytes and DeepSpeed shows neither notice; the same worker
    without the initializer shows it (on a machine where the library says it)."""
    if library == "deepspeed" and not _deepspeed_installed():
        pytest.skip("deepspeed is not installed")
    code = textwrap.dedent(WORKER.format(deepspeed=", deepspeed" if library == "deepspeed" else ""))

    def run(mode):
        done = subprocess.run([sys.executable, "-c", code, mode], capture_output=True, text=True, env=_env(),
                              timeout=600, stdin=subprocess.DEVNULL)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout + done.stderr

    control = run("plain")
    if notice not in control:
        pytest.skip(f"{library} does not print its notice on this machine")
    assert notice not in run("filtered")


@pytest.mark.skipif(not _deepspeed_installed(), reason="deepspeed is not installed")
def test_deepspeed_s_notice_is_kept_for_a_run_that_trains_with_deepspeed():
    probe = """
        import sys
        from llava_normaligned.notices import quiet_known_notices
        quiet_known_notices({argv!r})
        import deepspeed
    """
    assert DEEPSPEED_NOTICE not in _python(probe.format(argv=["--stage", "2"])).stdout
    assert DEEPSPEED_NOTICE in _python(probe.format(argv=["--stage", "2", "--deepspeed", "zero2.json"])).stdout
    # a recipe that sets deepspeed: said by the one reader of --config files (train's read_train_args)
    from_recipe = probe.replace("import deepspeed", "from llava_normaligned.notices import keep_notices_of\n"
                                "        keep_notices_of(('deepspeed', 'learning_rate'))\n        import deepspeed")
    assert DEEPSPEED_NOTICE in _python(from_recipe.format(argv=["--stage", "2", "--config", "recipe.yaml"])).stdout
