"""SIGTERM, which schedulers (SLURM, Kubernetes) send before they preempt a job, during `llava-normaligned train`:
real processes of the console script (``processes.spawn_console``: SIGTERM at its default disposition in the child,
standard input ``/dev/null``).

* Before training's loop: the run stops as with Ctrl-C: the output folder it created is removed, one line, exit code
  143 (128 + SIGTERM).
* Once training runs: the step in progress ends with a normal checkpoint, nothing is saved as if the run had
  finished, one line names the checkpoint, exit code 143; resuming from it reproduces the uninterrupted run (same
  final weights, same loss at every step), with or without earlier periodic checkpoints, and with DataLoader workers
  that received the signal too (as every process of the job does under SLURM or ``torchrun``).
* ``--enable_jit_checkpoint`` (transformers' own SIGTERM checkpoint) is refused as bad input.
* Under ``torch.distributed`` the ranks agree on the step to stop at, whichever rank was signalled.

The tests wait for what the child writes (a logged step, a line on stderr), never for a fixed time.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time

import pytest
import torch

from llava_normaligned.commands.shared import TERMINATED
from tests.support.messages import error_line
from tests.support.processes import send_or_skip, spawn_console, wait_after_signal
from tests.support.training import write_llava_dataset

MAX_STEPS = 40  # the interrupted run is signalled after 3 logged steps: it must not have finished by then
SIGNAL_AFTER = 3  # logged steps
DEADLINE = 300  # s for a child to reach what a test waits for (loading a tiny model takes seconds; a busy CI longer)

# Holds `llava-normaligned train` once the Trainer is built (the output folder exists) and before training's loop:
# ``run_stage`` first writes HELD on stderr and sleeps. Put on the child's PYTHONPATH as ``sitecustomize``, so the
# process is still the installed console script. A SIGTERM during the sleep is one "before the first step".
HELD = "held before training's loop"
HOLD_BEFORE_TRAINING = f'''
import importlib.abc
import importlib.util
import sys
import time


class _HoldBeforeTraining(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != "llava_normaligned.trainer.train":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            run_stage = module.run_stage

            def held(prepared):
                print({HELD!r}, file=sys.stderr, flush=True)
                time.sleep(600)
                return run_stage(prepared)

            module.run_stage = held

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _HoldBeforeTraining())
'''


def _env(**extra) -> dict:
    return dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
                PYTHONUNBUFFERED="1", **extra)  # unbuffered: the logged steps reach the test as they are printed


def _train_args(model: str, data: tuple[str, str], out, *, save_steps: int, max_steps: int = MAX_STEPS,
                workers: int = 0) -> list[str]:
    return ["train", "--stage", "2", "--model", model, "--data-path", data[0], "--image-folder", data[1],
            "--output-dir", str(out), "--max_steps", str(max_steps), "--save_steps", str(save_steps),
            "--per_device_train_batch_size", "4", "--learning_rate", "1e-3", "--seed", "0", "--logging_steps", "1",
            "--report_to", "none", "--gradient_checkpointing", "False", "--dataloader_num_workers", str(workers),
            "--disable_tqdm", "True"]


class Child:
    """A `llava-normaligned` process whose stdout and stderr are read line by line as they come."""

    def __init__(self, args: list[str], env: dict | None = None, new_session: bool = False):
        self.proc = spawn_console(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=env or _env(), start_new_session=new_session)
        self.out: list[str] = []
        self.err: list[str] = []
        self._changed = threading.Condition()
        self._open = 2
        self._readers = [threading.Thread(target=self._read, args=(stream, into), daemon=True)
                         for stream, into in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))]
        for reader in self._readers:
            reader.start()

    def _read(self, stream, into: list[str]) -> None:
        for line in stream:
            with self._changed:
                into.append(line)
                self._changed.notify_all()
        with self._changed:
            self._open -= 1
            self._changed.notify_all()

    def stderr_tail(self, lines: int = 25) -> str:
        with self._changed:
            return "".join(self.err[-lines:])

    def steps_logged(self) -> int:
        return sum(line.startswith("{'loss'") for line in self.out)  # the Trainer's printed log of each step

    def wait_for(self, found, what: str, timeout: float = DEADLINE) -> None:
        """Until ``found()`` (called with the lines read so far); fails with the child's last stderr lines when the
        child ends first or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not found():
                if not self._open:
                    pytest.fail(f"train ended (exit {self.proc.wait()}) before {what}; its last lines:\n"
                                f"{''.join(self.err[-25:])}", pytrace=False)
                left = deadline - time.monotonic()
                if left <= 0:
                    self.proc.kill()
                    pytest.fail(f"no {what} within {timeout:.0f} s; its last lines:\n{''.join(self.err[-25:])}",
                                pytrace=False)
                self._changed.wait(min(left, 1.0))

    def signal_and_wait(self, number: int = signal.SIGTERM, timeout: float = 120) -> int:
        send_or_skip(self.proc, number)
        return self.finish(number, timeout)

    def finish(self, number: int | None = None, timeout: float = DEADLINE) -> int:
        try:
            if number is None:
                self.proc.wait(timeout=timeout)
            else:
                wait_after_signal(self.proc, number, timeout, self.stderr_tail)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        for reader in self._readers:
            reader.join(timeout=10)
        return self.proc.returncode

    def said(self) -> list[str]:
        """The command's own lines (``llava-normaligned train: ...``); asserts there is no traceback."""
        err = "".join(self.err)
        assert "Traceback" not in err, err[-3000:]
        return [line for line in err.splitlines() if line.startswith("llava-normaligned")]


