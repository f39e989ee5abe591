"""Publishing: push and pull through the real huggingface_hub client against a local Hub server (tests/support/hub_server.py),
loading with trust_remote_code in a process where this package cannot be imported (the self-check's own
``run_without_package``, through tests/support/isolation.py), and the folder self-check.

The expensive part (pushes, a 2-step TRL training run with push_to_hub, one fresh-process load of everything) runs
once, in the module fixture ``published``; the tests read its results.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file, save_file
from transformers import AutoProcessor

from llava_normaligned.hub_cards import selfcheck
from llava_normaligned.hub_cards.card import CardOptions
from llava_normaligned.commands.push import main as push_main
from llava_normaligned.hub_cards.push import PullError, PushError, pull, push
from llava_normaligned.hub_cards.selfcheck import (
    LocalPathError,
    SelfCheckError,
    check_loads,
    check_remote_code,
    find_secrets,
    plan_upload,
    run_without_package,
    self_check,
)
from modeling_llava_normaligned import LlavaNormAlignedForConditionalGeneration
from tests.support.hub_server import HubServer
from tests.support.isolation import run_isolated
from tests.support.messages import one_line

# Shaped like real Hub tokens ("hf_" + 34 characters), so that the pattern scan sees them too.
ALICE = "hf_" + "aliceTestToken0123456789abcdefghij"[:34]
BOB = "hf_" + "bobTestToken0123456789abcdefghijkl"[:34]
NORM_GAIN = "model.multi_modal_projector.norm.weight"
PROMPT = "what colour is the shape ?"


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    import huggingface_hub.constants

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(huggingface_hub.constants, "HF_HUB_DISABLE_XET", True)  # the server speaks LFS, not Xet
        with HubServer(tmp_path_factory.mktemp("hub"), tokens={ALICE: "alice", BOB: "bob"}) as server:
            yield server


def client_env(hub, home, token=None) -> dict:
    """Environment of a process using the Hub client: endpoint, a fresh cache, LFS uploads; HF_TOKEN only if given."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING_FACE")) and k != "PYTHONPATH"}
    env.update(HF_ENDPOINT=hub.url, HF_HOME=str(home), HF_HUB_DISABLE_XET="1", HF_HUB_DISABLE_TELEMETRY="1",
               HF_HUB_OFFLINE="0", TOKENIZERS_PARALLELISM="false")
    if token:
        env["HF_TOKEN"] = token
    return env


