"""results.json and results.md: scores per task and category, in the layout of the paper's Table 4.

results.json is rewritten (atomically) after every task, so an interrupted run keeps every finished task.
results.md has one row per model: the baseline (``--baseline RESULTS.json`` from an earlier run) and this model,
with the delta to the baseline in parentheses, as Table 4 prints them, and the average over the paper's
benchmarks (Table 4's "Avg" is the plain mean of its nine columns). Both rows' Avg are over the same benchmarks,
this model's: a baseline that lacks one of them gets no Avg. A score that counts samples which raised errors (as
wrong) is marked with a dagger; a task that failed (over the error threshold, or raising) reads "failed" and is
not in the Avg.
"""

from __future__ import annotations

import json
import math
import os
from datetime import datetime, timezone

from ..atomic_files import write_json_atomic, write_text_atomic
from ..local_paths import public_record
from .tasks import PAPER_TASKS, TASKS

RESULTS_FORMAT = "llava-normaligned-eval/2"
ERROR_MARK = "†"


class BaselineError(ValueError):
    pass


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def average(results: dict, over: list[str] | None = None) -> dict:
    """Mean headline score over the paper's benchmarks present in ``results`` (Table 4's "Avg"), or over exactly the
    benchmarks ``over`` (score None when one of them is missing)."""
    tasks = results.get("tasks", {})
    names = [n for n in PAPER_TASKS if n in tasks] if over is None else list(over)
    scores = [tasks[n]["score"] for n in names if n in tasks]
    return {
        "score": sum(scores) / len(scores) if scores and len(scores) == len(names) else None,
        "tasks": names,
        "complete": len(names) == len(PAPER_TASKS),
        "with_errors": any(tasks.get(n, {}).get("n_errors") for n in names),
    }


def load_baseline(path: str) -> dict:
    """A results.json of an earlier run, checked enough to be compared with."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as exc:
        raise BaselineError(f"--baseline {path}: cannot read it ({exc})") from exc
    except json.JSONDecodeError as exc:
        raise BaselineError(f"--baseline {path}: not JSON ({exc})") from exc
    tasks = data.get("tasks") if isinstance(data, dict) else None
    if not isinstance(tasks, dict) or not tasks:
        raise BaselineError(f"--baseline {path}: expected a results.json written by `llava-normaligned eval` "
                            "(an object with a non-empty 'tasks' mapping)")
    for name, entry in tasks.items():
        score = entry.get("score") if isinstance(entry, dict) else None
        if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
            raise BaselineError(f"--baseline {path}: task {name!r} has no numeric 'score'")
    return data


# ---- Markdown in the Table 4 layout ----
def _columns(results: dict, baseline: dict | None) -> list[str]:
    present = set(results.get("tasks", {})) | set(results.get("failed_tasks") or {}) | set((baseline or {}).get("tasks", {}))
    return [name for name in TASKS if name in present]


def _cell(score: float | None, reference: float | None, with_errors: bool = False) -> str:
    if score is None:
        return "–"
    mark = ERROR_MARK if with_errors else ""
    if reference is None:
        return f"{score:.2f}{mark}"
    return f"{score:.2f}{mark} ({score - reference:+.2f})"


def _row(results: dict, columns: list[str], avg_over: list[str], reference: dict | None) -> list[str]:
    """One model's cells; its Avg is over ``avg_over`` (the evaluated model's benchmarks, whichever row this is)."""
    tasks = results.get("tasks", {})
    ref_tasks = (reference or {}).get("tasks", {})
    cells = [results.get("label") or results.get("model", "?"), results.get("method") or ""]
    paper_cols = [c for c in columns if TASKS[c].in_paper]
    for name in columns:
        entry = tasks.get(name, {})
        ref = ref_tasks.get(name, {}).get("score") if reference else None
        failed = name in (results.get("failed_tasks") or {})  # no score: the reason is listed under the table
        cells.append("failed" if failed else _cell(entry.get("score"), ref, bool(entry.get("n_errors"))))
        if paper_cols and name == paper_cols[-1]:
            avg = average(results, avg_over)
            ref_avg = average(reference, avg_over)["score"] if reference else None
            cells.append(_cell(avg["score"], ref_avg, avg["with_errors"]))
    return cells


def table_markdown(results: dict, baseline: dict | None = None) -> str:
    """The Table 4 layout: Model | Method | the benchmarks in the paper's order | Avg | extra tasks."""
    columns = _columns(results, baseline)
    paper_cols = [c for c in columns if TASKS[c].in_paper]
    avg_over = average(results)["tasks"]
    header = ["Model", "Method"]
    for name in columns:
        header.append(TASKS[name].column)
        if paper_cols and name == paper_cols[-1]:
            n = len(avg_over)
            header.append("Avg" if n == len(PAPER_TASKS) else f"Avg ({n} of {len(PAPER_TASKS)})")
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(["---", "---"] + ["---:"] * (len(header) - 2)) + " |"]
    rows = ([_row(baseline, columns, avg_over, None)] if baseline is not None else []) + [
        _row(results, columns, avg_over, baseline)
    ]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    if any(ERROR_MARK in cell for cells in rows for cell in cells[2:]):
        footnote = (f"{ERROR_MARK} counts samples that raised errors as wrong (`n_errors` in results.json; the "
                    "errors are in samples.jsonl).")
        lines += ["", footnote]
    return "\n".join(lines)


