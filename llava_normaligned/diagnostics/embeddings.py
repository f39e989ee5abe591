"""The paper's Appendix C for any pair of a base LLM and a VLM built on it: ``diagnose VLM --compare-embeddings BASE``.

Table 6: the global statistics (mean and standard deviation of the L2 norms of the input-embedding rows) of the base
LLM and of the VLM's LLM; Tables 7-8: the top-10 tokens by L2 norm of each. Only the two embedding tables are read
(from the safetensors files when the checkpoint has them, so a 7B model costs one tensor, not the model); no forward
pass runs. The VLM's image-token row is left out of its statistics, as for ``text_embedding_norm`` (it is never an
input); the base LLM has no image token, so all its rows count.
"""

from __future__ import annotations

import json
import os

import torch

from .config import DiagnosticsError

EMBEDDING_SUFFIXES = ("embed_tokens.weight", "wte.weight", "word_embeddings.weight", "tok_embeddings.weight")
IMAGE_TOKEN_KEYS = ("image_token_id", "image_token_index")


def _embedding_key(keys) -> str | None:
    """The input-embedding tensor's name among a checkpoint's keys: the language model's, not a vision part's."""
    candidates = [k for k in keys if k.endswith(EMBEDDING_SUFFIXES) and "vision" not in k and "visual" not in k]
    return min(candidates, key=lambda k: (0 if "language_model" in k or k.startswith("model.") else 1, len(k))) \
        if candidates else None


def _from_safetensors(model_id: str, revision: str | None) -> torch.Tensor | None:
    from safetensors import safe_open
    from transformers.utils import cached_file

    def find(name):
        return cached_file(model_id, name, revision=revision, _raise_exceptions_for_missing_entries=False)

    index = find("model.safetensors.index.json")
    if index:
        with open(index, encoding="utf-8") as f:
            weight_map = json.load(f)["weight_map"]
        key = _embedding_key(weight_map)
        path = find(weight_map[key]) if key else None
    else:
        path = find("model.safetensors")
        key = None
        if path:
            with safe_open(path, framework="pt") as f:
                key = _embedding_key(f.keys())
    if not path or not key:
        return None
    with safe_open(path, framework="pt") as f:
        return f.get_tensor(key)


def _from_model(model_id: str, revision: str | None, trust_remote_code, vision: bool) -> torch.Tensor:
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    auto = AutoModelForImageTextToText if vision else AutoModelForCausalLM
    model, info = auto.from_pretrained(
        model_id, revision=revision, trust_remote_code=trust_remote_code, output_loading_info=True
    )
    embedding = model.get_input_embeddings().weight
    names = {name for name, param in model.named_parameters(remove_duplicate=False) if param is embedding}
    if names & set(info.get("missing_keys") or ()):  # transformers initialised it at random
        raise ValueError(f"the checkpoint holds no input embeddings ({sorted(names)[0]} is missing)")
    return embedding.detach()


def read_embeddings(model_id: str, revision=None, trust_remote_code=None, vision: bool = False):
    """(embedding table (V, D), tokenizer, config) of a checkpoint folder or Hub id."""
    from transformers import AutoTokenizer

    from llava_normaligned.loading import load_config

    try:
        config = load_config(model_id, revision=revision, trust_remote_code=trust_remote_code)
        weight = _from_safetensors(model_id, revision)
        if weight is None:
            weight = _from_model(model_id, revision, trust_remote_code, vision)
        tokenizer = AutoTokenizer.from_pretrained(model_id, revision=revision, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError) as err:
        raise DiagnosticsError(f"cannot read the input embeddings of {model_id!r}: {err}") from err
    return weight, tokenizer, config


def image_token_id(config) -> int | None:
    for owner in (config, config.get_text_config()):
        for key in IMAGE_TOKEN_KEYS:
            value = getattr(owner, key, None)
            if isinstance(value, int):
                return value
    return None


