"""Two ranks on this machine: ``torchrun`` with gloo, one thread each, and what each rank wrote."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def torchrun(script_text: str, tmp_path, *args) -> list[dict]:
    """Run ``script_text`` on two ranks (``torchrun``, gloo, one thread each) with ``args`` and an output folder
    ``tmp_path/out`` as its last argument; returns the ranks' ``rank{r}.json`` records."""
    script = tmp_path / "rank_script.py"
    script.write_text(script_text)
    out = tmp_path / "out"
    out.mkdir()
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
               HF_DATASETS_CACHE=str(tmp_path / "datasets_cache"))
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
               "--master_addr", "127.0.0.1", "--master_port", str(free_port()), str(script), *args, str(out)]
    # its own process group, so that a hang is cleaned up whole (the launcher and both ranks)
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True, stdin=subprocess.DEVNULL)
    try:
        output, _ = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        raise AssertionError(f"2-process DDP did not finish in 300 s:\n{output[-4000:]}") from None
    assert proc.returncode == 0, output[-4000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
