"""`ccpo compare` trains its policies in worker processes: the rows must not depend on it
(SYNTHETIC data, ccpo.sim)."""

from __future__ import annotations

import json

from rich.console import Console

from ccpo.product.comparison import run_compare


def test_parallel_training_gives_the_same_rows(sim_file, tmp_path):
    rows = {}
    for workers in (1, 3):
        out = tmp_path / f"w{workers}"
        run_compare(
            sim_file,
            out,
            alpha=0.2,
            splits=3,
            steps=8,
            workers=workers,
            console=Console(quiet=True),
        )
        rows[workers] = json.loads((out / "results.json").read_text())["rows"]
    names = [r["policy"] for r in rows[1]]
    assert {"cpo-batch", "ccpo", "ccpo-lam0.0002"} <= set(names)
    assert rows[1] == rows[3]
