"""lmms-eval on this package's model, offline: the plugin, `eval --engine lmms-eval`, and agreement of the two harnesses.

lmms-eval cannot live in the test environment itself: its hard requirement on torchvision pulls a build that does
not import with the CPU torch. It is installed once into a separate virtual environment that sees this one's
packages (``lmms_python``), as docs/evaluation.md tells a CPU user to; every lmms-eval run is a real subprocess on
data sets written into the offline ``datasets`` cache under lmms-eval's own dataset ids (tests/support/eval_fixtures.py).
"""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys
import sysconfig
import time

import pytest

from tests.support.eval_fixtures import answer_table, use_fixed_answers, write_copy, write_lmms_cache
from tests.support.markdown import row_of, table_with

pytestmark = pytest.mark.slow

TASKS = ["pope", "scienceqa_img", "mmstar", "ai2d", "hellaswag"]  # four generation rules, one log-likelihood


def _installed(python: str) -> bool:
    probe = "import lmms_eval, llava_normaligned, torch; assert 'torchvision' not in __import__('sys').modules"
    return subprocess.run([python, "-c", probe], capture_output=True, stdin=subprocess.DEVNULL).returncode == 0


@pytest.fixture(scope="session")
def lmms_python(tmp_path_factory) -> str:
    """A Python with lmms-eval importable and this environment's torch (no torchvision), made once per environment
    the way docs/evaluation.md says (``pip install --no-deps lmms-eval`` + its run-time needs, torch pinned)."""
    from llava_normaligned.evaluation.lmms_engine import CPU_INSTALL

    try:
        import lmms_eval  # noqa: F401

        return sys.executable
    except ImportError:
        pass
    home = os.path.join(sys.prefix, "lmms-eval-env")
    if not os.access(sys.prefix, os.W_OK):
        home = str(tmp_path_factory.mktemp("lmms-eval-env"))
    python = os.path.join(home, "bin", "python")
    if os.path.exists(python) and _installed(python):
        return python
    start = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", "--clear", home], check=True, stdin=subprocess.DEVNULL)
    own = sysconfig.get_paths()
    site_dir = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              capture_output=True, text=True, check=True, stdin=subprocess.DEVNULL).stdout.strip()
    with open(os.path.join(site_dir, "parent-environment.pth"), "w") as f:  # this environment's packages, after its own
        f.write("".join(f"import site; site.addsitedir({p!r})\n" for p in dict.fromkeys([own["purelib"], own["platlib"]])))
    constraints = os.path.join(home, "constraints.txt")
    with open(constraints, "w") as f:
        f.write(CPU_INSTALL["constraints"])
    pip = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-input"]
    for args in (["--no-deps", CPU_INSTALL["lmms_eval"]], ["-c", constraints, *CPU_INSTALL["needs"]]):
        # pip lists lmms-eval's requirements left out (video, audio, API models): noise, unless it fails
        done = subprocess.run(pip + args, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    print(f"\nlmms-eval environment installed in {time.monotonic() - start:.0f} s at {home}")
    assert _installed(python), "lmms-eval environment does not import (or imported torchvision)"
    return python


def _offline_env(hf_home: str) -> dict:
    """This environment offline, every Hugging Face cache under ``hf_home`` (cache settings from outside dropped)."""
    outside = ("HF_DATASETS_CACHE", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "LMMS_EVAL_DATASETS_CACHE",
               "LMMS_LOCAL_CACHE")
    return {**{k: v for k, v in os.environ.items() if k not in outside}, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def _samples(folder, task: str) -> dict[int, dict]:
    (path,) = glob.glob(os.path.join(str(folder), "**", f"*_samples_{task}.jsonl"), recursive=True)
    with open(path, encoding="utf-8") as f:
        return {(s := json.loads(line))["doc_id"]: s for line in f}


def _own_samples(folder, task: str) -> dict[int, dict]:
    with open(os.path.join(str(folder), "samples.jsonl"), encoding="utf-8") as f:
        return {r["row"]: r for r in map(json.loads, f) if r["task"] == task}


REMOTE_FS = """try:
    import lmms_eval.caching.fs_detect as fs_detect
except ImportError:
    pass
else:
    fs_detect.detect_fs_type = lambda path: fs_detect.FsType.REMOTE
"""


def test_engine_lmms_eval_offline_matches_own_harness(lmms_python, tiny_model_dir, tmp_path):
    """One real lmms-eval run (through `eval --engine lmms-eval`) against the package's own harness on the same rows:
    every answer is the same string, every log-likelihood the same number, every score the same; results.md has the
    Table 4 row with deltas against the own harness's run."""
    from llava_normaligned.commands.eval import main

    data_dir, hf_home = tmp_path / "data", tmp_path / "hf"
    for task in TASKS:
        write_copy(task, str(data_dir))
    write_lmms_cache(str(hf_home), TASKS)
    own = tmp_path / "own"
    common = ["--tasks", ",".join(TASKS), "--max-new-tokens", "6", "--batch-size", "4"]
    assert main([tiny_model_dir, *common, "--data-dir", str(data_dir), "--output-dir", str(own)]) == 0
    out = tmp_path / "lmms"
    cli = [lmms_python, "-m", "llava_normaligned.cli", "eval", tiny_model_dir, "--engine", "lmms-eval", *common,
           "--output-dir", str(out), "--baseline", str(own / "results.json"), "--label", "via-lmms"]
    # lmms-eval takes the cache's file system for a network one, as on a cluster's NFS home or a sandbox's 9p mount:
    # it would move its datasets cache to an empty node-local folder, and offline every task would fail
    # (ConnectionError); the engine names the cache datasets reads (lmms_engine.lmms_environment)
    (tmp_path / "remote_fs").mkdir()
    (tmp_path / "remote_fs" / "sitecustomize.py").write_text(REMOTE_FS)
    env = {**_offline_env(hf_home), "PYTHONPATH": str(tmp_path / "remote_fs")}
    run = subprocess.run(cli, capture_output=True, text=True, cwd=tmp_path, env=env, stdin=subprocess.DEVNULL)
    log = (out / "lmms_eval.log").read_text() if (out / "lmms_eval.log").exists() else ""
    assert run.returncode == 0, run.stderr[-3000:] + log[-3000:]

    # lmms-eval's own output: it exits 0 even when a task raises, so its results JSON is the proof
    (raw_path,) = glob.glob(str(out / "lmms_eval" / "**" / "*_results.json"), recursive=True)
    raw = json.load(open(raw_path))["results"]
    for task, key in [("pope", "pope_f1_score,none"), ("pope", "pope_accuracy,none"), ("scienceqa_img", "exact_match,none"),
                      ("mmstar", "average,none"), ("ai2d", "exact_match,flexible-extract"), ("hellaswag", "acc_norm,none")]:
        assert isinstance(raw[task][key], (int, float)), (task, key, raw.get(task))

    ours = json.load(open(own / "results.json"))["tasks"]
    theirs = json.load(open(out / "results.json"))
    assert theirs["engine"] == "lmms-eval" and not theirs["failed_tasks"] and set(theirs["tasks"]) == set(TASKS)
    # same prompts, same decoding: the same answer to every row
    for task in ["pope", "scienceqa_img", "mmstar", "ai2d"]:
        lmms_rows, own_rows = _samples(out, task), _own_samples(own, task)
        assert sorted(lmms_rows) == sorted(own_rows)
        for doc_id, sample in lmms_rows.items():
            prediction = own_rows[doc_id]["prediction"]
            assert sample["input"] == own_rows[doc_id]["prompt"], (task, doc_id)
            if task == "ai2d":  # lmms-eval logs what its filter kept: the letter of a leading "X."
                leading = re.match(r"^\s*([A-Z])\.", prediction)
                prediction = leading.group(1) if leading else prediction
            assert sample["filtered_resps"].strip() == prediction, (task, doc_id)
    for doc_id, sample in _samples(out, "hellaswag").items():
        nll = [float(r[0]) for r in sample["filtered_resps"]]
        assert nll == pytest.approx([-ll for ll in _own_samples(own, "hellaswag")[doc_id]["loglikelihoods"]], abs=1e-3)
    # the same scores, by each one's rule
    assert raw["pope"]["pope_f1_score,none"] * 100 == pytest.approx(ours["pope"]["metrics"]["f1_lmms_eval"])
    assert raw["pope"]["pope_accuracy,none"] * 100 == pytest.approx(ours["pope"]["metrics"]["accuracy"])
    assert raw["scienceqa_img"]["exact_match,none"] * 100 == pytest.approx(ours["scienceqa_img"]["score"])
    l2 = ours["mmstar"]["categories"]["l2_category"]
    assert raw["mmstar"]["average,none"] * 100 == pytest.approx(sum(v["accuracy"] for v in l2.values()) / len(l2))
    assert raw["ai2d"]["exact_match,flexible-extract"] * 100 == pytest.approx(ours["ai2d"]["score"])
    assert raw["hellaswag"]["acc_norm,none"] * 100 == pytest.approx(ours["hellaswag"]["score"])
    assert theirs["tasks"]["hellaswag"]["score"] == pytest.approx(ours["hellaswag"]["score"])
    # the Table 4 layout with the baseline row and deltas
    table = (out / "results.md").read_text()
    assert list(table_with(table, "Method")[0]) == [
        "Model", "Method", "MM-Star", "POPE", "ScienceQA", "AI2D", "HellaSwag", "Avg (5 of 9)"]
    assert row_of(table, "Model", "via-lmms")["Method"] == "w/ Norm (w/ GWC)" and "(+0.00)" in table
    assert "Evaluated by lmms-eval" in table


# lmms-eval's own evaluator on a model that gives fixed answers: its scoring rules, on chosen answers
FIXED_ANSWERS_RUN = """import json
import sys

from lmms_eval import evaluator
from lmms_eval.api.instance import GenerationResult
from lmms_eval.api.model import lmms
from lmms_eval.tasks import TaskManager

answers_path, tasks, out_path = sys.argv[1:4]
with open(answers_path) as f:
    answers = json.load(f)  # {task: [answer per row]}; log-likelihood tasks: [[ll per option] per row]


class FixedAnswers(lmms):
    def generate_until(self, requests):
        return [answers[r.args[4]][r.args[3]] for r in requests]

    def loglikelihood(self, requests):  # one request per option; idx is the option's position
        return [GenerationResult(text=(-answers[r.args[4]][r.args[3]][r.idx], False)) for r in requests]

    def generate_until_multi_round(self, requests):
        raise NotImplementedError


results = evaluator.simple_evaluate(model=FixedAnswers(), tasks=tasks.split(","), batch_size=1,
                                    task_manager=TaskManager("INFO", model_name="fixed_answers"))
with open(out_path, "w") as f:
    json.dump(results["results"], f, default=str)
"""

# Per row of the fixture copies: answers that both rules read the same way, and one ("maybe" to a "yes" question)
# where POPE's headline F1 differs by design (docs/evaluation.md).
FIXED = {
    "pope": ["yes", "no", "no", "yes", "maybe", "no"],  # gold: yes no yes no yes no
    "scienceqa_img": ["A", "B. Europe"],  # gold: A C
    "mmstar": ["A", "B", "D"],  # gold: A B C
    "ai2d": ["B", "C. sun"],  # gold: B A
    "hellaswag": [[-5.0, -4.0, -6.0, -3.0], [-2.0, -1.0, -8.0, -9.0]],  # gold: 3 0; log-likelihood per option
}


def test_scores_agree_on_the_same_answers(lmms_python, tiny_model_dir, tmp_path, monkeypatch):
    """Same rows, same answers: lmms-eval's scoring and the own harness's give the same numbers (the own POPE
    headline, which also counts unparsed answers to "yes" questions as misses, is lower by design)."""
    from llava_normaligned.commands.eval import main

    data_dir, hf_home = tmp_path / "data", tmp_path / "hf"
    for task in TASKS:
        write_copy(task, str(data_dir))
    write_lmms_cache(str(hf_home), TASKS)
    (tmp_path / "answers.json").write_text(json.dumps(FIXED))
    (tmp_path / "fixed.py").write_text(FIXED_ANSWERS_RUN)
    # lmms-eval run directly, as `eval --engine lmms-eval` runs it offline: its datasets cache named (lmms_environment)
    env = {**_offline_env(hf_home), "LMMS_EVAL_DATASETS_CACHE": str(hf_home / "datasets")}
    run = subprocess.run([lmms_python, "fixed.py", "answers.json", ",".join(TASKS), "lmms.json"], cwd=tmp_path,
                         capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL)
    assert run.returncode == 0 and (tmp_path / "lmms.json").exists(), run.stderr[-3000:]
    raw = json.loads((tmp_path / "lmms.json").read_text())

    use_fixed_answers(monkeypatch, answer_table(str(data_dir), FIXED))
    own = tmp_path / "own"
    assert main([tiny_model_dir, "--tasks", ",".join(TASKS), "--data-dir", str(data_dir), "--output-dir", str(own)]) == 0
    ours = json.load(open(own / "results.json"))["tasks"]

    assert raw["pope"]["pope_accuracy,none"] * 100 == pytest.approx(ours["pope"]["metrics"]["accuracy"]) == 50.0
    assert raw["pope"]["pope_f1_score,none"] * 100 == pytest.approx(ours["pope"]["metrics"]["f1_lmms_eval"]) == 50.0
    assert ours["pope"]["score"] == pytest.approx(40.0)  # F1 with "maybe" to a "yes" question as a miss
    assert raw["scienceqa_img"]["exact_match,none"] * 100 == pytest.approx(ours["scienceqa_img"]["score"]) == 50.0
    assert raw["mmstar"]["average,none"] * 100 == pytest.approx(ours["mmstar"]["score"]) == pytest.approx(200 / 3)
    assert raw["ai2d"]["exact_match,flexible-extract"] * 100 == pytest.approx(ours["ai2d"]["score"]) == 50.0
    assert raw["hellaswag"]["acc,none"] * 100 == pytest.approx(ours["hellaswag"]["metrics"]["acc"]) == 50.0
    assert raw["hellaswag"]["acc_norm,none"] * 100 == pytest.approx(ours["hellaswag"]["metrics"]["acc_norm"])


PLUGIN_DIRECT = """
import json, math, sys
from PIL import Image
from lmms_eval.api.instance import Instance
from lmms_eval.api.model import lmms
from lmms_eval.models import get_model
from llava_normaligned.evaluation.lmms_plugin import LlavaNormAligned

registered = get_model("llava_normaligned")  # through the entry point, as `lmms-eval --model llava_normaligned`
assert registered is LlavaNormAligned and issubclass(registered, lmms) and registered.is_simple

try:
    LlavaNormAligned(pretrained=sys.argv[1], bogus=1)
except ValueError as err:
    refused = str(err)
model = LlavaNormAligned(pretrained=sys.argv[1], load_in_4bit="true", batch_size="2", device="cpu")
docs = [{"image": Image.new("RGB", (24, 24), c)} for c in ("red", "blue", "green")] + [{"image": None}]
model.task_dict = {"t": {"test": docs}}
visual = lambda doc: [doc["image"]] if doc["image"] is not None else None
meta = lambda i: {"task": "t", "doc_id": i, "repeats": 1}
kwargs = [{"max_new_tokens": 3, "until": ["\\n"]}, {"max_new_tokens": 2}]
gen = [Instance("generate_until", (f"Question {i}?", kwargs[i % 2], visual, i, "t", "test"), idx=0, metadata=meta(i))
       for i in range(4)]
answers = model.generate_until(gen)
ll = model.loglikelihood([Instance("loglikelihood", ("The sky is", c, visual, 3, "t", "test"), idx=k, metadata=meta(3))
                          for k, c in enumerate([" blue", " green and wide"])])
layer = model.model.model.language_model.layers[0].self_attn.q_proj
print(json.dumps({"refused": refused, "answers": answers, "ll": [list(r.text) for r in ll],
                  "linear": type(layer).__name__}))
"""


def test_plugin_is_registered_and_answers_in_4bit(lmms_python, tiny_model_dir, tmp_path):
    """lmms-eval finds the model through the entry point; the class, called as lmms-eval calls it, answers mixed
    gen_kwargs and text-only rows in batches of 2, 4-bit through the package's loader, and returns log-likelihoods
    as (negative log-probability, greedy) pairs; unknown model_args are refused by name."""
    pytest.importorskip("bitsandbytes")
    (tmp_path / "direct.py").write_text(PLUGIN_DIRECT)
    run = subprocess.run([lmms_python, "direct.py", tiny_model_dir], cwd=tmp_path, capture_output=True, text=True,
                         stdin=subprocess.DEVNULL)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert "unknown model_args ['bogus']" in out["refused"]
    assert len(out["answers"]) == 4 and all(isinstance(a, str) and "\n" not in a for a in out["answers"])
    assert out["linear"] == "Linear4bit"
    assert [len(pair) for pair in out["ll"]] == [2, 2]
    assert all(nll > 0 and isinstance(greedy, bool) for nll, greedy in out["ll"])


SHARED_RULES = """
import json, sys
from PIL import Image
from lmms_eval.api.instance import Instance
from llava_normaligned.evaluation.batches import SampleSink, run_generation
from llava_normaligned.evaluation.data import LoadedSplit
from llava_normaligned.evaluation.loglik import judged, run_loglik
from llava_normaligned.evaluation.lmms_plugin import LlavaNormAligned
from llava_normaligned.evaluation.tasks import TASKS

model_dir, rows_path, out_dir = sys.argv[1:4]
with open(rows_path) as f:
    rows = json.load(f)
plugin = LlavaNormAligned(pretrained=model_dir, batch_size="2", device="cpu", max_new_tokens=6)
meta = lambda i: {"task": "t", "doc_id": i, "repeats": 1}

# generation: the demo's questions, as the own harness asks them and as an lmms-eval task would hand them over
synthetic = [{**r, "image": Image.new("RGB", (24, 24), r["image"])} for r in rows["synthetic"]]
plugin.task_dict = {"t": {"test": synthetic}}
visual = lambda doc: [doc["image"]]
contexts = [r["conversations"][0]["value"] for r in synthetic]
answers = plugin.generate_until([Instance("generate_until", (c, {"max_new_tokens": 6}, visual, i, "t", "test"), idx=0,
                                          metadata=meta(i)) for i, c in enumerate(contexts)])
prompts = [plugin._prompt(c) for c in contexts]
token = plugin.processor.image_token
plugin.processor.image_token = "<|image_pad|>"  # a family whose image token is not LLaVA's tag
other_family = plugin._prompt("<image>\\n<|image_pad|>Which side is it on?")
plugin.processor.image_token = token
sink = SampleSink(out_dir + "/samples.jsonl")
own = run_generation(TASKS["synthetic"], LoadedSplit(synthetic, "local", "t"), plugin.model, plugin.processor, sink,
                     batch_size=2, max_new_tokens=6)

# log-likelihood: MMLU rows, one lmms-eval request per option
mmlu = rows["mmlu"]
requests = [TASKS["mmlu"].build(row, i) for i, row in enumerate(mmlu)]
plugin.task_dict = {"t": {"test": mmlu}}
nll = [r.text[0] for r in plugin.loglikelihood([
    Instance("loglikelihood", (q.context, c, None, i, "t", "test"), idx=k, metadata=meta(i))
    for i, q in enumerate(requests) for k, c in enumerate(q.continuations)])]
own_ll = run_loglik(TASKS["mmlu"], LoadedSplit(mmlu, "local", "t"), plugin.model, plugin.tokenizer, sink, batch_size=2)
sink.close()
per_request, k = [], 0
for q in requests:
    per_request.append([-v for v in nll[k : k + len(q.continuations)]])
    k += len(q.continuations)
plugin_ll = [judged(TASKS["mmlu"], i, q, lls) for i, (q, lls) in enumerate(zip(requests, per_request))]
print(json.dumps({"prompts": prompts, "other_family": other_family, "answers": answers, "own": own,
                  "own_ll": own_ll, "plugin_ll": plugin_ll}, default=str))
"""


def test_plugin_and_runner_share_the_rules(lmms_python, tiny_model_dir, tmp_path):
    """The plugin, called as lmms-eval calls it, and the own harness on the same rows: the same prompt text (also for
    the inputs where the plugin's earlier rule differed: a question with outer white space, LLaVA's tag beside
    another family's image token), the same answers, extracted and judged by the same rules to the same records and
    score; for log-likelihoods the same numbers, choices and score."""
    from llava_normaligned.evaluation.extraction import normalize_answer
    from llava_normaligned.evaluation.tasks import TASKS
    from tests.support import eval_fixtures

    questions = ["<image>\nWhat colour is the shape?", "What shape is it?\n<image>", "  How many shapes are there?\n",
                 "<image>\nIs it on the left?"]
    synthetic = [{"id": f"s{i}", "image": colour, "template": template,
                  "conversations": [{"from": "human", "value": q}, {"from": "gpt", "value": gold}]}
                 for i, (q, colour, template, gold) in enumerate(zip(
                     questions, ["red", "blue", "green", "red"], ["colour", "shape", "count", "position"],
                     ["red", "square", "1", "yes"]))]
    (tmp_path / "rows.json").write_text(json.dumps({"synthetic": synthetic, "mmlu": eval_fixtures.mmlu_rows()[:3]}))
    (tmp_path / "shared.py").write_text(SHARED_RULES)
    run = subprocess.run([lmms_python, "shared.py", tiny_model_dir, "rows.json", str(tmp_path)], cwd=tmp_path,
                         capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])

    assert out["prompts"] == [r["prompt"] for r in out["own"]] == [
        "What colour is the shape?", "What shape is it?", "How many shapes are there?", "Is it on the left?"]
    assert out["other_family"] == "Which side is it on?"
    spec = TASKS["synthetic"]
    requests = {r["row"]: spec.build({**row, "image": None}, i) for i, (r, row) in enumerate(zip(out["own"], synthetic))}
    assert out["answers"] == [r["prediction"] for r in out["own"]]
    plugin_records = []
    for i, answer in enumerate(out["answers"]):
        extracted = spec.extract(answer, requests[i])
        plugin_records.append({**out["own"][i], "extracted": extracted,
                               "correct": spec.judge(extracted, answer, requests[i])})
        assert (extracted, plugin_records[-1]["correct"]) == (out["own"][i]["extracted"], out["own"][i]["correct"])
        assert plugin_records[-1]["correct"] == (normalize_answer(answer) == normalize_answer(requests[i].gold) != "")
    assert spec.score(plugin_records) == spec.score(out["own"])

    for own, theirs in zip(out["own_ll"], out["plugin_ll"]):
        assert theirs["loglikelihoods"] == pytest.approx(own["loglikelihoods"], abs=1e-4)
        assert (theirs["extracted"], theirs["correct"]) == (own["extracted"], own["correct"])
    assert TASKS["mmlu"].score(out["plugin_ll"]) == TASKS["mmlu"].score(out["own_ll"])