def _run(args: list[str]) -> Child:
    child = Child(args)
    rc = child.finish()
    assert rc == 0, child.stderr_tail()
    return child


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> tuple[str, str]:
    return write_llava_dataset(str(tmp_path_factory.mktemp("sigterm_data")), n_rows=12, text_only=0)


@pytest.fixture(scope="module")
def straight(tiny_model_dir, data, tmp_path_factory):
    """The uninterrupted run the resumed ones must reproduce."""
    out = tmp_path_factory.mktemp("straight") / "run"
    _run(_train_args(tiny_model_dir, data, out, save_steps=50000))
    return out


def _weights(folder) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def _losses(folder) -> dict[int, float]:
    records = json.loads((folder / "norm_tracking.json").read_text())
    return {r["step"]: r["loss"] for r in records if "loss" in r}


# ------------------------------------------------------------------------------------------------ the tests


def test_sigterm_before_training_removes_the_output_and_exits_143(tiny_model_dir, data, tmp_path):
    """SIGTERM once the run has built its Trainer (which created the output folder) and before training's loop: the
    folder goes, one line, exit code 143."""
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(HOLD_BEFORE_TRAINING)
    out = tmp_path / "run"
    child = Child(_train_args(tiny_model_dir, data, out, save_steps=1, max_steps=5),
                  env=_env(PYTHONPATH=os.pathsep.join(filter(None, [str(shim), os.environ.get("PYTHONPATH")]))))
    child.wait_for(lambda: any(HELD in line for line in child.err), "hold before training")
    assert out.is_dir()  # the Trainer made it
    assert child.signal_and_wait() == TERMINATED, child.stderr_tail()
    said = child.said()
    assert said == [(f"llava-normaligned train: error: terminated (SIGTERM) before the first checkpoint; removed "
                     f"{out}, which this run had created")], child.stderr_tail()
    assert child.err[-1].rstrip() == said[0]
    assert not out.exists()


