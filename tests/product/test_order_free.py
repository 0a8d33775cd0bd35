"""`ccpo train` does not depend on the line order of its trace file: the same questions shuffled
give the same policy bit for bit, and κ̂ is calibrated on every non-training question. Real bundled
traces (mmlu-public) and SYNTHETIC ones (ccpo.traces.sim)."""

from __future__ import annotations

import gzip
import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ccpo.evaluation.harness import id_order, id_splits, load_episodes, split_sizes
from ccpo.traces.io import read_traces
from tests.helpers.cli import ccpo_ok

BUNDLED = Path(__file__).parents[2] / "src/ccpo/data/traces/mmlu-public.jsonl.gz"


def _shuffled(src: Path, dst: Path, seed: int) -> Path:
    with gzip.open(src, "rt") as fh:
        lines = fh.read().splitlines(keepends=True)
    random.Random(seed).shuffle(lines)
    dst.write_text("".join(lines))
    side = src.with_name(src.name.replace(".jsonl.gz", ".prices.json"))
    dst.with_name(dst.name.replace(".jsonl", ".prices.json")).write_text(side.read_text())
    return dst


def _train(traces: Path, out: Path, *extra: str, spawn: bool = False) -> dict:
    """``ccpo train`` at α = 0.1: in a fresh process (its own hash seed) when ``spawn``, else
    in this one; policy.json."""
    argv = ["train", "--traces", str(traces), "--alpha", "0.1", "--out", str(out), *extra]
    if spawn:
        r = subprocess.run([sys.executable, "-m", "ccpo", *argv], capture_output=True,
                           text=True, timeout=300)  # fmt: skip
        assert r.returncode == 0, r.stderr
    else:
        ccpo_ok(*argv)
    return json.loads((out / "policy.json").read_text())


def _without_file(meta: dict) -> dict:
    """policy.json less what names the file (its name, sha256): the policy itself."""
    prov = {k: v for k, v in meta["provenance"].items() if k not in ("traces", "traces_sha256")}
    return {**meta, "provenance": prov}


def test_id_order_ignores_positions_and_depends_on_the_seed():
    ids = [f"q{i}" for i in range(200)]
    shuffled = ids[::-1]
    a = [ids[i] for i in id_order(ids, 0)]
    b = [shuffled[i] for i in id_order(shuffled, 0)]
    assert a == b
    assert a != [ids[i] for i in id_order(ids, 1)]
    assert sorted(a) == sorted(ids)


def test_shuffled_file_trains_the_same_auto_policy_bit_for_bit(tmp_path):
    """auto with every candidate, CCPO too (30 steps a fold here, to stay fast). The file as
    shipped is trained in a process of its own, the shuffled ones in this one: the policies
    agree across processes too."""
    a = _train(BUNDLED, tmp_path / "a", "--auto-ccpo-steps", "30", spawn=True)
    meta_b = []
    for s in (1, 2):
        f = _shuffled(BUNDLED, tmp_path / f"shuffled{s}.jsonl", s)
        meta_b.append(_train(f, tmp_path / f"b{s}", "--auto-ccpo-steps", "30"))
        assert _without_file(meta_b[-1]) == _without_file(a)  # κ̂, method, choice, figures
        model = next(n for n in ("model.pkl", "weights.npz") if (tmp_path / "a" / n).exists())
        assert (tmp_path / f"b{s}" / model).read_bytes() == (tmp_path / "a" / model).read_bytes()
        sa = json.loads((tmp_path / "a/summary.json").read_text())
        sb = json.loads((tmp_path / f"b{s}/summary.json").read_text())
        for key in ("kappa", "calibration_coverage", "calibration_cost_cents", "auto", "sizes"):
            assert sa[key] == sb[key], key
        assert "ccpo" in sa["auto"]["validation"]
    # κ̂ is calibrated on every question not trained on
    n = len(read_traces(BUNDLED))
    n_train = split_sizes(n)[0]
    assert sa["sizes"] == {"train": n_train, "calibration": n - n_train}


def test_shuffled_file_trains_the_same_ccpo_policy_bit_for_bit(sim_file, tmp_path):
    a = _train(sim_file, tmp_path / "a", "--method", "ccpo", "--steps", "30", spawn=True)
    f = tmp_path / "shuffled.jsonl"
    lines = sim_file.read_text().splitlines(keepends=True)
    random.Random(5).shuffle(lines)
    f.write_text("".join(lines))
    b = _train(f, tmp_path / "b", "--method", "ccpo", "--steps", "30")
    assert _without_file(a) == _without_file(b)
    assert (tmp_path / "a/weights.npz").read_bytes() == (tmp_path / "b/weights.npz").read_bytes()


@pytest.mark.parametrize("seed", [0, 3])
def test_id_splits_pick_the_same_questions_in_any_order(sim_file, tmp_path, seed):
    ep, _ = load_episodes(sim_file)
    rev = ep.subset(np.arange(ep.n)[::-1])
    sizes = split_sizes(ep.n)
    (ea, sa), (eb, sb) = id_splits(ep, sizes, 4, seed), id_splits(rev, sizes, 4, seed)
    assert ea.ids == eb.ids
    np.testing.assert_array_equal(ea.obs, eb.obs)
    for x, y in ((sa.train, sb.train), (sa.cal, sb.cal), (sa.test, sb.test)):
        np.testing.assert_array_equal(x, y)
    for cal, test in zip(sa.cal, sa.test, strict=True):
        assert not set(sa.train) & set(cal) and not set(cal) & set(test)


@pytest.mark.parametrize("method", ["cstop", "ccpo"])
def test_the_python_api_fits_the_same_policy_in_any_order(sim_file, method):
    """``ConformalPolicy.fit`` on the same questions in two orders: the same π on every
    question (bit for bit) and, after calibrating on the same held-out questions, the same
    κ̂ and calibration scores."""
    from ccpo.api import ConformalPolicy
    from ccpo.learning.config import TrainConfig

    traces = read_traces(sim_file)
    train, held = traces[:200], traces[200:]
    shuffled = list(train)
    random.Random(7).shuffle(shuffled)
    cfg = TrainConfig(steps=20, val_every=0)
    a = ConformalPolicy(method, config=cfg).fit(train).calibrate(held)
    b = ConformalPolicy(method, config=cfg).fit(shuffled).calibrate(held[::-1])
    ep, _ = a._episodes(traces)
    assert np.array_equal(a.policy.probs(ep.obs), b.policy.probs(ep.obs))
    assert a.policy.kappa == b.policy.kappa and a.policy.calibration == b.policy.calibration
