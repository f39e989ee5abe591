"""The README's Python code blocks run as written, each in a fresh Python process, offline.

The one change made to them: the Hub names and revisions in ``SUBSTITUTIONS`` are replaced by tiny local models
built in code (a SigLIP vision encoder and a Llama LM, and a norm-aligned model composed from them), since nothing
can be downloaded here. Everything else (imports, calls, arguments) is the README's text; the blocks run in order in
one working folder that holds the images they name (``cat.png``, ``a.png``, ``b.png``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def substitutions(vision_dir: str, text_dir: str, model_dir: str) -> dict[str, str]:
    """README text -> what the test runs instead (Python literals)."""
    return {
        '"google/siglip-so400m-patch14-384"': repr(vision_dir),
        '"meta-llama/Llama-3.2-3B-Instruct"': repr(text_dir),
        '"user/llava-na-3b"': repr(model_dir),
        '"me/llava-na-3b"': repr(model_dir),
        'revision="<commit>"': "revision=None",
    }


def readme_blocks() -> list[str]:
    return BLOCK.findall(README.read_text(encoding="utf-8"))


def test_the_readme_has_the_python_blocks_this_test_runs():
    blocks = readme_blocks()
    assert len(blocks) >= 3
    assert any("compose(" in b and "AutoProcessor.from_pretrained" in b for b in blocks)
    # the offline quick start: built from llava_normaligned.tiny, it runs as written (nothing to substitute)
    table = substitutions("v", "t", "m")
    assert any("llava_normaligned.tiny" in b and not any(text in b for text in table) for b in blocks)


@pytest.mark.slow
def test_readme_python_blocks_run_as_written(tiny_parts, tiny_model_dir, tmp_path):
    vision_dir, text_dir = (str(p) for p in tiny_parts)
    table = substitutions(vision_dir, text_dir, tiny_model_dir)
    for name, colour in (("cat.png", "orange"), ("a.png", "red"), ("b.png", "blue")):
        Image.new("RGB", (48, 48), colour).save(tmp_path / name)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING_FACE"))}
    env.update(HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf_home"), HF_HUB_DISABLE_TELEMETRY="1",
               TOKENIZERS_PARALLELISM="false")
    for number, block in enumerate(readme_blocks(), 1):
        code = block
        for text, replacement in table.items():
            code = code.replace(text, replacement)
        result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                                timeout=600, stdin=subprocess.DEVNULL, check=False)
        assert result.returncode == 0, f"README python block {number} failed:\n{block}\n{result.stderr[-3000:]}"
        # no remote-code prompt on the way (the processor needs no code of the checkpoint)
        assert "Do you wish to run the custom code" not in result.stdout + result.stderr, f"block {number}"
    assert (tmp_path / "llava-na-3b" / "config.json").is_file()  # what the quick start saves