@pytest.mark.parametrize("earlier", [False, True], ids=["no checkpoint before", "periodic checkpoints before"])
def test_sigterm_while_training_checkpoints_and_the_resumed_run_is_the_straight_one(
        earlier, tiny_model_dir, data, straight, tmp_path):
    """SIGTERM after a few steps: the step ends with a checkpoint, the run stops without saving a final model, one
    line names the checkpoint, exit code 143. Resumed from that checkpoint to the same --max_steps, the run ends with
    the uninterrupted run's weights and losses."""
    out = tmp_path / "run"
    args = _train_args(tiny_model_dir, data, out, save_steps=2 if earlier else 50000)
    child = Child(args)
    child.wait_for(lambda: child.steps_logged() >= SIGNAL_AFTER, f"{SIGNAL_AFTER} logged steps")
    if earlier:
        assert (out / "checkpoint-2" / "trainer_state.json").is_file()  # saved before step 3 was logged
    assert child.signal_and_wait() == TERMINATED, child.stderr_tail()
    said = child.said()
    found = re.fullmatch(rf"llava-normaligned train: error: terminated \(SIGTERM\); {re.escape(str(out))} is kept: "
                         rf"continue with --resume_from_checkpoint {re.escape(str(out))}/checkpoint-(\d+)",
                         said[0] if len(said) == 1 else "")
    assert found, child.stderr_tail()
    assert child.err[-1].rstrip() == said[0]
    step = int(found.group(1))
    assert SIGNAL_AFTER <= step < MAX_STEPS, f"stopped at step {step} of {MAX_STEPS}"
    assert child.steps_logged() == step  # it stopped at the end of the step SIGTERM arrived in
    checkpoint = out / f"checkpoint-{step}"
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    assert state["global_step"] == step
    assert [e["step"] for e in state["log_history"] if "loss" in e] == list(range(1, step + 1))
    assert (checkpoint / "model.safetensors").is_file() and (checkpoint / "optimizer.pt").is_file()
    # nothing in the output folder claims a finished run
    for name in ("model.safetensors", "training_summary.json", "norm_tracking.json", "config.json"):
        assert not (out / name).exists(), name
    if earlier:
        assert sorted(p.name for p in out.glob("checkpoint-*")) == sorted(
            {f"checkpoint-{s}" for s in range(2, step + 1, 2)} | {checkpoint.name})

    _run([*args, "--resume_from_checkpoint", str(checkpoint)])
    assert json.loads((out / "training_summary.json").read_text())["training"]["global_steps"] == MAX_STEPS
    expected, resumed = _weights(straight), _weights(out)
    assert resumed.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(resumed[name], tensor), name  # the same process, threads and kernels: exact
    assert _losses(out) == _losses(straight)  # every step's loss, before and after the stop
    assert sorted(_losses(out)) == list(range(1, MAX_STEPS + 1))


def test_sigterm_to_every_process_with_dataloader_workers(tiny_model_dir, tmp_path):
    """SIGTERM to the run's whole process group, DataLoader workers included (SLURM signals every process of a job
    step, ``torchrun`` each rank's group): the workers keep serving until the step's checkpoint is saved. torch's own
    worker handler would die, and the main process would fail with "DataLoader worker ... killed by signal"."""
    data = write_llava_dataset(str(tmp_path / "data"), n_rows=128, text_only=0)  # one epoch holds the whole run
    out = tmp_path / "run"
    child = Child(_train_args(tiny_model_dir, data, out, save_steps=50000, max_steps=30, workers=2), new_session=True)
    child.wait_for(lambda: child.steps_logged() >= SIGNAL_AFTER, f"{SIGNAL_AFTER} logged steps")
    assert _children(child.proc.pid), "no DataLoader worker is running"
    os.killpg(child.proc.pid, signal.SIGTERM)
    assert child.finish(signal.SIGTERM, 120) == TERMINATED, child.stderr_tail()
    (line,) = child.said()
    step = int(re.search(r"checkpoint-(\d+)$", line).group(1))
    assert (out / f"checkpoint-{step}" / "trainer_state.json").is_file()
    assert not (out / "model.safetensors").exists()


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as handle:
            return [int(p) for p in handle.read().split()]
    except OSError:
        pytest.skip("/proc does not list a process's children here")