def with_scaled_gain(src, dst, factor: float) -> str:
    """A copy of a checkpoint folder whose projector-norm gain is multiplied by ``factor`` (a different model)."""
    shutil.copytree(src, dst)
    weights = load_file(os.path.join(dst, "model.safetensors"))
    weights[NORM_GAIN] = weights[NORM_GAIN] * factor
    save_file(weights, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    return str(dst)


# A TRL run that pushes with the Trainer's own push_to_hub; its output folder also has checkpoint-*, optimizer
# states and training_args.bin, as `train` leaves them. The token comes from HF_TOKEN: a `hub_token=` argument would
# be pickled into training_args.bin, which the Trainer uploads.
TRAIN_AND_PUSH = """
import sys
import modeling_llava_normaligned  # registered: save_pretrained copies the remote code and writes auto_map
from datasets import Dataset
from PIL import Image
from transformers import AutoModelForImageTextToText, AutoProcessor
from trl import SFTConfig, SFTTrainer

model_dir, out_dir, repo_id = sys.argv[1:4]
model = AutoModelForImageTextToText.from_pretrained(model_dir)
processor = AutoProcessor.from_pretrained(model_dir)
rows = [{"images": [Image.new("RGB", (32, 32), c)],
         "messages": [{"role": "user", "content": "what colour is the shape ?"}, {"role": "assistant", "content": c}]}
        for c in ("red", "green", "blue", "red")]
args = SFTConfig(output_dir=out_dir, max_steps=2, per_device_train_batch_size=2, save_strategy="steps", save_steps=1,
                 use_cpu=True, bf16=False, report_to=[], gradient_checkpointing=False, learning_rate=1e-2,
                 push_to_hub=True, hub_model_id=repo_id, hub_strategy="end")
trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=processor)
trainer.train()
trainer.save_model()
trainer.push_to_hub()
"""

# Load each job's repo@revision with the Auto classes and trust_remote_code, run the remote processor on one image
# and prompt, and save inputs, logits and base-model hidden states.
REMOTE_LOAD = """
import json, sys
import torch
from PIL import Image
from safetensors.torch import save_file
from transformers import AutoModel, AutoModelForImageTextToText, AutoProcessor

jobs, out = json.loads(sys.argv[1]), sys.argv[2]
tensors, meta = {}, {}
for job in jobs:
    name, repo, rev = job["name"], job["repo"], job.get("revision")
    processor = AutoProcessor.from_pretrained(repo, revision=rev, trust_remote_code=True)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": sys.argv[3]}]}]
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True)
    inputs = processor(images=Image.new("RGB", (32, 32), (200, 30, 30)), text=prompt, return_tensors="pt")
    model = AutoModelForImageTextToText.from_pretrained(repo, revision=rev, trust_remote_code=True).eval()
    with torch.no_grad():
        tensors[name + ".logits"] = model(**inputs).logits.contiguous()
        if job.get("base"):
            base = AutoModel.from_pretrained(repo, revision=rev, trust_remote_code=True).eval()
            tensors[name + ".hidden"] = base(**inputs).last_hidden_state.contiguous()
            meta[name + ".base_module"] = type(base).__module__
    for key in ("input_ids", "attention_mask", "pixel_values"):
        tensors[name + "." + key] = inputs[key].contiguous()
    meta[name + ".module"] = type(model).__module__
    meta[name + ".processor"] = type(processor).__name__
save_file(tensors, out + ".safetensors")
json.dump(meta, open(out + ".json", "w"))
"""

# The CLI in one process: push (HF_ENDPOINT, HF_TOKEN from the environment), then pull.
CLI_PUSH_PULL = """
import sys
from llava_normaligned.cli import main
folder, pulled = sys.argv[1:3]
rc = main(["push", folder, "--repo-id", "alice/tiny", "--license", "apache-2.0", "--commit-message", "first model"])
sys.exit(rc or main(["pull", "alice/tiny", "--local-dir", pulled]))
"""


@pytest.fixture(scope="module")
def published(hub, tiny_model_dir, tmp_path_factory):
    """Every push of the scenario, then one fresh-process load of every published revision."""
    tmp = tmp_path_factory.mktemp("published")
    # 1. `llava-normaligned push` then `pull`, in a process configured only by HF_ENDPOINT / HF_TOKEN.
    cli = subprocess.run(
        [sys.executable, "-c", CLI_PUSH_PULL, tiny_model_dir, str(tmp / "pulled")], cwd=tmp,
        env=client_env(hub, tmp / "home_cli", token=ALICE), capture_output=True, text=True, timeout=600,
        stdin=subprocess.DEVNULL,
    )
    assert cli.returncode == 0, cli.stdout + cli.stderr
    v1 = re.search(r"pushed \d+ file\(s\) to alice/tiny@main: commit ([0-9a-f]{40})", cli.stdout).group(1)
    # 2. A second push of a different model, through the Python API.
    v2_dir = with_scaled_gain(tiny_model_dir, tmp / "v2", 3.0)
    v2 = push(v2_dir, "alice/tiny", token=ALICE, endpoint=hub.url, check_load=False, commit_message="second model",
              options=CardOptions(license="apache-2.0", datasets=("alice/shapes",)))
    # 3. TRL training with the Trainer's push_to_hub.
    trained_dir = tmp / "trained"
    train = subprocess.run(
        [sys.executable, "-c", TRAIN_AND_PUSH, tiny_model_dir, str(trained_dir), "alice/trained"], cwd=tmp,
        env=client_env(hub, tmp / "home_train", token=ALICE), capture_output=True, text=True, timeout=600,
        stdin=subprocess.DEVNULL,
    )
    assert train.returncode == 0, train.stdout + train.stderr[-4000:]
    # 4. The training output folder through `push`, with the fresh-process load check.
    clean = push(trained_dir, "alice/trained-clean", token=ALICE, endpoint=hub.url)
    # 5. Load everything where this package cannot be imported, anonymously.
    jobs = [
        {"name": "main", "repo": "alice/tiny", "base": True},
        {"name": "v1", "repo": "alice/tiny", "revision": v1},
        {"name": "trained", "repo": "alice/trained"},
        {"name": "clean", "repo": "alice/trained-clean", "revision": clean.commit},
    ]
    out = str(tmp / "remote")
    run_isolated(
        f"import sys; sys.argv = {['-c', json.dumps(jobs), out, PROMPT]!r}\n" + textwrap.dedent(REMOTE_LOAD),
        cwd=str(tmp), env={k: v for k, v in client_env(hub, tmp / "home_load").items() if k.startswith("HF_")},
    )
    with open(out + ".json") as f:
        meta = json.load(f)
    return dict(tmp=tmp, cli=cli, v1=v1, v2=v2, v2_dir=v2_dir, trained_dir=str(trained_dir), clean=clean,
                remote=load_file(out + ".safetensors"), meta=meta)


def local_outputs(folder, remote: dict, name: str):
    """Logits and base-model hidden states of the folder's model in this process, on the remote run's inputs."""
    model = LlavaNormAlignedForConditionalGeneration.from_pretrained(folder).eval()
    inputs = {k: remote[f"{name}.{k}"] for k in ("input_ids", "attention_mask", "pixel_values")}
    with torch.no_grad():
        return model(**inputs).logits, model.model(**inputs).last_hidden_state


# ------------------------------------------------------------------------------------------- push, then load


def test_push_then_fresh_process_load_gives_identical_outputs(published, tiny_model_dir):
    remote, meta = published["remote"], published["meta"]
    # The classes came from the repo's files (transformers' dynamic modules), not from an installed package.
    assert meta["main.module"].startswith("transformers_modules.")
    assert meta["main.base_module"].startswith("transformers_modules.")
    assert meta["main.processor"] == "LlavaProcessor"
    logits, hidden = local_outputs(published["v2_dir"], remote, "main")
    assert torch.equal(remote["main.logits"], logits)
    assert torch.equal(remote["main.hidden"], hidden)
    # The pushed processor builds the same inputs as the folder's.
    processor = AutoProcessor.from_pretrained(tiny_model_dir)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": PROMPT}]}]
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True)
    local = processor(images=Image.new("RGB", (32, 32), (200, 30, 30)), text=prompt, return_tensors="pt")
    assert torch.equal(remote["main.input_ids"], local["input_ids"])
    assert torch.equal(remote["main.pixel_values"], local["pixel_values"])