def compare_embeddings(vlm_id: str, base_id: str, *, revision=None, base_revision=None, trust_remote_code=None,
                       top_k: int = 10) -> dict:
    """Appendix C's numbers for ``base_id`` (the pure-text LLM) and ``vlm_id`` (the VLM built on it)."""
    from ..local_paths import public_name
    from .probes import embedding_table_stats

    base_weight, base_tokenizer, _ = read_embeddings(base_id, base_revision, trust_remote_code)
    vlm_weight, vlm_tokenizer, vlm_config = read_embeddings(vlm_id, revision, trust_remote_code, vision=True)
    image_id = image_token_id(vlm_config)
    return {
        "base_id": public_name(base_id),
        "vlm_id": public_name(vlm_id),
        "base": embedding_table_stats(base_weight, base_tokenizer, top_k),
        "vlm": embedding_table_stats(vlm_weight, vlm_tokenizer, top_k, (image_id,)),
    }


# ---------------------------------------------------------------------------------------------- the tables


def _token(row: dict, tokenizer_special: bool = False) -> str:
    """A token as the paper writes it: special tokens as they are, others as their quoted decoded text."""
    token, text = row["token"], row["text"]
    if token is None:
        return f"id {row['token_id']}"
    if token.startswith("<") and token.endswith(">") and len(token) > 2:
        shown = token
    else:
        shown = "'" + (text if text is not None else token).replace("\n", "\\n").replace("\t", "\\t") + "'"
    return shown.replace("|", "\\|")


def render(comparison: dict, digits: int = 4) -> str:
    """Tables 6 and 7/8 of the paper's Appendix C, in its layout."""
    base, vlm = comparison["base"], comparison["vlm"]
    b, v = f"`{comparison['base_id']}`", f"`{comparison['vlm_id']}`"
    f = f"{{:.{digits}f}}"
    lines = [
        "Global embedding statistics (L2 norm mean and standard deviation), base (pure text) and VL model "
        "(paper Table 6):",
        "",
        f"|  | {b} → {v} |  |",
        "| --- | --- | --- |",
        "| Metric | Base | VL |",
        f"| Mean Norm ($\\mu$) | {f.format(base['mean'])} | {f.format(vlm['mean'])} |",
        f"| Std. Deviation ($\\sigma$) | {f.format(base['std'])} | {f.format(vlm['std'])} |",
        "",
        f"Top-{max(len(base['top_k']), len(vlm['top_k']))} tokens by L2 norm (paper Tables 7-8):",
        "",
        f"|  | {b} (Base) |  | {v} (VL) |  |",
        "| --- | --- | --- | --- | --- |",
        "| Rank | Token | L2 Norm | Token | L2 Norm |",
    ]
    for rank in range(max(len(base["top_k"]), len(vlm["top_k"]))):
        cells = []
        for table in (base, vlm):
            row = table["top_k"][rank] if rank < len(table["top_k"]) else None
            cells += [_token(row), f.format(row["norm"])] if row else ["", ""]
        lines.append(f"| {rank + 1} | " + " | ".join(cells) + " |")
    excluded = vlm["excluded_token_ids"]
    lines += ["", f"Rows: {base['num_rows']} (base), {vlm['num_rows']} (VL"
              + (f", the image token {excluded} left out" if excluded else "") + ")."]
    return "\n".join(lines) + "\n"


JSON_NAME = "embedding_comparison.json"
MARKDOWN_NAME = "embedding_comparison.md"


def write(comparison: dict, output_dir: str) -> list[str]:
    from ..atomic_files import write_json_atomic, write_text_atomic
    from ..local_paths import public_record
    from .output_files import json_safe

    comparison = public_record(json_safe(comparison))
    return [
        write_json_atomic(os.path.join(output_dir, JSON_NAME), comparison, make_folder=True, indent=2,
                          ensure_ascii=False),
        write_text_atomic(os.path.join(output_dir, MARKDOWN_NAME), render(comparison), make_folder=True),
    ]