def _metric_note(name: str, entry: dict) -> str:
    spec = TASKS.get(name)
    extra = []
    if entry.get("n_errors"):
        extra.append(f"{entry['n_errors']} sample errors (scored wrong)")
    if entry.get("n_unparsed"):
        extra.append(f"{entry['n_unparsed']} unparsed answers")
    detail = f" {'; '.join(extra)}." if extra else ""
    notes = entry.get("notes") or (spec.notes if spec else "")  # the engine's own rule (lmms-eval's) when it says
    return f"- **{spec.column if spec else name}**: {entry.get('metric')} on {entry.get('n')} samples. {notes}{detail}"


def _category_tables(name: str, entry: dict, max_rows: int = 20) -> list[str]:
    out = []
    for key, groups in (entry.get("categories") or {}).items():
        if not groups or len(groups) > max_rows:
            continue
        out += [f"\n{TASKS[name].column if name in TASKS else name}, per {key}:\n", "| | score | n |", "| --- | ---: | ---: |"]
        for value, metrics in groups.items():
            score = metrics.get(entry.get("metric"), metrics.get("accuracy"))
            out.append(f"| {value} | {score:.2f} | {metrics.get('n')} |")
    return out


def render_markdown(results: dict, baseline: dict | None = None) -> str:
    """results.md: the table, what each number is, and the per-category scores."""
    lines = [f"# Evaluation: {results.get('label') or results.get('model')}", ""]
    settings = results.get("settings", {})
    if settings.get("limit"):
        lines += [f"> Smoke run: the first {settings['limit']} samples of each benchmark (`--limit`); not comparable "
                  "with the paper's numbers.", ""]
    if results.get("status") != "complete":
        lines += [f"> Status: {results.get('status')} (tasks still to run: {', '.join(results.get('pending', [])) or 'none'}).", ""]
    lines += [table_markdown(results, baseline), ""]
    if baseline is not None:
        lines += [f"Deltas are against {baseline.get('label') or baseline.get('model')} (`--baseline`).", ""]
    avg = average(results)
    if avg["tasks"] and not avg["complete"]:
        lines += [f"Avg is the mean over the {len(avg['tasks'])} of Table 4's {len(PAPER_TASKS)} benchmarks run here"
                  + (", for the baseline too (– where it lacks one of them)." if baseline is not None else "."), ""]
    engine = " Evaluated by lmms-eval (`--engine lmms-eval`)." if results.get("engine") == "lmms-eval" else ""
    lines += [f"Scores are percentages; greedy decoding.{engine}", ""]
    lines += [_metric_note(name, entry) for name, entry in results.get("tasks", {}).items()]
    for name, error in (results.get("failed_tasks") or {}).items():
        lines.append(f"- **{name}**: failed: {error}")
    for name, entry in results.get("tasks", {}).items():
        lines += _category_tables(name, entry)
    return "\n".join(lines) + "\n"


class ResultsWriter:
    """Holds the run's results and rewrites results.json and results.md after each task."""

    def __init__(self, output_dir: str, header: dict, pending: list[str], baseline: dict | None = None):
        self.json_path = os.path.join(output_dir, "results.json")
        self.md_path = os.path.join(output_dir, "results.md")
        self.baseline = baseline
        self.results = {
            "format": RESULTS_FORMAT,
            **header,
            "started_at": now(),
            "status": "running",
            "pending": list(pending),
            "tasks": {},
            "failed_tasks": {},
        }
        self.flush()

    def task_done(self, name: str, entry: dict) -> None:
        self.results["tasks"][name] = entry
        self._finish(name)

    def task_failed(self, name: str, error: str) -> None:
        self.results["failed_tasks"][name] = error
        self._finish(name)

    def _finish(self, name: str) -> None:
        if name in self.results["pending"]:
            self.results["pending"].remove(name)
        self.flush()

    def close(self) -> None:
        self.results["status"] = "complete" if not self.results["failed_tasks"] else "complete_with_failures"
        self.flush()

    def flush(self) -> None:
        self.results["updated_at"] = now()
        self.results["average"] = average(self.results)
        published = public_record(self.results)  # what the header did not name: error messages
        write_json_atomic(self.json_path, published, fsync=True, indent=2, ensure_ascii=False, default=str)
        write_text_atomic(self.md_path, render_markdown(published, public_record(self.baseline)))
