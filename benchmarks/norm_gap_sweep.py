"""The demo over a range of norm gaps, in one command: how the rows compare as the image tokens enter the LLM at 1x
to 70x its text norm before training (``demo --norm-gap``; the paper's LLaVA: about 40x).

    python benchmarks/norm_gap_sweep.py --output-dir gap_sweep --text-model smollm2-135m-offline
    python benchmarks/norm_gap_sweep.py --output-dir gap_sweep_quick --quick       # the tiny LLM, minutes

Each gap is one demo run (``llava_normaligned.demo.run.run_demo``) in ``OUTPUT_DIR/gap_<X>``, reused when finished,
as the demo reuses its own folders. ``OUTPUT_DIR/sweep.json`` and ``sweep.md`` then give, per gap: the gap measured
at init (w/o Norm's image tokens over T), each row's real-image average accuracy (mean ± 95% interval over seeds),
the paired difference of target init + GWC to w/o Norm with the smallest difference the run could detect at 80%
power, and, with a real LLM, the text-alone KL from the original LLM.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys


def sweep_rows(results_by_gap: dict[float, dict]) -> list[dict]:
    """One summary per gap from each run's ``results.json``."""
    from llava_normaligned.demo.results_text import detectable

    out = []
    for gap, results in sorted(results_by_gap.items()):
        rows = {r["key"]: r for r in results["rows"]}
        entry = {"gap": gap, "measured_gap_at_init": rows["no_norm"]["norm_ratio"]["init"], "rows": {}}
        for key, row in rows.items():
            paired = (row.get("paired_to_baseline") or {}).get("real", {}).get("avg")
            entry["rows"][key] = {
                "name": row["name"], "real_avg": row["accuracy_interval"]["real"]["avg"],
                "paired_to_no_norm": paired, "detectable": None if paired is None else detectable(paired),
                "text_kl": row.get("text_kl_interval"), "ratio_after_stage2": row["norm_ratio"].get("after_stage2")}
        out.append(entry)
    return out


def _cell(entry: dict | None, signed: bool = False) -> str:
    if not entry:
        return ""
    mean = f"{entry['mean']:+.3f}" if signed else f"{entry['mean']:.3f}"
    return mean if entry.get("half_width") is None else f"{mean} ± {entry['half_width']:.3f}"


def sweep_markdown(summary: list[dict]) -> str:
    keys = list(summary[0]["rows"])
    names = [summary[0]["rows"][k]["name"] for k in keys]
    lines = ["Real-image average accuracy, mean ± 95% interval over seeds, per gap (w/o Norm's image tokens at the "
             "LLM input over T, measured at init):", "",
             "| gap asked | gap at init | " + " | ".join(names) + " |", "| --- | --- |" + " --- |" * len(keys)]
    for entry in summary:
        lines.append(f"| {entry['gap']:g} | {entry['measured_gap_at_init']:.1f} | "
                     + " | ".join(_cell(entry["rows"][k]["real_avg"]) for k in keys) + " |")
    lines += ["", "Paired difference to w/o Norm (real-image average) and the smallest difference detectable at 80% "
              "power:", "", "| gap | " + " | ".join(names[1:]) + " |", "| --- |" + " --- |" * (len(keys) - 1)]
    for entry in summary:
        cells = []
        for key in keys[1:]:
            row = entry["rows"][key]
            detect = "" if row["detectable"] is None else f" (detects {row['detectable']:.3f})"
            cells.append(_cell(row["paired_to_no_norm"], signed=True) + detect)
        lines.append(f"| {entry['gap']:g} | " + " | ".join(cells) + " |")
    if any(entry["rows"][k]["text_kl"] for entry in summary for k in keys):
        lines += ["", "Text alone, KL per token from the original LLM:", "",
                  "| gap | " + " | ".join(names) + " |", "| --- |" + " --- |" * len(keys)]
        for entry in summary:
            lines.append(f"| {entry['gap']:g} | " + " | ".join(_cell(entry["rows"][k]["text_kl"]) for k in keys) + " |")
    return "\n".join(lines) + "\n"


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--gaps", type=float, nargs="+", default=[1.0, 5.0, 20.0, 40.0, 70.0])
    parser.add_argument("--text-model", default=None, help="as demo --text-model (default: the tiny LLM)")
    parser.add_argument("--quick", action="store_true", help="the demo's --quick sizes")
    parser.add_argument("--rows", default=None, help="as demo --rows")
    parser.add_argument("--seeds", type=int, default=None, help="as demo --seeds")
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--no-progress", action="store_true")
    return parser


def main(argv: list[str] | None = None) -> int:
    from llava_normaligned.commands.demo import config_from_args
    from llava_normaligned.commands.demo import make_parser as demo_parser
    from llava_normaligned.demo.run import run_demo

    opts = make_parser().parse_args(argv)
    if any(gap <= 0 for gap in opts.gaps):
        print(f"--gaps: every gap must be positive, got {opts.gaps}", file=sys.stderr)
        return 2
    demo_argv = ["--output-dir", opts.output_dir]
    for flag, value in (("--text-model", opts.text_model), ("--rows", opts.rows), ("--seeds", opts.seeds)):
        if value is not None:
            demo_argv += [flag, str(value)]
    if opts.quick:
        demo_argv.append("--quick")
    base = config_from_args(demo_parser().parse_args(demo_argv))
    results = {}
    for gap in opts.gaps:
        folder = os.path.join(opts.output_dir, f"gap_{gap:g}")
        print(f"norm gap {gap:g}: {folder}", flush=True)
        results[gap] = run_demo(folder, dataclasses.replace(base, norm_gap=gap), progress=not opts.no_progress,
                                workers=opts.workers)
    from llava_normaligned.atomic_files import write_json_atomic, write_text_atomic

    summary = sweep_rows(results)
    command = "python benchmarks/norm_gap_sweep.py " + " ".join(argv if argv is not None else sys.argv[1:])
    write_json_atomic(os.path.join(opts.output_dir, "sweep.json"), {"command": command, "gaps": summary}, indent=1)
    text = sweep_markdown(summary)
    write_text_atomic(os.path.join(opts.output_dir, "sweep.md"), text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
