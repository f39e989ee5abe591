"""The hooks into other libraries' private internals (``llava_normaligned/compat.py``): one pin test per hook, run
against the installed library (a release that moves the private name fails here), and the registry itself: every
hook has its pin test, the installed libraries are in the ranges the hooks were checked with, and no other module of
the package touches the private names compat owns."""

from __future__ import annotations

import argparse
import ast
import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from llava_normaligned import compat
from llava_normaligned.compat import HOOKS, REPLACED
from tests.support.layout import source_roots

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DIRS = source_roots()


# ------------------------------------------------------------------------------------------------ transformers


def _trainer_class(**decisions):
    from transformers import Trainer

    class Hooked(compat.TrainerHooks, Trainer):
        def resume_scheduler_only(self, checkpoint):
            return decisions.get("scheduler_only", False)

        def train_sampler(self, dataset):
            order = decisions.get("order")
            return None if order is None else list(order(len(dataset)))

    return Hooked


def _training_args(tmp_path, **kwargs):
    from transformers import TrainingArguments

    return TrainingArguments(output_dir=str(tmp_path / "out"), use_cpu=True, report_to=[], learning_rate=0.1,
                             max_steps=10, save_strategy="no", **kwargs)


def test_trainer_resume_scheduler_only_hook(tmp_path):
    from transformers import Trainer
    from transformers.trainer import OPTIMIZER_NAME, SCHEDULER_NAME

    # the Trainer resumes through the method TrainerHooks overrides
    assert "self._load_optimizer_and_scheduler(" in inspect.getsource(Trainer)
    assert list(inspect.signature(Trainer._load_optimizer_and_scheduler).parameters) == ["self", "checkpoint"]

    model = torch.nn.Linear(2, 2)
    trainer = _trainer_class()(model=model, args=_training_args(tmp_path))
    trainer.create_optimizer_and_scheduler(num_training_steps=10)
    for _ in range(3):
        trainer.optimizer.step()
        trainer.lr_scheduler.step()
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    torch.save(trainer.lr_scheduler.state_dict(), checkpoint / SCHEDULER_NAME)
    (checkpoint / OPTIMIZER_NAME).write_bytes(b"not an optimizer state")  # read only by the Trainer's own path

    resumed = _trainer_class(scheduler_only=True)(model=model, args=_training_args(tmp_path))
    resumed.create_optimizer_and_scheduler(num_training_steps=10)
    assert resumed.lr_scheduler.last_epoch == 0
    resumed._load_optimizer_and_scheduler(str(checkpoint))
    assert resumed.lr_scheduler.last_epoch == 3  # the scheduler alone, from SCHEDULER_NAME

    own = _trainer_class(scheduler_only=False)(model=model, args=_training_args(tmp_path))
    own.create_optimizer_and_scheduler(num_training_steps=10)
    with pytest.raises(Exception):  # noqa: B017 - the Trainer's own path reads the optimizer file, which is not one
        own._load_optimizer_and_scheduler(str(checkpoint))


def test_trainer_train_sampler_hook(tmp_path):
    from datasets import Dataset
    from transformers import Trainer

    assert "self._get_train_sampler" in inspect.getsource(Trainer.get_train_dataloader)
    rows = Dataset.from_dict({"x": list(range(6))})
    args = _training_args(tmp_path, per_device_train_batch_size=2, remove_unused_columns=False)

    def collate(batch):
        return {"x": torch.tensor([row["x"] for row in batch])}

    ordered = _trainer_class(order=lambda n: reversed(range(n)))(
        model=torch.nn.Linear(1, 1), args=args, train_dataset=rows, data_collator=collate)
    assert [int(x) for batch in ordered.get_train_dataloader() for x in batch["x"]] == [5, 4, 3, 2, 1, 0]

    own = _trainer_class()(model=torch.nn.Linear(1, 1), args=args, train_dataset=rows, data_collator=collate)
    assert isinstance(own._get_train_sampler(), torch.utils.data.RandomSampler)  # the Trainer's own


