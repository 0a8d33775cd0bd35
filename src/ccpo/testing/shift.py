"""A distribution shift on bundled real data, for tests and benchmarks: ``mmlu-public``'s 57
subjects split by how often round 1's base model answers them right, the easier half to train
on and the harder half to serve (``ccpo check``, ``benchmarks/bench_shift.py``)."""

from __future__ import annotations

import shutil
from collections import defaultdict
from pathlib import Path

from ccpo.traces.io import read_traces, write_traces

BUNDLED = Path(__file__).parents[1] / "data" / "traces" / "mmlu-public.jsonl.gz"


def subject_shift(out: Path, src: Path = BUNDLED) -> tuple[Path, Path]:
    """Write ``out/easy.jsonl`` (the subjects of higher round-1 base accuracy, half of them)
    and ``out/hard.jsonl`` (the others), each with the set's prices beside it; returns both.
    Ties in accuracy are broken by subject name, so the split is fixed."""
    by: dict[str, list] = defaultdict(list)
    for tr in read_traces(src):
        by[tr.meta["subject"]].append(tr)
    acc = {s: sum(t.rounds[0].base.correct for t in v) / len(v) for s, v in by.items()}
    order = sorted(by, key=lambda s: (acc[s], s))
    half = len(order) // 2
    out.mkdir(parents=True, exist_ok=True)
    prices = src.with_name(src.name.replace(".jsonl.gz", ".prices.json"))
    paths = []
    for name, subjects in (("easy", order[half:]), ("hard", order[:half])):
        path = out / f"{name}.jsonl"
        write_traces(path, [t for s in subjects for t in by[s]])
        shutil.copy(prices, out / f"{name}.prices.json")
        paths.append(path)
    return paths[0], paths[1]
