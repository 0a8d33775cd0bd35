"""How far a reader walks to follow one training run: ``ccpo train`` → a policy folder.

Runs ``ccpo train`` in this process under :func:`sys.setprofile` and records every call from one
``ccpo`` source file into another (module bodies run at import time are left out: they are
loading, not the pipeline). Two figures:

- **files**: the distinct ``ccpo`` files whose functions the run calls;
- **climbs back**: the run's calls from one file into another, each kept where it first
  happens (a reader reads a function once), in order; a call that does not start in the file
  the previous one entered is a climb back: the reader has to go back up to a file they left
  to find out what happens next. A pipeline written in one place climbs back about once per
  stage; one spread over many files much more.

Also printed: the files entered from the most places.

    .venv/bin/python benchmarks/bench_training_walk.py                  # cstop, answer sets
    .venv/bin/python benchmarks/bench_training_walk.py --method depth-k --answer single --alpha 0.3

Deterministic: it counts calls, not seconds.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import sys
import tempfile
from pathlib import Path

import ccpo

PACKAGE = Path(ccpo.__file__).resolve().parent
TRACES = PACKAGE / "data" / "traces" / "hotpotqa-public.jsonl.gz"


def _short(filename: str) -> str | None:
    try:
        return str(Path(filename).resolve().relative_to(PACKAGE))
    except ValueError:
        return None


def walk(argv: list[str]) -> tuple[set[str], int, list[tuple[str, str]]]:
    """(files called, climbs back, the walk's steps) of ``ccpo <argv>``: each step is a call
    from one ccpo file into another, kept where it first happens (a reader reads a function
    once, however often a loop calls it)."""
    from ccpo.cli import main

    stack: list[str | None] = []  # the ccpo file of each live frame (None: not ccpo)
    steps: dict[tuple[str, str], None] = {}  # (caller file, callee file), first-seen order

    def profile(frame, event, _arg):
        if event == "call":
            here = _short(frame.f_code.co_filename)
            caller = next((f for f in reversed(stack) if f is not None), None)
            crossing = here is not None and caller is not None and here != caller
            if crossing and frame.f_code.co_name != "<module>":
                steps.setdefault((caller, here), None)
            stack.append(here)
        elif event == "return" and stack:
            stack.pop()

    sys.setprofile(profile)
    try:
        code = main(argv)
    finally:
        sys.setprofile(None)
    if code not in (0, None):
        raise SystemExit(f"ccpo {' '.join(argv)} exited {code}")
    path = list(steps)
    files = {f for step in path for f in step}
    # a step that does not start where the last one ended: the reader climbs back up
    climbs = sum(1 for a, b in itertools.pairwise(path) if b[0] != a[1])
    return files, climbs, path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--method", default="cstop")
    ap.add_argument("--answer", default="set", choices=("single", "set"))
    ap.add_argument("--alpha", default="0.1")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "pol")
        argv = ["train", "--traces", str(TRACES), "--method", args.method,
                "--answer", args.answer, "--alpha", args.alpha, "--out", out]  # fmt: skip
        files, climbs, path = walk(argv)
    print(f"ccpo {' '.join(argv[:-2])} --out DIR")
    print(f"files: {len(files)}  steps: {len(path)}  climbs back: {climbs}")
    visits = collections.Counter(b for _a, b in path)
    for name, n in visits.most_common(6):
        print(f"  entered from {n:2d} places: {name}")


if __name__ == "__main__":
    main()