def test_pil_backend_preprocess_hook():
    import numpy as np
    from PIL import Image
    from transformers.image_processing_backends import PilBackend
    from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil

    from llava_normaligned.trainer.collator import PixelTable

    processor = SiglipImageProcessorPil(size={"height": 8, "width": 8})
    assert isinstance(processor, PilBackend) and compat.keeps_pil_backend_steps(processor)

    class OwnSteps(SiglipImageProcessorPil):
        def _preprocess(self, *args, **kwargs):
            return super()._preprocess(*args, **kwargs)

    assert not compat.keeps_pil_backend_steps(OwnSteps(size={"height": 8, "width": 8}))
    assert not compat.keeps_pil_backend_steps(object())
    # where the steps are the backend's, rescale + normalise is exactly the one-table lookup the collator makes
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (8, 8, 3), dtype=np.uint8))
    raw = processor([image], do_rescale=False, do_normalize=False, return_tensors="np")["pixel_values"]
    assert np.array_equal(PixelTable.of(processor)(raw), processor([image], return_tensors="np")["pixel_values"])


def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2)
    return LlamaForCausalLM(config)


def test_attn_implementation_hook():
    model = _tiny_llama()
    for implementation in ("eager", "sdpa"):
        model.set_attn_implementation(implementation)
        assert compat.attn_implementation(model.config) == implementation


ACCELERATE_TWICE = """
import torch
from accelerate import Accelerator
from transformers import LlamaConfig, LlamaForCausalLM

from llava_normaligned import compat

model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=2))
seen = []
model.model.layers[0].register_forward_pre_hook(lambda m, a: seen.append(torch.is_autocast_enabled("cpu")))
ids = torch.tensor([[1, 2, 3]])
first = Accelerator(cpu=True, mixed_precision="bf16").prepare(model)
first(ids)
Accelerator().unwrap_model(first, keep_fp32_wrapper=False)  # as the model is after a Trainer's run: no wrapper
again = Accelerator(cpu=True, mixed_precision="bf16").prepare(model)
again(ids)  # marked as prepared: skipped, no autocast
compat.forget_accelerate_preparation(model)
assert "_is_accelerate_prepared" not in vars(model) and "forward" not in vars(model)
third = Accelerator(cpu=True, mixed_precision="bf16").prepare(model)
third(ids)
print(seen)
"""


def test_accelerate_prepared_model_hook():
    """A model prepared once, its wrapper gone: the next prepare skips it (no autocast) until the hook clears the
    marks. In a process of its own: accelerate's state is one per process."""
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-c", ACCELERATE_TWICE], capture_output=True, text=True, check=True)
    assert result.stdout.split("\n")[-2] == "[True, False, True]", result.stdout + result.stderr


def test_flash_varlen_rows_hook():
    packed = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3]])
    assert compat.flash_varlen_rows(packed, 1) == [(0, 3), (3, 5), (5, 9)]
    assert compat.flash_varlen_rows(torch.arange(5)[None], 1) is None  # one row: the plain path
    assert compat.flash_varlen_rows(packed.expand(2, -1), 2) is None  # a padded batch is never read as packed


def test_no_split_modules_hook():
    assert compat.no_split_modules(_tiny_llama()) == ["LlamaDecoderLayer"]
    assert compat.no_split_modules(torch.nn.Linear(1, 1)) == []


def test_compiled_module_hook():
    linear = torch.nn.Linear(1, 1)
    assert compat.compiled_inner(torch.compile(linear)) is linear
    assert compat.compiled_inner(linear) is None


def test_init_weights_hook():
    model = _tiny_llama()
    layer = model.model.layers[0].mlp.down_proj
    with torch.no_grad():
        layer.weight.fill_(7.0)
    compat.init_module_weights(model, layer)
    std = model.config.initializer_range
    assert layer.weight.abs().max() < 10 * std and layer.weight.std() > std / 2  # redrawn with the model's init


def test_model_hub_hooks(tiny_model_dir):
    """The model's own two hooks (modeling_llava_normaligned/transformers_hooks.py, pushed to the Hub with it),
    pinned here as the package's are."""
    from modeling_llava_normaligned import LlavaNormAlignedForConditionalGeneration
    from modeling_llava_normaligned.transformers_hooks import give_class, loaded_by_from_pretrained

    loaded = LlavaNormAlignedForConditionalGeneration.from_pretrained(tiny_model_dir)
    built = LlavaNormAlignedForConditionalGeneration(loaded.config)
    assert loaded_by_from_pretrained(loaded.get_projector_norm().weight)
    assert not loaded_by_from_pretrained(built.get_projector_norm().weight)

    class Louder(torch.nn.Linear):
        def loud(self):
            return "loud"

    linear = torch.nn.Linear(2, 2)
    give_class(linear, Louder)
    assert isinstance(linear, Louder) and linear.loud() == "loud" and linear.weight.shape == (2, 2)
    with pytest.raises(TypeError):
        give_class(linear, torch.nn.Conv1d)