def test_enable_jit_checkpoint_is_refused_as_bad_input(tiny_model_dir, data, tmp_path, capsys):
    """transformers' SIGTERM checkpoint would run a second handler next to train's: one line naming the flag, exit
    code 2, before anything is loaded."""
    from llava_normaligned.commands.train import main

    out = tmp_path / "run"
    rc = main(_train_args(tiny_model_dir, data, out, save_steps=1, max_steps=2)[1:] + ["--enable_jit_checkpoint", "True"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("llava-normaligned")]
    assert rc == 2 and len(lines) == 1, err
    refused = error_line(err, "train")
    assert refused.startswith("--enable_jit_checkpoint: ") and "SIGTERM" in refused
    assert not out.exists()


def _ranks_agree(rank: int, init_method: str, out: str) -> None:
    """One rank of ``test_ranks_stop_at_the_same_step``: two runs of steps 1..6 through ``SigtermCheckpoint``'s
    ``on_step_end``; in run r, rank r sends itself SIGTERM during step 3."""
    from types import SimpleNamespace

    import torch.distributed as dist
    from transformers.trainer_callback import TrainerControl, TrainerState

    from llava_normaligned.trainer.callbacks import SigtermCheckpoint

    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=2)
    args, runs = SimpleNamespace(device=torch.device("cpu")), []
    for signalled in (0, 1):
        state, stops, callback = TrainerState(), [], SigtermCheckpoint()
        with callback.handling():
            callback.on_train_begin(args, state, TrainerControl())
            for step in range(1, 7):
                if step == 3 and rank == signalled:
                    os.kill(os.getpid(), signal.SIGTERM)  # handled at once, in this (the main) thread
                state.global_step = step
                control = TrainerControl()
                callback.on_step_end(args, state, control)
                if control.should_training_stop:
                    assert control.should_save
                    stops.append(step)
        runs.append({"stops": stops, "requested": callback.requested, "stopped_at": callback.stopped_at})
    dist.destroy_process_group()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as handle:
        json.dump(runs, handle)


def test_ranks_stop_at_the_same_step(tmp_path):
    """Two gloo ranks; SIGTERM reaches one of them (rank 0, then rank 1) during step 3: both stop at the end of step
    3 (the flag is all-reduced), and only there."""
    import torch.multiprocessing as mp

    init = f"file://{tmp_path / 'rendezvous'}"
    mp.start_processes(_ranks_agree, args=(init, str(tmp_path)), nprocs=2, start_method="spawn")
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for signalled in (0, 1):
        runs = [ranks[r][signalled] for r in (0, 1)]
        assert [r["stops"] for r in runs] == [[3], [3]], signalled
        assert [r["stopped_at"] for r in runs] == [3, 3], signalled
        assert [r["requested"] for r in runs] == [r == signalled for r in (0, 1)], signalled


def test_sigterm_while_dpo_trains_checkpoints_and_exits_143(tiny_model_dir, data, tmp_path):
    """The commands that mirror TRL's scripts stop as `train` does: `llava-normaligned dpo`, signalled after a few
    steps, ends the step with a checkpoint, saves no final model, names the checkpoint in one line, exit code 143."""
    from llava_normaligned.trainer.rl_data import preference_rows, save_rows

    pairs = tmp_path / "pairs"
    save_rows(preference_rows(data[0], data[1]), str(pairs))
    out = tmp_path / "dpo"
    child = Child(["dpo", "--model_name_or_path", tiny_model_dir, "--dataset_name", str(pairs), "--output_dir",
                   str(out), "--max_steps", str(MAX_STEPS), "--per_device_train_batch_size", "2", "--seed", "0",
                   "--learning_rate", "1e-3", "--logging_steps", "1", "--save_strategy", "no", "--report_to", "none",
                   "--disable_tqdm", "True"])
    child.wait_for(lambda: child.steps_logged() >= SIGNAL_AFTER, f"{SIGNAL_AFTER} logged steps")
    assert child.signal_and_wait() == TERMINATED, child.stderr_tail()
    said = child.said()
    found = re.search(r"terminated \(SIGTERM\).*--resume_from_checkpoint (\S+checkpoint-(\d+))",
                      said[0] if len(said) == 1 else "")
    assert found and said[0].startswith("llava-normaligned dpo: error: "), child.stderr_tail()
    step = int(found.group(2))
    assert SIGNAL_AFTER <= step < MAX_STEPS and child.steps_logged() == step
    assert json.loads((out / f"checkpoint-{step}" / "trainer_state.json").read_text())["global_step"] == step
    assert not (out / "model.safetensors").exists() and not (out / "norm_tracking.json").exists()