def test_second_push_is_a_new_commit_and_the_first_revision_still_loads(published, hub, tiny_model_dir):
    v1, v2 = published["v1"], published["v2"]
    assert v2.commit != v1
    history = _commits(hub, "alice/tiny")  # newest first
    assert v1 in history and v2.commit in history and history.index(v2.commit) < history.index(v1)
    remote = published["remote"]
    v1_logits, _ = local_outputs(tiny_model_dir, remote, "v1")
    assert torch.equal(remote["v1.logits"], v1_logits)  # pinned to the first commit: the first model
    assert not torch.equal(remote["v1.logits"], remote["main.logits"])  # main: the second model


def _commits(hub, repo_id) -> list[str]:
    from huggingface_hub import HfApi

    return [c.commit_id for c in HfApi(endpoint=hub.url).list_repo_commits(repo_id)]


def test_card_is_pinned_to_the_model_commit(published, hub):
    v2 = published["v2"]
    assert v2.card_commit == hub.head("alice/tiny").oid
    assert hub.head("alice/tiny").parent == v2.commit
    card = hub.file_bytes("alice/tiny", "README.md").decode()
    assert f'revision = "{v2.commit}"' in card
    # The model commit's own card cannot know its hash: it names the branch and says so instead of pinning a wrong one.
    own_card = hub.file_bytes("alice/tiny", "README.md", v2.commit).decode()
    assert 'revision = "main"  # a branch: replace with a commit hash' in own_card
    # The README-only commit changed nothing else.
    assert {p: e["oid"] for p, e in hub.head("alice/tiny").files.items() if p != "README.md"} == {
        p: e["oid"] for p, e in hub.store.repos["alice/tiny"].commits[v2.commit].files.items() if p != "README.md"
    }


def test_cli_push_uploads_what_users_need_and_pull_fetches_it(published, hub):
    v1_files = set(hub.store.repos["alice/tiny"].commits[published["v1"]].files)
    assert v1_files == {
        ".gitattributes", "README.md", "config.json", "generation_config.json", "model.safetensors",
        "configuration_llava_normaligned.py", "modeling_llava_normaligned.py", "transformers_hooks.py",
        "processor_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
    }
    config = json.loads(hub.file_bytes("alice/tiny", "config.json", published["v1"]))
    assert set(config["auto_map"]) >= {"AutoConfig", "AutoModel", "AutoModelForImageTextToText"}
    assert "identical to llava-normaligned" in published["cli"].stdout  # pull compared the remote code
    pulled = published["tmp"] / "pulled"
    v1_weights = hub.file_bytes("alice/tiny", "model.safetensors", published["v1"])  # main when pulled
    assert (pulled / "model.safetensors").read_bytes() == v1_weights


def test_trainer_push_to_hub_loads_with_remote_code(published):
    logits, _ = local_outputs(published["trained_dir"], published["remote"], "trained")
    assert published["meta"]["trained.module"].startswith("transformers_modules.")
    assert torch.equal(published["remote"]["trained.logits"], logits)


def test_training_output_pushes_without_training_state(published, hub):
    files = set(hub.head("alice/trained-clean").files)
    assert {"model.safetensors", "config.json", "modeling_llava_normaligned.py", "README.md"} <= files
    assert not any(f.startswith("checkpoint-") or f.endswith((".bin", ".pt", ".pth")) for f in files)
    skipped = dict(published["clean"].skipped)
    assert skipped["training_args.bin"].startswith("training state")
    assert any(p.startswith("checkpoint-2/") for p in skipped)
    logits, _ = local_outputs(published["trained_dir"], published["remote"], "clean")
    assert torch.equal(published["remote"]["clean.logits"], logits)
    # The card was rendered from our template, replacing the trainer's README.md in the folder.
    assert "## Norm statistics" in hub.file_bytes("alice/trained-clean", "README.md").decode()


def test_no_token_in_any_pushed_file_or_request_path(published, hub):
    for repo in hub.store.repos.values():
        for commit in repo.commits.values():
            for entry in commit.files.values():
                content = hub.store.blob_path(entry["sha256"]).read_bytes()
                assert ALICE.encode() not in content
    assert not any(ALICE in path for _, path, _ in hub.requests)
    assert ALICE not in published["cli"].stdout + published["cli"].stderr