# --------------------------------------------------------------------------------------------------- deepspeed


def test_callback_handler_order_hook():
    """A callback finds the handler delivering its event and moves itself first, in the middle of that event: every
    callback still gets the event once, and from then on the ones that were before it see what it adds to logs."""
    from transformers import TrainerCallback, TrainerControl, TrainerState
    from transformers.trainer_callback import CallbackHandler

    compat.run_probe("callback_handler_order")

    class Reporter(TrainerCallback):
        def __init__(self):
            self.inits, self.logs = 0, []

        def on_init_end(self, args, state, control, **kwargs):
            self.inits += 1

        def on_log(self, args, state, control, logs=None, **kwargs):
            self.logs.append(dict(logs))

    class Adds(Reporter):
        def on_init_end(self, args, state, control, **kwargs):
            super().on_init_end(args, state, control)
            assert compat.put_callback_first(self)

        def on_log(self, args, state, control, logs=None, **kwargs):
            logs["added"] = 1.0

    before, adds, after = Reporter(), Adds(), Reporter()
    handler = CallbackHandler([before, adds, after], None, None, None, None)
    assert compat.callback_handler_delivering(adds) is None  # no event on the way
    handler.on_init_end(None, TrainerState(), TrainerControl())
    assert handler.callbacks == [adds, before, after]
    assert (before.inits, adds.inits, after.inits) == (1, 1, 1)
    handler.on_log(None, TrainerState(), TrainerControl(), {"loss": 1.0})
    assert before.logs == after.logs == [{"loss": 1.0, "added": 1.0}]


def test_deepspeed_op_off_hook(monkeypatch):
    pytest.importorskip("deepspeed")
    import importlib

    import deepspeed.ops

    from llava_normaligned.trainer.engines import SHM_ALLREDUCE_OP

    backend = importlib.import_module("deepspeed.comm.torch")
    builder = backend.get_accelerator().create_op_builder("ShareMemCommBuilder")
    assert builder is not None and builder.NAME == SHM_ALLREDUCE_OP

    def compile_op(self):
        raise RuntimeError("DeepSpeed would compile the op")

    monkeypatch.setattr(type(builder), "load", compile_op)  # a compile fails fast instead of taking minutes
    monkeypatch.setitem(deepspeed.ops.__compatible_ops__, SHM_ALLREDUCE_OP, True)
    with pytest.raises(RuntimeError, match="would compile"):  # DeepSpeed reads the dict: available, it builds
        backend.build_shm_op()
    assert compat.deepspeed_op_off(SHM_ALLREDUCE_OP) is True
    assert backend.build_shm_op() is None  # marked unavailable: DeepSpeed goes on without it
    assert compat.deepspeed_op_off(SHM_ALLREDUCE_OP) is False


# -------------------------------------------------------------------------------------------------- accelerate


