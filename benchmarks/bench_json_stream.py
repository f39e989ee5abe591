"""Reading a LLaVA JSON list row by row at the real files' sizes: the package's reader against ijson and json.loads.

    python benchmarks/bench_json_stream.py [--sizes 558128,665298] [--repeats 3] [--json PATH]

Data (``scale_data.py``, generated in code into a temporary folder): LLaVA-558K-shaped rows (558,128: one image, a
brief prompt and a caption) and llava_v1_5_mix665k-shaped rows (665,298: the mixture's sources, multi-turn). Readers,
each in a fresh process that only counts the rows it is handed:

* ``package``: ``trainer.data.iter_json_rows``, the reader ``load_llava_json`` uses;
* ``ijson``: ``ijson.items(handle, "item", use_float=True)`` on its C backend (yajl2_c), the maintained streaming
  parser, as a reader would call it;
* ``json.loads``: the whole file at once, the reference (its peak is the file's bytes and every row's objects);
* ``baseline`` (with ``--baseline FILE``): ``iter_json_rows`` of a Python file, run with ``json``, ``os``, ``re``
  and ``DataError`` defined. The in-house parser that ijson replaced (json's C scanner on 16 MiB pieces) is
  measured this way::

      git show f14cda4:trainer/data.py | sed -n '/^READ_BLOCK = /,/^def _parse_llava_file/p' | sed '$d' > inhouse.py
      python benchmarks/bench_json_stream.py --baseline inhouse.py

Printed per size and reader: the best wall and CPU times of ``--repeats`` runs, rows/s (of the best wall time), the
process's peak RSS (``VmHWM``) and the RSS after imports (what the reading itself added is the difference), and
the CPU-time ratio to ``package`` (on a shared machine CPU time moves less with the load than wall time). The page
cache is warm (the file was just written): this is the parse, not the disk.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import scale_data  # noqa: E402

READERS = ("package", "ijson", "json.loads")
PROBE = r"""
import json, sys, time
def peak_mib():  # VmHWM: this process's peak RSS (ru_maxrss would carry the parent's peak across fork)
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM")) / 1024
reader, path = sys.argv[1], sys.argv[2]
if reader == "baseline":
    import os, re
    space = {"json": json, "os": os, "re": re, "DataError": ValueError, "__name__": "baseline"}
    exec(compile(open(sys.argv[3]).read(), sys.argv[3], "exec"), space)
    read = space.get("iter_json_rows") or space["_iter_json_rows"]  # the reader's earlier, private name too
elif reader == "package":
    from llava_normaligned.trainer.data.llava_json import iter_json_rows as read
elif reader == "ijson":
    import ijson
    assert ijson.backend == "yajl2_c", ijson.backend
    def read(path):
        with open(path, "rb") as handle:
            yield from ijson.items(handle, "item", use_float=True)
else:
    def read(path):
        with open(path, "rb") as handle:
            return json.loads(handle.read())
base = peak_mib()
start, cpu = time.perf_counter(), time.process_time()
count = sum(1 for _ in read(path))
seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
print(json.dumps({"rows": count, "seconds": seconds, "cpu_seconds": cpu, "peak_rss_mib": peak_mib(),
                  "rss_after_imports_mib": base}))
"""


def run_reader(reader: str, path: str, baseline: str | None) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, reader, path, baseline or ""], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(kind: str, n_rows: int, folder: str, repeats: int, baseline: str | None) -> dict:
    path = os.path.join(folder, f"{kind}_{n_rows}.json")
    start = time.perf_counter()
    (scale_data.write_pretrain_json if kind == "pretrain" else scale_data.write_mix_json)(path, n_rows)
    result = {"kind": kind, "rows": n_rows, "file_mib": os.path.getsize(path) / 2**20,
              "generate_seconds": time.perf_counter() - start, "readers": {}}
    readers = READERS + (("baseline",) if baseline else ())
    runs = {reader: [] for reader in readers}
    for _ in range(repeats):  # interleaved, so that a change of the machine's load touches every reader alike
        for reader in readers:
            runs[reader].append(run_reader(reader, path, baseline))
    for reader in readers:
        assert all(r["rows"] == n_rows for r in runs[reader]), (reader, runs[reader])
        best = min(runs[reader], key=lambda r: r["seconds"])
        result["readers"][reader] = {"seconds": best["seconds"], "rows_per_second": n_rows / best["seconds"],
                                     "cpu_seconds": min(r["cpu_seconds"] for r in runs[reader]),
                                     "seconds_all": [r["seconds"] for r in runs[reader]],
                                     "peak_rss_mib": max(r["peak_rss_mib"] for r in runs[reader]),
                                     "rss_after_imports_mib": best["rss_after_imports_mib"]}
    package = result["readers"]["package"]["cpu_seconds"]
    for entry in result["readers"].values():
        entry["cpu_ratio_to_package"] = entry["cpu_seconds"] / package
    os.remove(path)
    return result


def show(result: dict) -> None:
    print(f"\n{result['kind']} x {result['rows']:,} rows ({result['file_mib']:.0f} MiB)")
    print(f"{'reader':<12}{'wall s':>8}{'CPU s':>8}{'rows/s':>10}{'peak RSS MiB':>14}{'after imports':>15}"
          f"{'CPU x package':>15}")
    for name, r in result["readers"].items():
        print(f"{name:<12}{r['seconds']:>8.2f}{r['cpu_seconds']:>8.2f}{r['rows_per_second']:>10,.0f}"
              f"{r['peak_rss_mib']:>14,.0f}{r['rss_after_imports_mib']:>15,.0f}{r['cpu_ratio_to_package']:>15.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default=f"{scale_data.PRETRAIN_ROWS},{scale_data.MIX_ROWS}",
                        help="rows of the LLaVA-558K-shaped file, then of the mix665k-shaped one")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--note", help="what this run measured (kept in the JSON)")
    parser.add_argument("--baseline", help="a Python file defining iter_json_rows(path), measured as 'baseline'")
    args = parser.parse_args(argv)
    import ijson
    from machine import describe

    pretrain, mix = (int(x) for x in args.sizes.split(","))
    results = {"machine": describe(), "ijson": {"version": getattr(ijson, "__version__", None),
                                                "backend": ijson.backend},
               "python": sys.version.split()[0], "command": "python benchmarks/bench_json_stream.py "
               + " ".join(argv if argv is not None else sys.argv[1:]), "note": args.note, "sizes": []}
    print(f"CPU: {results['machine']['cpu']} ({results['machine']['cores']} cores, load "
          f"{results['machine']['load_average']}); ijson {results['ijson']['version']} ({ijson.backend})")
    with tempfile.TemporaryDirectory(prefix="bench_json_stream_") as folder:
        for kind, n_rows in (("pretrain", pretrain), ("mix", mix)):
            result = measure(kind, n_rows, folder, args.repeats, args.baseline)
            results["sizes"].append(result)
            show(result)
    results["load_average_after"] = list(os.getloadavg())
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
