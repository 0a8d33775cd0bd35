"""The result files of ``evaluate`` and ``compare``: results.json, results.md, results.csv.

``results.json`` follows docs/design.md ("Results file"): ``{"schema": "ccpo.results/v1", "traces",
"alpha", "splits", "seed", "rows": [...]}``; each row has the paper's columns plus per-split
lists. ``results.md`` is a :class:`~ccpo.report.document.Doc` (the saving, the table of
:mod:`ccpo.report.tables`, notes, the prices used); the box plots come from
:mod:`ccpo.report.plots`. :func:`write_results` writes them all or none
(:func:`staged_folder`, also used for policy folders).
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ccpo import __version__
from ccpo.evaluation.harness import ResultRow
from ccpo.report.document import Doc
from ccpo.report.money import MONEY_NOTE, money_table
from ccpo.report.plots import box_plots
from ccpo.report.tables import refusal_notes, results_table, saving_line
from ccpo.traces.labels import GOLD

RESULTS_SCHEMA = "ccpo.results/v1"
COLUMNS = ("Policy", "Cost (cents)", "Coverage", "Avg. Len.", "Set Size")
"""Columns of ``results.csv`` (a machine-readable file: fixed names, no units in them)."""


def results_document(rows: Sequence[ResultRow], **meta: Any) -> dict[str, Any]:
    """The ``results.json`` object."""
    return {
        "schema": RESULTS_SCHEMA,
        **meta,
        "ccpo_version": __version__,
        "rows": [r.to_json() for r in rows],
    }


@contextlib.contextmanager
def staged_folder(out: Path) -> Iterator[Path]:
    """A fresh hidden sibling folder of ``out`` to write files into; when the block ends
    without error they move into ``out`` (made if need be; files of the same names replaced),
    and the sibling goes in every case. A failed write (a full disk) so leaves ``out`` as it
    was, with no half-made files; it is raised as an :class:`OSError` naming the file in
    ``out``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
    try:
        try:
            yield tmp
        except OSError as e:
            where = out / Path(e.filename).name if e.filename else out
            raise OSError(e.errno, e.strerror or str(e), str(where)) from None
        out.mkdir(exist_ok=True)
        for f in sorted(tmp.iterdir(), key=lambda f: f.name == "policy.json"):  # it last
            os.replace(f, out / f.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_results(
    out: Path, rows: Sequence[ResultRow], alpha: float, title: str = "", **meta: Any
) -> dict[str, Path]:
    """Write results.json, results.md, results.csv and the two box plots into ``out`` (all or
    none of them: see :func:`staged_folder`); returns their paths."""
    out = Path(out)
    with staged_folder(out) as tmp:
        files = _write_results(tmp, rows, alpha, title, **meta)
    return {k: out / p.name for k, p in files.items()}


def _write_results(
    out: Path, rows: Sequence[ResultRow], alpha: float, title: str = "", **meta: Any
) -> dict[str, Path]:
    doc = results_document(rows, alpha=alpha, **meta)
    files = {"json": out / "results.json", "md": out / "results.md", "csv": out / "results.csv"}
    files["json"].write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    head = f"{title} (α = {alpha:g}, {meta.get('splits', '?')} splits)".strip()
    n_test = (meta.get("sizes") or {}).get("test")
    labels = meta.get("against", GOLD)
    md = Doc(out)
    if meta.get("simulated"):
        md.para(f"**Simulated:** {meta['simulated']}.")
    saving = saving_line(rows, alpha, labels)
    if saving:
        md.para(f"**Cheapest at the target:** {saving}")
    md.table(results_table(rows, head, alpha, n_test, labels))
    md.bullets(refusal_notes(rows))
    money = money_table(rows, n_test)
    if money.rows:
        md.para(MONEY_NOTE)
        md.table(money)
    if meta.get("prices"):
        md.para("**Prices used** (USD per million input / output tokens):")
        md.bullets(price_items(meta["prices"]))
    files["md"].write_text(md.markdown(), encoding="utf-8")
    with open(files["csv"], "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(COLUMNS)
        for r in rows:
            w.writerow([r.policy, r.cost_cents, r.coverage, r.avg_len, r.set_size])
    if rows:
        cov_png, cost_png = box_plots(rows, alpha, out, title)
        files["box_coverage"], files["box_cost"] = cov_png, cost_png
    return files


def price_items(prices: dict[str, Any]) -> list[str]:
    """The price table the figures use, one line per model: USD per million input / output
    tokens, with its source (which names any stand-in price)."""
    return [
        f"{m}: {p['input_usd_per_mtok']:g} / {p['output_usd_per_mtok']:g}"
        + (f" — {p['source']}" if p.get("source") else "")
        for m, p in prices.items()
    ]