def test_accelerate_distributed_type_hook():
    """In a fresh process (accelerate's state is per process): a later ``AcceleratorState()`` keeps the type the hook
    recorded, where without it the type goes back to the one ``PartialState`` had."""
    code = """
from accelerate import Accelerator
from accelerate.state import AcceleratorState
from accelerate.utils import DistributedType
from llava_normaligned import compat

state = Accelerator(cpu=True).state
before = state.distributed_type
state.distributed_type = DistributedType.FSDP
print(before == DistributedType.FSDP, AcceleratorState().distributed_type == DistributedType.FSDP)
state.distributed_type = DistributedType.FSDP
compat.record_distributed_type(DistributedType.FSDP)
print(AcceleratorState().distributed_type == DistributedType.FSDP)
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT,
                            check=False, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "False", "True"], result.stdout


# ---------------------------------------------------------------------------------------------------- datasets


def test_datasets_indices_hook():
    from datasets import Dataset

    rows = Dataset.from_dict({"x": list(range(5))})
    assert compat.dataset_indices(rows) is None
    selected = rows.select([3, 1, 4])
    assert compat.dataset_indices(selected).column(0).to_pylist() == [3, 1, 4]
    assert selected.data.num_rows == 5  # the mapping is what selects: the table is the whole one


def test_datasets_fingerprint_hook():
    from datasets import Dataset

    rows = Dataset.from_dict({"x": [1, 2]})
    mapped = rows.map(lambda row: {"y": row["x"]}, new_fingerprint="fixed-key")
    assert compat.dataset_fingerprint(mapped) == "fixed-key"
    assert compat.dataset_fingerprint(rows) != "fixed-key"
    first, second = compat.random_fingerprint(), compat.random_fingerprint()
    assert first != second and compat.dataset_fingerprint(
        compat.dataset_over(rows.data, features=rows.features, fingerprint=first)) == first


def test_datasets_table_dataset_hook():
    import pyarrow as pa
    from datasets import Dataset, Features, Image, List, Value

    table = pa.table({"x": pa.array([10, 20, 30], type=pa.int64())})
    rows = compat.dataset_over(table, features=Features({"x": Value("int64")}))
    assert rows["x"] == [10, 20, 30]
    selected = rows.select([2, 0])
    again = compat.dataset_over(selected.data, features=selected.features, split=selected.split,
                                indices=compat.dataset_indices(selected))
    assert again["x"] == [30, 10]
    assert again.data.column("x").chunk(0).buffers()[1].address == table.column("x").chunk(0).buffers()[1].address

    images = Dataset.from_dict({"images": [[{"bytes": b"abc", "path": None}]]},
                               features=Features({"images": List(Image(decode=False))}))
    decoded = compat.dataset_over(images.data, features=Features({"images": List(Image(decode=True))}))
    assert decoded.features["images"].feature.decode and not images.features["images"].feature.decode


def test_datasets_arrow_writer_hook(tmp_path):
    import pyarrow as pa
    from datasets import Dataset, Features, Image, List, Value

    features = Features({"id": Value("string"), "images": List(Image(decode=False))})
    table = pa.table({"id": ["a", "b", "c"],
                      "images": [[{"bytes": None, "path": "one.png"}], [], [{"bytes": b"x", "path": None}]]},
                     schema=features.arrow_schema)
    path = tmp_path / "rows.arrow"
    compat.write_arrow_file(table, features, str(path), writer_batch_size=2)
    loaded = Dataset.from_file(str(path))
    assert loaded.features == features
    assert loaded["id"] == ["a", "b", "c"] and loaded[0]["images"][0]["path"] == "one.png"


# ---------------------------------------------------------------------------------------------------- argparse


def test_argparse_internals_hook():
    class Formatter(compat.DefaultsHelpFormatter):
        def help_states_default(self, action):
            return "(default:" in (action.help or "")

    parser = argparse.ArgumentParser(prog="p", formatter_class=Formatter)
    theirs = parser.add_argument("--theirs", default=1, help="a library's option")
    mine = parser.add_argument("--mine", default=2, help="this package's option (default: two)")
    negation = parser.add_argument("--no-mine", dest="mine", action="store_false", help="turn --mine off")
    assert compat.parser_actions(parser)[1:] == [theirs, mine, negation]  # after -h
    assert compat.is_store_false(negation) and not compat.is_store_false(mine)

    group = parser.add_argument_group("own options")
    options = compat.move_to_group(parser, group, {"mine"})
    options.title = "their options"
    text = parser.format_help()
    own, other = text.index("own options:"), text.index("their options:")
    assert own < text.index("  --mine", own) < other < text.index("  --theirs", other)
    assert "--mine" not in text[other:] and "--theirs" not in text[own:other]
    assert "a library's option (default: 1)" in text  # the formatter's own default
    assert "this package's option (default: two)\n" in text  # stated by the help: printed as written
    assert parser.parse_args(["--mine", "3"]).mine == "3"  # moving changes the help only


# ------------------------------------------------------------------------------------------------------- torch


def test_module_forward_hook():
    layer = torch.nn.Linear(3, 3)
    calls = []
    layer.register_forward_hook(lambda module, args, output: calls.append(output))
    x = torch.randn(2, 3)
    with compat.forwards_replaced([(layer, lambda hidden: hidden)]):
        assert torch.equal(layer(x), x)  # nn.Module.__call__ runs the instance's forward ...
        assert len(calls) == 1  # ... and its hooks
    assert "forward" not in vars(layer)
    assert not torch.equal(layer(x), x)  # the class's forward is back


# --------------------------------------------------------------------------------------------------------- TRL


def test_trl_fused_head_compact_hook(monkeypatch):
    """TRL's fused LM head decides by its module global ``_use_triton`` whether only the labelled positions reach
    its chunked log-prob function: with the hook, on the CPU, only they do; without it, every position."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from trl.trainer import utils

    compat.run_probe("trl_fused_head_compact")
    rows = []
    chunked = utils._ChunkedLogProbFunction

    class Recording(chunked):
        @staticmethod
        def forward(ctx, hidden, *args):
            rows.append(hidden.shape[0])
            return chunked.forward(ctx, hidden, *args)

    monkeypatch.setattr(utils, "_ChunkedLogProbFunction", Recording)
    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2)
    model = LlamaForCausalLM(config)
    utils.add_fused_lm_head(model)
    ids = torch.randint(0, 64, (2, 10))
    labels = ids.clone()
    labels[:, :7] = -100  # tokens 7-9 of each row labelled: 3 positions a row predict them
    with compat.fused_head_compacted_on_cpu():
        compact = model(input_ids=ids, labels=labels, fused_lm_head=True)
    full = model(input_ids=ids, labels=labels, fused_lm_head=True)
    assert rows == [2 * 3, 2 * 9]  # the labelled positions only; every position of (2, 10 - 1)
    torch.testing.assert_close(compact.loss, full.loss)


