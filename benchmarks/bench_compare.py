"""Benchmark: ``ccpo compare`` of every method at 100 splits on 1,400 questions, end to end.

Target: ≤ 60 s on 2 cores. Runs the installed ``ccpo`` command (imports, training of
every RL row in parallel processes, CStop / auto fits, evaluation, tables and plots) as a user
would, on SYNTHETIC traces (``ccpo sim --n 1400``: 1,000 / 200 / 200 splits), and prints the
median wall time of ``--repeats`` runs. Run it on a quiet machine: other work on the two cores
shows up one for one.

    python benchmarks/bench_compare.py [--repeats 3] [--alpha 0.1] [--steps 2000]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from _timing import median_line, timed


def ccpo(*args: str) -> None:
    """One ``ccpo`` command in a fresh process (its stdout dropped); fails loudly."""
    exe = shutil.which("ccpo") or str(Path(sys.executable).with_name("ccpo"))
    done = subprocess.run([exe, *args], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"ccpo {' '.join(args)} failed:\n{done.stderr}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--alpha", type=float, default=0.1)
    ap.add_argument("--steps", type=int, default=2000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        traces = Path(tmp) / "sim.jsonl.gz"
        ccpo("sim", "--n", "1400", "--out", str(traces))
        times = timed(
            lambda r: ccpo(
                "compare",
                "--traces",
                str(traces),
                "--alpha",
                str(args.alpha),
                "--steps",
                str(args.steps),
                "--seed",
                str(r),
                "--out",
                str(Path(tmp) / f"compare-{r}"),
            ),
            args.repeats,
        )
    print(f"compare, 1400 questions, α = {args.alpha:g}, {args.steps} steps: {median_line(times)}")


if __name__ == "__main__":
    main()
