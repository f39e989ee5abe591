"""``llava-normaligned COMMAND --help`` is built once per installed version and source, then read."""

import os
import subprocess
import sys

import pytest

PROBE = ("import sys; from llava_normaligned.cli import main; code = main([{command!r}, '--help']); "
         "print('IMPORTED TRL' if 'trl' in sys.modules else 'NO TRL'); sys.exit(code)")


def _help(command: str, cache: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "LLAVA_NORMALIGNED_CACHE": cache, "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-c", PROBE.format(command=command)], capture_output=True, text=True,
                          env=env, timeout=600)


@pytest.mark.parametrize("command", ["train"])
def test_help_is_built_once_then_read_without_importing_trl(tmp_path, command):
    first = _help(command, str(tmp_path))
    assert first.returncode == 0, first.stderr
    assert first.stdout.rstrip().endswith("IMPORTED TRL") and "--per_device_train_batch_size" in first.stdout
    second = _help(command, str(tmp_path))
    assert second.returncode == 0 and second.stdout.rstrip().endswith("NO TRL")
    assert second.stdout.rsplit("\n", 2)[0] == first.stdout.rsplit("\n", 2)[0]  # the same text
    cached = os.listdir(tmp_path / "help")
    assert len(cached) == 1 and cached[0].startswith(f"{command}-") and not cached[0].endswith(".partial")


def test_the_key_follows_the_sources_and_versions(monkeypatch):
    from llava_normaligned import cli

    key = cli._help_key("train")
    assert key == cli._help_key("train") and key != cli._help_key("eval")
    monkeypatch.setattr(cli, "HELP_DEPENDS_ON", cli.HELP_DEPENDS_ON + ("numpy",))
    assert cli._help_key("train") != key
