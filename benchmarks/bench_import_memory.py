"""Peak memory of ``ccpo traces import`` on a large table: streamed vs held in memory.

A synthetic 4-model table (:func:`ccpo.testing.ladder_table.write_ladder_table`; 25,000
questions = 100,000 rows by default) is imported three ways, each in a fresh process whose
peak resident set size (``ru_maxrss`` of the child) is recorded, in interleaved repetitions:

- ``floor``: ``ccpo traces validate`` on the imported trace file (reading every trace once:
  what any command that reads the result costs);
- ``streamed``: ``ccpo traces import`` (the command: rows spill to a temporary SQLite file,
  one question at a time is built and written);
- ``in memory``: :func:`ccpo.traces.importer.import_table`, the library call that returns
  every trace in a list (the shape of the import before it streamed: the whole table held).

Medians over the repetitions and the ratios to the floor are printed. Recorded results:
``benchmarks/results/bench_import_memory.md``.

    .venv/bin/python benchmarks/bench_import_memory.py [--questions 25000] [--reps 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ccpo.testing.ladder_table import write_ladder_table

_PEAK = (
    "import resource, subprocess, sys\n"
    "rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode\n"
    "assert rc == 0, rc\n"
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
)
_IN_MEMORY = (
    "import sys\n"
    "from ccpo.traces.importer import import_table\n"
    "from ccpo.traces.prices import load_prices\n"
    "traces, _ = import_table(sys.argv[1], 'mmlu', load_prices(sys.argv[2]))\n"
    "assert len(traces) > 0\n"
)


def peak_mb(cmd: list[str]) -> tuple[float, float]:
    """Peak RSS (MB) and wall time (s) of ``cmd`` run as the only child of a fresh process."""
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", _PEAK, *cmd], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{cmd[:3]} failed: {out.stderr}")
    return int(out.stdout.strip()) / 1024, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--questions", type=int, default=25_000, help="questions (× 4 rows)")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    ccpo = str(Path(sys.executable).parent / "ccpo")
    with tempfile.TemporaryDirectory() as d:
        table, prices = write_ladder_table(d, n=args.questions, seed=0)
        out = Path(d) / "out.jsonl"
        runs = {
            "floor (validate the output)": [ccpo, "traces", "validate", str(out)],
            "streamed (ccpo traces import)": [
                ccpo,
                "traces",
                "import",
                str(table),
                "--task",
                "mmlu",
                "--prices",
                str(prices),
                "--out",
                str(out),
                "--force",
            ],
            "in memory (import_table)": [sys.executable, "-c", _IN_MEMORY, str(table), str(prices)],
        }
        peak_mb(runs["streamed (ccpo traces import)"])  # the output the floor reads
        got: dict[str, list[tuple[float, float]]] = {k: [] for k in runs}
        for _ in range(args.reps):  # interleaved
            for name, cmd in runs.items():
                got[name].append(peak_mb(cmd))
    floor = statistics.median(m for m, _ in got["floor (validate the output)"])
    print(f"{4 * args.questions} rows ({args.questions} questions), {args.reps} reps, medians")
    for name, vals in got.items():
        mb = statistics.median(m for m, _ in vals)
        s = statistics.median(t for _, t in vals)
        print(f"  {name:32s} peak {mb:7.1f} MB  ({mb / floor:4.2f}× floor)  {s:6.1f} s")


if __name__ == "__main__":
    main()