# -------------------------------------------------------------------------------------------------------- vLLM


VLLM_PIN = """
from vllm.model_executor.models import llava
from llava_normaligned import compat

compat.run_probe("vllm_llava_projector")  # vLLM's LLaVA builds its projector from the module global
original = llava.LlavaMultiModalProjector
factory = lambda **kwargs: kwargs
with compat.vllm_llava_projector_built_as(factory):
    assert llava.LlavaMultiModalProjector is factory
assert llava.LlavaMultiModalProjector is original
print("pinned")
"""


def test_vllm_llava_projector_hook(request):
    """In a Python with vLLM: this one where it has vLLM, else the serving tests' environment (``tests/test_vllm.py``'s
    ``vllm_python``, which skips unless LLAVA_NA_TEST_VLLM=1 or LLAVA_NA_VLLM_PYTHON says where it is)."""
    try:
        import vllm  # noqa: F401

        python = sys.executable
    except ImportError:
        python = str(request.getfixturevalue("vllm_python"))
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    result = subprocess.run([python, "-c", VLLM_PIN], capture_output=True, text=True, timeout=600, cwd=ROOT,
                            env=env, check=False, stdin=subprocess.DEVNULL)
    assert result.returncode == 0 and result.stdout.split()[-1:] == ["pinned"], result.stderr[-3000:]


# -------------------------------------------------------------------------------------------------- the registry


def test_every_hook_has_its_pin_test_and_a_checked_range():
    from packaging.specifiers import SpecifierSet

    here = {name for name, value in globals().items() if name.startswith("test_") and callable(value)}
    for hook in HOOKS.values():
        assert hook.pin_test in here, f"{hook.name}: no pin test {hook.pin_test} in {__file__}"
        assert SpecifierSet(hook.checked), hook.name
        assert callable(getattr(compat, hook.probe)), f"{hook.name}: no probe {hook.probe}"
        assert hook.owns or hook.assigns, f"{hook.name} owns no private name"


@pytest.mark.parametrize("name", sorted(HOOKS))
def test_the_installed_library_is_one_the_hook_was_checked_with(name):
    """A release of a library outside a hook's checked range: the hook's private names must still be there (its
    probe), and the run says which pin test to rerun before ``checked`` is widened. The pin tests above are what
    fails when a release really breaks a hook; a new release alone does not stop the tests."""
    import warnings

    hook = HOOKS[name]
    version = compat.installed_version(hook.library)
    if version is None:
        pytest.skip(f"{hook.library} is not installed")
    if compat.in_checked_range(name):
        return
    getattr(compat, hook.probe)()  # raises where the private names are gone
    warnings.warn(f"{hook.library} {version} is outside {hook.name}'s checked range {hook.checked}: when "
                  f"tests/test_compat.py::{hook.pin_test} passes with it, widen `checked` in llava_normaligned/compat.py",
                  stacklevel=1)