def test_pushed_card_metadata_passes_the_servers_validation(published, hub, monkeypatch):
    """The pushed card passes the test server's /api/validate-yaml, which applies the rules written in
    hub_server.validate_card_metadata (a subset of the Hub's, not the Hub's validator)."""
    import huggingface_hub.constants
    from huggingface_hub import ModelCard

    card = ModelCard(hub.file_bytes("alice/tiny", "README.md").decode())
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", hub.url)  # ModelCard.validate posts there
    card.validate()
    assert card.data.library_name == "transformers" and card.data.pipeline_tag == "image-text-to-text"
    assert card.data.license == "apache-2.0" and card.data.datasets == ["alice/shapes"]


def test_a_token_pickled_in_training_args_never_reaches_the_hub(hub, folder):
    from transformers import TrainingArguments

    # What the Trainer writes when given hub_token=: the token in a pickle next to the model.
    torch.save(TrainingArguments(output_dir=str(folder), hub_token=ALICE, report_to=[]), folder / "training_args.bin")
    assert ALICE.encode() in (folder / "training_args.bin").read_bytes()
    result = push(folder, "alice/from-trainer", token=ALICE, endpoint=hub.url, check_load=False)
    assert "training state" in dict(result.skipped)["training_args.bin"]
    for entry in hub.head("alice/from-trainer").files.values():
        assert ALICE.encode() not in hub.store.blob_path(entry["sha256"]).read_bytes()


# ----------------------------------------------------------------------------------------- private repos


def test_private_repo_refuses_anonymous_and_foreign_reads(hub, tiny_model_dir, tmp_path):
    from huggingface_hub import HfApi, hf_hub_download
    from huggingface_hub.errors import RepositoryNotFoundError

    result = push(tiny_model_dir, "alice/secret", private=True, token=ALICE, endpoint=hub.url, check_load=False)
    for token in (False, BOB):  # anonymous (401), another user (404): both look like "no such repo"
        with pytest.raises(RepositoryNotFoundError):
            HfApi(endpoint=hub.url, token=token).model_info("alice/secret")
        with pytest.raises(RepositoryNotFoundError):
            hf_hub_download("alice/secret", "config.json", endpoint=hub.url, token=token, cache_dir=tmp_path / "c")
        with pytest.raises(PullError) as error:
            pull("alice/secret", local_dir=tmp_path / "anon", token=token, endpoint=hub.url)
        assert "Repository Not Found" in str(error.value)
    pulled = pull("alice/secret", local_dir=tmp_path / "alice", token=ALICE, endpoint=hub.url)
    assert pulled.commit == result.card_commit
    assert (tmp_path / "alice" / "model.safetensors").is_file()


# ------------------------------------------------------------------------------------- failures midway


@pytest.mark.parametrize(
    "method, path",
    [("PUT", r"^/_lfs/"), ("POST", r"/commit/main$")],
    ids=["weights-upload-fails", "commit-fails"],
)
def test_push_that_fails_midway_leaves_the_repo_as_it_was(hub, tiny_model_dir, tmp_path, method, path):
    repo_id = f"alice/atomic-{method.lower()}"
    push(tiny_model_dir, repo_id, token=ALICE, endpoint=hub.url, check_load=False)
    before = hub.head(repo_id)
    changed = with_scaled_gain(tiny_model_dir, tmp_path / "changed", 0.5)
    hub.fail_next(method, path)
    with pytest.raises(PushError) as error:
        push(changed, repo_id, token=ALICE, endpoint=hub.url, check_load=False)
    assert "nothing was committed" in str(error.value) and ALICE not in str(error.value)
    after = hub.head(repo_id)
    assert after.oid == before.oid and after.files == before.files
    # The next push goes through, in one new model commit (+ the card pin).
    pushed = push(changed, repo_id, token=ALICE, endpoint=hub.url, check_load=False)
    assert hub.store.repos[repo_id].commits[pushed.commit].parent == before.oid


def test_refused_token_is_not_echoed(hub, tiny_model_dir, capsys, monkeypatch):
    wrong = "hf_" + "W" * 34
    monkeypatch.setenv("HF_TOKEN", wrong)
    with pytest.raises(PushError) as error:
        push(tiny_model_dir, "alice/refused", token=wrong, endpoint=hub.url, check_load=False)
    assert wrong not in str(error.value) and "401" in str(error.value)


# ------------------------------------------------------------------------------------------- self-check


@pytest.fixture
def folder(tiny_model_dir, tmp_path):
    """A writable copy of the tiny checkpoint."""
    return shutil.copytree(tiny_model_dir, tmp_path / "ckpt")


def test_self_check_refuses_pickled_weights_naming_the_file(folder):
    torch.save({"w": torch.zeros(2)}, folder / "pytorch_model.bin")
    with pytest.raises(SelfCheckError, match=r"pytorch_model\.bin: a pickle file"):
        self_check(folder, load=False)


