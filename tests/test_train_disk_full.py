"""A disk that fills while `llava-normaligned train` saves a checkpoint: one line, not a traceback, naming the folder,
the last complete checkpoint and the ``--resume_from_checkpoint`` to use; the half-written checkpoint removed; the
resumed run the uninterrupted one.

The console script runs as a real process. The disk fills on a real tmpfs with room for about one and a half
checkpoints, where this process may mount one (else that test is skipped), and everywhere by a ``sitecustomize`` shim
on the child's PYTHONPATH: the optimizer state of ``checkpoint-2`` is written in part, then the write fails as a full
device fails (``OSError(ENOSPC)``), so what the Trainer leaves is what a full disk leaves (the weights and a partial
optimizer file in ``checkpoint-2``, no ``trainer_state.json``).
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import torch

from tests.support.messages import error_line
from tests.support.processes import spawn_console
from tests.support.training import write_llava_dataset

MAX_STEPS = 4

DISK_FULL_AT_CHECKPOINT_2 = '''
import errno

import torch

_save = torch.save


def _save_until_full(obj, f, *args, **kwargs):
    path = str(f)
    if "checkpoint-2" in path and path.endswith("optimizer.pt"):
        with open(path, "wb") as handle:
            handle.write(b"PK" + bytes(100))  # part of the file, then no room
        raise OSError(errno.ENOSPC, "No space left on device", path)
    return _save(obj, f, *args, **kwargs)


torch.save = _save_until_full
'''


def _env(**extra) -> dict:
    return dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", **extra)


def _train_args(model: str, data, out, save_steps: int) -> list[str]:
    return ["train", "--stage", "2", "--model", model, "--data-path", data[0], "--image-folder", data[1],
            "--output-dir", str(out), "--max_steps", str(MAX_STEPS), "--save_steps", str(save_steps),
            "--per_device_train_batch_size", "4", "--learning_rate", "1e-3", "--seed", "0", "--logging_steps", "1",
            "--report_to", "none", "--gradient_checkpointing", "False", "--disable_tqdm", "True"]


def _run(args: list[str], env: dict | None = None) -> tuple[int, str]:
    child = spawn_console(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env or _env())
    _, err = child.communicate(timeout=600)
    return child.returncode, err


def _weights(folder) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_llava_dataset(str(tmp_path_factory.mktemp("disk_full_data")), n_rows=12, text_only=0)


def test_a_full_disk_names_the_checkpoint_to_resume_from_and_the_resumed_run_is_the_straight_one(
        tiny_model_dir, data, tmp_path):
    straight = tmp_path / "straight"
    code, err = _run(_train_args(tiny_model_dir, data, straight, save_steps=1000))
    assert code == 0, err[-3000:]

    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(DISK_FULL_AT_CHECKPOINT_2)
    out = tmp_path / "run"
    env = _env(PYTHONPATH=os.pathsep.join(filter(None, [str(shim), os.environ.get("PYTHONPATH")])))
    code, err = _run(_train_args(tiny_model_dir, data, out, save_steps=1), env=env)
    said = [line for line in err.splitlines() if line.startswith("llava-normaligned")]
    assert code == 1 and "Traceback" not in err, err[-3000:]
    assert len(said) == 1 and err.rstrip().endswith(said[0]), err[-3000:]
    complete, partial = out / "checkpoint-1", out / "checkpoint-2"
    assert said[0] == (f"llava-normaligned train: error: no room left on the disk writing {partial}/optimizer.pt "
                       f"(No space left on device); removed the incomplete {partial}; {out} is kept: free some space, "
                       f"then continue with --resume_from_checkpoint {complete}")
    assert not partial.exists()  # the half-written checkpoint is gone, the complete one is whole
    assert json.loads((complete / "trainer_state.json").read_text())["global_step"] == 1
    assert not (out / "model.safetensors").exists()  # nothing claims a finished run

    code, err = _run([*_train_args(tiny_model_dir, data, out, save_steps=1000), "--resume_from_checkpoint",
                      str(complete)])
    assert code == 0, err[-3000:]
    expected, resumed = _weights(straight), _weights(out)
    assert resumed.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(resumed[name], tensor), name  # the same process, threads and kernels: exact


def test_a_full_disk_before_the_first_checkpoint_removes_the_folder_this_run_created(tiny_model_dir, data, tmp_path):
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(DISK_FULL_AT_CHECKPOINT_2.replace('"checkpoint-2"', '"checkpoint-1"'))
    out = tmp_path / "run"
    env = _env(PYTHONPATH=os.pathsep.join(filter(None, [str(shim), os.environ.get("PYTHONPATH")])))
    code, err = _run(_train_args(tiny_model_dir, data, out, save_steps=1), env=env)
    said = [line for line in err.splitlines() if line.startswith("llava-normaligned")]
    assert code == 1 and "Traceback" not in err and len(said) == 1, err[-3000:]
    assert said[0].endswith(f"before the first complete checkpoint; removed {out}, which this run had created; free "
                            "some space and run again"), said
    assert not out.exists()


def _mount_tmpfs(folder, size: int) -> None:
    folder.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"no tmpfs can be mounted here: {result.stderr.strip() or result.returncode}")


def test_a_real_full_file_system_is_told_as_such_and_its_complete_checkpoints_resume(tiny_model_dir, data, tmp_path):
    """On a tmpfs with room for about one and a half checkpoints (where this process may mount one): the second
    checkpoint's save fails as the device fills (torch's or safetensors' own error, not an OSError); the line names
    the last complete checkpoint, the incomplete one is gone, and the run resumes from the complete one, the disk
    freed, to the uninterrupted run's weights."""
    import shutil

    probe = tmp_path / "probe"
    code, err = _run(_train_args(tiny_model_dir, data, probe, save_steps=1) + ["--max_steps", "1"])
    assert code == 0, err[-3000:]
    checkpoint = sum(f.stat().st_size for f in (probe / "checkpoint-1").rglob("*") if f.is_file())
    straight = tmp_path / "straight"
    code, err = _run(_train_args(tiny_model_dir, data, straight, save_steps=1000))
    assert code == 0, err[-3000:]

    disk = tmp_path / "disk"
    _mount_tmpfs(disk, int(1.5 * checkpoint) + 64 * 1024)
    try:
        out = disk / "run"
        code, err = _run(_train_args(tiny_model_dir, data, out, save_steps=1))
        said = [line for line in err.splitlines() if line.startswith("llava-normaligned")]
        assert code == 1 and "Traceback" not in err and len(said) == 1, err[-3000:]
        complete = out / "checkpoint-1"
        refused = error_line(err, "train")
        assert "no room left" in refused and "removed" in refused and str(out / "checkpoint-2") in refused, said
        assert f"{out} is kept" in refused and refused.split()[-2:] == ["--resume_from_checkpoint", str(complete)], said
        assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-1"]
        resumed = tmp_path / "resumed"
        shutil.copytree(out, resumed)  # the disk freed: the run goes on elsewhere from the complete checkpoint
    finally:
        subprocess.run(["umount", str(disk)], check=False)
    code, err = _run([*_train_args(tiny_model_dir, data, resumed, save_steps=1000), "--resume_from_checkpoint",
                      str(resumed / "checkpoint-1")])
    assert code == 0, err[-3000:]
    expected, got = _weights(straight), _weights(resumed)
    for name, tensor in expected.items():
        assert torch.equal(got[name], tensor), name