def test_outside_the_checked_range_a_hook_probes_or_fails(monkeypatch, caplog):
    hook = HOOKS["argparse_internals"]
    assert compat.in_checked_range(hook.name, "3.11.7") and not compat.in_checked_range(hook.name, "9.0")
    monkeypatch.setattr(compat, "_seen", set())
    monkeypatch.setattr(compat, "_told", set())
    monkeypatch.setattr(compat, "installed_version", lambda library: "9.0")
    with caplog.at_level("INFO", logger=compat.__name__):
        compat.ensure(hook.name)  # the probe finds argparse's private names: used, and said once
        compat.ensure(hook.name)
    said = [r for r in caplog.records if r.name == compat.__name__]
    assert [r.levelname for r in said] == ["WARNING"], caplog.text
    assert said[0].getMessage() == ("python 9.0 is not a version llava-normaligned was tested with "
                                    "(python>=3.11,<3.12); what it relies on is there, so the run goes on")

    def gone():
        raise AttributeError("no _action_groups")

    monkeypatch.setattr(compat, "_seen", set())
    monkeypatch.setattr(compat, hook.probe, gone)
    with pytest.raises(compat.CompatError, match=r"python 9\.0 lacks .* argparse_internals .* checked with python"):
        compat.ensure(hook.name)


def test_a_newer_library_is_said_once_in_one_line(monkeypatch, caplog):
    """Every transformers hook checks the version when a trainer is made: a user of a newer release reads one line,
    not one per hook."""
    names = [hook.name for hook in HOOKS.values() if hook.library == "transformers"]
    assert len(names) > 1
    monkeypatch.setattr(compat, "_seen", set())
    monkeypatch.setattr(compat, "_told", set())
    real = compat.installed_version
    monkeypatch.setattr(compat, "installed_version", lambda library: "99.0" if library == "transformers" else
                        real(library))
    with caplog.at_level("INFO", logger=compat.__name__):
        for name in names:
            compat.ensure(name)
    said = [r.getMessage() for r in caplog.records if r.name == compat.__name__]
    assert len(said) == 1 and said[0].startswith("transformers 99.0 is not a version"), said


def _package_modules():
    for folder in PACKAGE_DIRS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path != ROOT / "llava_normaligned" / "compat.py":
                yield path


def _uses(tree, owned: set[str], assigned: set[str]):
    """(line, name) of every use in ``tree`` of a name in ``owned``, and every assignment to an attribute in
    ``assigned`` of an object other than ``self``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in owned:
            yield node.lineno, node.attr
        elif isinstance(node, ast.alias) and node.name.rpartition(".")[2] in owned:
            yield node.lineno, node.name
        elif isinstance(node, ast.keyword) and node.arg in owned:
            yield node.value.lineno, f"{node.arg}="
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in owned:
            yield node.lineno, repr(node.value)
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name in owned:
                    yield item.lineno, f"def {item.name} (an override)"
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for target in targets:
                if (isinstance(target, ast.Attribute) and target.attr in assigned
                        and not (isinstance(target.value, ast.Name) and target.value.id == "self")):
                    yield target.lineno, f".{target.attr} assigned"


# transformers' initialisation protocol, which the model's Hub files implement (they run without this package)
MODEL_PROTOCOL = {"_init_weights"}


def test_no_other_module_touches_the_private_names_compat_owns():
    owned = {name for hook in HOOKS.values() for name in hook.owns} | set(REPLACED)
    assigned = {name for hook in HOOKS.values() for name in hook.assigns}
    found = []
    for path in _package_modules():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        names = owned - MODEL_PROTOCOL if path.is_relative_to(ROOT / "modeling_llava_normaligned") else owned
        found += [f"{path.relative_to(ROOT)}:{line}: {what}" for line, what in _uses(tree, names, assigned)]
    assert not found, "private names of other libraries outside llava_normaligned/compat.py:\n" + "\n".join(found)


def test_the_scan_finds_what_it_looks_for():
    """The scan above is not vacuous: each kind of use it checks is found in a module that makes it."""
    source = """
import argparse
from datasets.arrow_writer import ArrowWriter
def f(dataset, parser, module, config):
    order = dataset._indices
    getattr(config, "_attn_implementation", None)
    Dataset(table, indices_table=order)
    module.forward = print
    del module.forward
class T(Trainer):
    def _get_train_sampler(self, train_dataset=None):
        return None
    def setup(self):
        self.forward = None
"""
    owned = {name for hook in HOOKS.values() for name in hook.owns} | set(REPLACED)
    assigned = {name for hook in HOOKS.values() for name in hook.assigns}
    found = sorted(what for _, what in _uses(ast.parse(source), owned, assigned))
    assert found == sorted(["ArrowWriter", "_indices", "'_attn_implementation'",
                            "indices_table=", ".forward assigned", ".forward assigned",
                            "def _get_train_sampler (an override)"])
