"""The arguments every policy-quality benchmark shares: which sets, α and seeds to sweep."""

from __future__ import annotations

import argparse


def sweep_parser(description: str) -> argparse.ArgumentParser:
    """--data (bundled name or trace file, repeatable; default every bundled set), --alpha
    (repeatable; default 0.05, 0.1, 0.2), --seeds (5) and --splits (100)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--data", action="append", help="bundled set name or trace file [all]")
    ap.add_argument("--alpha", type=float, action="append")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--splits", type=int, default=100)
    return ap


ALPHAS = (0.05, 0.1, 0.2)