def test_self_check_refuses_remote_code_importing_a_foreign_package(folder):
    code = (folder / "modeling_llava_normaligned.py").read_text()
    (folder / "modeling_llava_normaligned.py").write_text("import numpy as np\n" + code)
    with pytest.raises(SelfCheckError, match=r"modeling_llava_normaligned\.py, line 1: imports 'numpy'"):
        self_check(folder, load=False)
    (folder / "modeling_llava_normaligned.py").write_text(
        code.replace("from .configuration_llava_normaligned", "from llava_normaligned.configuration")
    )
    with pytest.raises(SelfCheckError, match="imports 'llava_normaligned.configuration'"):
        check_remote_code(plan_upload(folder))


def test_self_check_refuses_a_config_without_auto_map(folder):
    config = json.loads((folder / "config.json").read_text())
    del config["auto_map"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(SelfCheckError, match="auto_map lacks"):
        self_check(folder, load=False)


def test_self_check_refuses_a_token_in_a_file_without_printing_it(folder):
    (folder / "training_summary.json").write_text(json.dumps({"args": {"hub_token": ALICE}}))
    with pytest.raises(SelfCheckError, match=r"training_summary\.json, line 1: holds what looks like") as error:
        self_check(folder, tokens=[], load=False)  # found by its shape alone
    assert ALICE not in str(error.value)


def test_self_check_refuses_a_fake_safetensors_file(folder):
    torch.save({"w": torch.zeros(2)}, folder / "model.safetensors")  # a pickle in disguise
    with pytest.raises(SelfCheckError, match=r"model\.safetensors: not a safetensors file"):
        self_check(folder, load=False)


def test_self_check_load_refuses_weights_that_would_be_reinitialised(folder):
    weights = load_file(folder / "model.safetensors")
    del weights[NORM_GAIN]
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(SelfCheckError, match=r"missing_keys: \['model\.multi_modal_projector\.norm\.weight'\]"):
        self_check(folder)


def test_push_dry_run_prints_the_plan_and_uploads_nothing(folder, capsys):
    (folder / "optimizer.pt").write_bytes(b"state")
    (folder / "notes.txt").write_text("mine")
    assert push_main([str(folder), "--repo-id", "alice/dry", "--dry-run", "--skip-load-check"]) == 0
    out = capsys.readouterr().out
    assert "+ model.safetensors" in out and "- optimizer.pt  (training state" in out
    assert "- notes.txt  (not needed" in out and "nothing uploaded" in out


def test_push_cli_reports_a_bad_folder_with_exit_code_2(tmp_path, capsys):
    assert push_main([str(tmp_path / "missing"), "--repo-id", "alice/x", "--dry-run"]) == 2
    assert "not a folder" in capsys.readouterr().err
    assert push_main([str(tmp_path), "--repo-id", "not-a-repo-id"]) == 2


def test_python_files_outside_the_remote_code_are_left_out(folder):
    (folder / "train_my_model.py").write_text("import trl\n")  # a user's script next to the weights
    plan = self_check(folder, load=False)
    assert "train_my_model.py" not in plan.upload
    assert "not remote code" in dict(plan.skipped)["train_my_model.py"]


# --------------------------------------------------------------------------------- branches and re-pushes


def test_push_to_a_branch_leaves_main_alone(hub, tiny_model_dir, tmp_path):
    first = push(tiny_model_dir, "alice/branches", token=ALICE, endpoint=hub.url, check_load=False)
    changed = with_scaled_gain(tiny_model_dir, tmp_path / "changed", 2.0)
    on_dev = push(changed, "alice/branches", revision="dev", token=ALICE, endpoint=hub.url, check_load=False)
    assert on_dev.branch == "dev" and hub.head("alice/branches", "dev").oid == on_dev.card_commit
    assert hub.head("alice/branches").oid == first.card_commit
    assert f'revision = "{on_dev.commit}"' in hub.file_bytes("alice/branches", "README.md", "dev").decode()
    on_dev_weights = hub.file_bytes("alice/branches", "model.safetensors", "dev")
    assert on_dev_weights == (tmp_path / "changed" / "model.safetensors").read_bytes()
    assert hub.file_bytes("alice/branches", "model.safetensors") != on_dev_weights


def test_a_push_replaces_stale_weight_shards(hub, tiny_model, tiny_model_dir, tmp_path):
    sharded = tmp_path / "sharded"
    tiny_model.save_pretrained(sharded, max_shard_size="300KB")
    for name in ("processor_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(os.path.join(tiny_model_dir, name), sharded / name)
    shards = sorted(p.name for p in sharded.glob("*.safetensors"))
    assert len(shards) > 1
    push(sharded, "alice/reshard", token=ALICE, endpoint=hub.url, check_load=False)
    assert set(shards) <= set(hub.head("alice/reshard").files)
    result = push(tiny_model_dir, "alice/reshard", token=ALICE, endpoint=hub.url, check_load=False)
    assert result.deleted == sorted(shards + ["model.safetensors.index.json"])
    files = set(hub.head("alice/reshard").files)
    assert "model.safetensors" in files and not files & set(result.deleted)


# ---------------------------------------------------------------------------------- the load check's isolation


def test_run_without_package_hides_this_installed_package(tmp_path):
    import llava_normaligned  # noqa: F401  (importable here: the fresh process hides it, it is not absent)

    done = run_without_package("import modeling_llava_normaligned", cwd=tmp_path)
    raised = done.stderr.strip().splitlines()[-1]
    assert done.returncode != 0 and raised.startswith("ModuleNotFoundError: "), done.stderr
    assert "'modeling_llava_normaligned'" in raised and "hidden" in raised
    done = run_without_package("""
        import json, sys
        print(json.dumps([sys.flags.isolated, sys.argv[1:]]))
        """, ["an argument"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [1, ["an argument"]]


def test_processor_alone_loads_without_a_prompt_where_the_package_is_absent(tiny_model_dir, tmp_path):
    # AutoTokenizer reads config.json, whose auto_map names our config: the flag the docs give answers its question
    code = f"""
        from transformers import AutoProcessor
        processor = AutoProcessor.from_pretrained({str(tiny_model_dir)!r}, trust_remote_code=True)
        print(type(processor).__name__, processor.image_token)
        """
    done = run_without_package(code, cwd=tmp_path, env={**os.environ, "HF_MODULES_CACHE": str(tmp_path / "mods")},
                               timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["LlavaProcessor", "<image>"]
    assert "custom code" not in done.stdout + done.stderr and "model of type" not in done.stderr
    # without the flag it asks (and with no terminal falls back, warning): what the docs say
    done = run_without_package(code.replace(", trust_remote_code=True", ""), cwd=tmp_path, timeout=120,
                               env={**os.environ, "HF_MODULES_CACHE": str(tmp_path / "mods")})
    assert "Do you wish to run the custom code?" in done.stdout + done.stderr


def with_custom_tokenizer(folder) -> None:
    """Make the folder's tokenizer a class of its own remote code, named by tokenizer_config.json's auto_map only."""
    (folder / "tokenization_custom.py").write_text(
        "from transformers import PreTrainedTokenizerFast\n\n\n"
        "class CustomTokenizer(PreTrainedTokenizerFast):\n    pass\n"
    )
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.update(tokenizer_class="CustomTokenizer", auto_map={"AutoTokenizer": [None, "tokenization_custom.CustomTokenizer"]})
    (folder / "tokenizer_config.json").write_text(json.dumps(config))


def test_load_check_loads_exactly_the_files_to_upload(folder):
    with_custom_tokenizer(folder)
    plan = plan_upload(folder)
    assert "tokenization_custom.py" in plan.upload  # remote code named by the tokenizer's auto_map is uploaded
    assert check_loads(folder, plan.upload).processor_class == "LlavaProcessor"
    # The same folder, with the tokenizer's code left out of the upload: the files in the folder do not save it.
    with pytest.raises(SelfCheckError, match=r"tokenization_custom\.py") as error:
        check_loads(folder, [p for p in plan.upload if p != "tokenization_custom.py"])
    assert str(folder) in str(error.value) and "llava-na-selfcheck" not in str(error.value)


def test_every_auto_map_is_checked(folder):
    with_custom_tokenizer(folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["auto_map"] = {"AutoTokenizer": [None, "tokenization_custom.Missing"]}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(SelfCheckError, match=r"tokenizer_config\.json: .*defines no class Missing"):
        self_check(folder, load=False)
    config["auto_map"] = {"AutoTokenizer": [None, "mallory/tools--tokenization_evil.Evil"]}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(SelfCheckError, match="points into another repo"):
        self_check(folder, load=False)


# ------------------------------------------------------------------------------- what a push must not publish


def test_the_token_scan_reads_every_file_whatever_its_type(folder, monkeypatch):
    (folder / "run.log").write_text(f"step 1\nstep 2\nlogin with {ALICE}\n")
    with pytest.raises(SelfCheckError, match=r"run\.log, line 3: holds what looks like") as error:
        self_check(folder, include=("*.log",), tokens=[], load=False)
    assert ALICE not in str(error.value)
    (folder / "run.log").unlink()
    (folder / "state.dat").write_bytes(b"\x00\x01binary " + BOB.encode() + b"\x00")
    with pytest.raises(SelfCheckError, match=r"state\.dat, byte 9: "):
        self_check(folder, include=("*.dat",), tokens=[], load=False)
    # A token split across two read chunks is still found.
    monkeypatch.setattr(selfcheck, "_SCAN_CHUNK", 16)
    (folder / "state.dat").write_bytes(b"y" * 30 + b" " + BOB.encode() + b" " + b"z" * 100)
    with pytest.raises(SelfCheckError, match=r"state\.dat, line 1"):
        find_secrets([folder / "state.dat"], [])


def test_local_paths_in_uploaded_records_are_refused(folder, capsys):
    (folder / "training_summary.json").write_text(json.dumps(
        {"run": {"argv": ["--data-path", "/home/alice/data/train.json"]}, "data": {"sources": ["data/train.json"]}}
    ))
    (folder / "eval").mkdir()
    (folder / "eval" / "results.md").write_text("| model | score |\n| --- | --- |\n| alice/tiny | 1/2 |\n")
    with pytest.raises(LocalPathError, match=r"training_summary\.json names the local path '/home/alice/data/train"):
        self_check(folder, load=False)
    assert push_main([str(folder), "--repo-id", "alice/paths", "--dry-run", "--skip-load-check"]) == 2
    refused = one_line(capsys.readouterr().err)
    assert "training_summary.json" in refused and "'/home/alice/data/train.json'" in refused and "local path" in refused
    (folder / "training_summary.json").write_text(json.dumps({"run": {"argv": ["--data-path", "train.json"]}}))
    assert "eval/results.md" in self_check(folder, load=False).upload  # relative paths, Hub ids, ratios: not local


def test_a_peft_adapter_folder_is_refused_with_the_way_to_publish_it(tiny_model_dir, tmp_path, capsys):
    from peft import LoraConfig, get_peft_model

    adapter = tmp_path / "lora-run"  # what `train --use_peft` leaves: the adapter and the processor
    model = get_peft_model(LlavaNormAlignedForConditionalGeneration.from_pretrained(tiny_model_dir),
                           LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"]))
    model.save_pretrained(adapter)
    AutoProcessor.from_pretrained(tiny_model_dir).save_pretrained(adapter)
    with pytest.raises(SelfCheckError, match=r"a PEFT adapter .*--merge-adapter"):
        self_check(adapter, load=False)
    assert push_main([str(adapter), "--repo-id", "alice/lora", "--dry-run"]) == 2
    assert "a PEFT adapter" in capsys.readouterr().err
    # With the merged model next to it (--merge-adapter), the message names it, and it passes.
    model.merge_and_unload().save_pretrained(adapter / "merged")
    AutoProcessor.from_pretrained(tiny_model_dir).save_pretrained(adapter / "merged")
    with pytest.raises(SelfCheckError, match=f"{re.escape(str(adapter / 'merged'))} holds the merged model"):
        self_check(adapter, load=False)
    assert "model.safetensors" in self_check(adapter / "merged", load=False).upload


# --------------------------------------------------------------------------- what a failed push leaves behind


def test_a_failed_first_push_deletes_the_repo_it_created(hub, tiny_model_dir):
    hub.fail_next("POST", r"^/api/models/alice/born-failed/commit/main$")
    with pytest.raises(PushError, match=r"nothing was committed \(the repo it had created was deleted again\)"):
        push(tiny_model_dir, "alice/born-failed", token=ALICE, endpoint=hub.url, check_load=False)
    assert "alice/born-failed" not in hub.store.repos
    push(tiny_model_dir, "alice/born-failed", token=ALICE, endpoint=hub.url, check_load=False, pin_card=False)
    assert "alice/born-failed" in hub.store.repos


def test_a_failed_push_to_a_new_branch_deletes_the_branch_and_an_old_branch_stays(hub, tiny_model_dir, tmp_path):
    first = push(tiny_model_dir, "alice/branch-failed", token=ALICE, endpoint=hub.url, check_load=False)
    hub.fail_next("POST", r"/branch-failed/commit/dev$")
    with pytest.raises(PushError, match="the branch 'dev' it had created was deleted again"):
        push(tiny_model_dir, "alice/branch-failed", revision="dev", token=ALICE, endpoint=hub.url, check_load=False)
    repo = hub.store.repos["alice/branch-failed"]
    assert set(repo.branches) == {"main"} and hub.head("alice/branch-failed").oid == first.card_commit
    # Unpinned, the card on a branch names that branch.
    on_dev = push(tiny_model_dir, "alice/branch-failed", revision="dev", token=ALICE, endpoint=hub.url,
                  check_load=False, pin_card=False)
    assert 'revision = "dev"  # a branch' in hub.file_bytes("alice/branch-failed", "README.md", "dev").decode()
    hub.fail_next("POST", r"/branch-failed/commit/dev$")
    changed = with_scaled_gain(tiny_model_dir, tmp_path / "changed", 2.0)
    with pytest.raises(PushError) as error:
        push(changed, "alice/branch-failed", revision="dev", token=ALICE, endpoint=hub.url, check_load=False)
    assert "deleted" not in str(error.value) and hub.head("alice/branch-failed", "dev").oid == on_dev.commit


def push_warnings(caplog) -> list[str]:
    """The warnings ``push`` logged."""
    return [r.getMessage() for r in caplog.records
            if r.name == "llava_normaligned.hub_cards.push" and r.levelno == logging.WARNING]


def test_when_pinning_the_card_fails_the_model_stays_and_a_warning_says_so(hub, tiny_model_dir, caplog):
    hub.fail_next("POST", r"^/api/models/alice/pin-fails/commit/main$", after=1)  # the model commit goes through
    with caplog.at_level(logging.WARNING, logger="llava_normaligned.hub_cards.push"):
        result = push(tiny_model_dir, "alice/pin-fails", token=ALICE, endpoint=hub.url, check_load=False)
    assert result.card_commit is None and hub.head("alice/pin-fails").oid == result.commit
    said = push_warnings(caplog)
    assert len(said) == 1 and result.commit in said[0] and "pinning its card failed" in said[0]
    assert ALICE not in caplog.text
    assert 'revision = "main"  # a branch' in hub.file_bytes("alice/pin-fails", "README.md").decode()


def test_private_does_not_change_an_existing_public_repo_and_says_so(hub, tiny_model_dir, caplog):
    push(tiny_model_dir, "alice/public", token=ALICE, endpoint=hub.url, check_load=False, pin_card=False)
    with caplog.at_level(logging.WARNING, logger="llava_normaligned.hub_cards.push"):
        push(tiny_model_dir, "alice/public", private=True, token=ALICE, endpoint=hub.url, check_load=False,
             pin_card=False)
    said = push_warnings(caplog)
    assert len(said) == 1 and "alice/public" in said[0] and "--private" in said[0] and "is public" in said[0]
    assert hub.store.repos["alice/public"].private is False


# ------------------------------------------------------------------------------------------- pull, reviewed


def test_pull_never_downloads_pickles_and_flags_code_from_other_repos(hub, tiny_model_dir, tmp_path):
    from huggingface_hub import CommitOperationAdd, HfApi

    source = Path(tiny_model_dir)
    config = json.loads((source / "config.json").read_text())
    config["auto_map"]["AutoModel"] = "mallory/tools--modeling_evil.EvilModel"
    files = {"config.json": json.dumps(config).encode(), "weights.BIN": b"pickle", "sub/state.Pt": b"pickle",
             "sub/helper.py": b"HELPER = 1\n"}
    for name in ("model.safetensors", "modeling_llava_normaligned.py", "configuration_llava_normaligned.py"):
        files[name] = (source / name).read_bytes()
    api = HfApi(endpoint=hub.url, token=ALICE)
    api.create_repo("alice/mixed")  # not through `push`, which refuses pickles
    api.create_commit("alice/mixed", [CommitOperationAdd(path_in_repo=p, path_or_fileobj=b) for p, b in files.items()],
                      commit_message="pickles and foreign code")
    result = pull("alice/mixed", local_dir=tmp_path / "pulled", token=ALICE, endpoint=hub.url)
    on_disk = {p.relative_to(tmp_path / "pulled").as_posix() for p in (tmp_path / "pulled").rglob("*")
               if p.is_file() and ".cache" not in p.parts}
    assert sorted(result.skipped_pickles) == ["sub/state.Pt", "weights.BIN"]
    assert not on_disk & {"weights.BIN", "sub/state.Pt"} and "sub/helper.py" in on_disk
    assert ("sub/helper.py", hashlib_sha256(b"HELPER = 1\n"), False) in result.remote_code
    assert ("modeling_llava_normaligned.py" in {name for name, _, same in result.remote_code if same})
    assert result.cross_repo_code == [("config.json", "AutoModel", "mallory/tools--modeling_evil.EvilModel")]
    # The CLI says so (endpoint and token from the environment, read when huggingface_hub is imported).
    cli = subprocess.run(
        [sys.executable, "-m", "llava_normaligned.cli", "pull", "alice/mixed", "--local-dir", str(tmp_path / "cli")],
        cwd=tmp_path, env=client_env(hub, tmp_path / "home", token=ALICE), capture_output=True, text=True, timeout=300,
        check=False, stdin=subprocess.DEVNULL,
    )
    assert cli.returncode == 0, cli.stderr
    out = cli.stdout
    assert "not downloaded: weights.BIN (pickle)" in out and "remote code sub/helper.py" in out
    warned = [line.strip() for line in out.splitlines() if line.strip().startswith("WARNING config.json: ")]
    assert len(warned) == 1 and "another repo" in warned[0], out
    assert re.search(r"auto_map\['(\w+)'\] = '([^']+)'", warned[0]).groups() == result.cross_repo_code[0][1:]


def hashlib_sha256(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def test_lfs_uploads_need_the_url_the_authenticated_batch_call_signs(hub):
    import hashlib

    data = b"weights" * 10
    oid = hashlib.sha256(data).hexdigest()
    url = f"{hub.url}/_lfs/alice/tiny/{oid}"
    with pytest.raises(urllib.error.HTTPError) as error:
        urllib.request.urlopen(urllib.request.Request(url, data=data, method="PUT"))
    assert error.value.code == 403
    signed = f"{url}?signature={hub.lfs_signature('alice/tiny', oid)}"
    with urllib.request.urlopen(urllib.request.Request(signed, data=data, method="PUT")) as response:
        assert response.status == 200
