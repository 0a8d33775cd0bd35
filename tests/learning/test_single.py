"""Single-answer policies (ccpo.policies.single): Learn-then-Test calibration, its coverage on
held-out splits (a bundled set with gold labels, and the same set made label-free by agreement
with its strongest model), the refusal, one rollout for replay and the live decision, and the
empty answer that never joins a set."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
from scipy.stats import binom

from ccpo.api import ConformalPolicy
from ccpo.evaluation.harness import make_splits, prices_for
from ccpo.policies.registry import fit_policy
from ccpo.policies.single import (
    RUN_ALL,
    Unreachable,
    binomial_pvalues,
    calibrate_splits,
    candidate_thresholds,
    ltt_threshold,
    reachable_alpha,
)
from ccpo.runtime.decision import decide
from ccpo.testing.relabel import relabel_against_strongest
from ccpo.traces.answers import normalizer_for
from ccpo.traces.episodes import build_episodes, conformal_rollout, single_rollout
from ccpo.traces.io import read_traces, write_traces
from ccpo.traces.labels import reference_labels
from tests.helpers.cli import ccpo_ok

MMLU = "src/ccpo/data/traces/mmlu-public.jsonl.gz"
HOTPOT = "src/ccpo/data/traces/hotpotqa-public.jsonl.gz"
STRONGEST = "gpt-3.5-turbo-instruct"


@pytest.fixture(scope="module")
def mmlu_gold():
    return build_episodes(read_traces(MMLU), prices_for(MMLU))


@pytest.fixture(scope="module")
def mmlu_free():
    traces, model = relabel_against_strongest(read_traces(MMLU), prices_for(MMLU))
    return traces, build_episodes(traces, prices_for(MMLU)), model


# ----------------------------------------------------------------------------- pure pieces
def test_binomial_pvalue_and_reachable_alpha_agree():
    for k, n, delta in [(0, 50, 0.1), (13, 81, 0.1), (30, 200, 0.05)]:
        a = reachable_alpha(k, n, delta)
        # the least α whose binomial test at δ rejects with k misses in n
        assert binomial_pvalues(k, n, a) == pytest.approx(delta, rel=1e-6)
        assert binomial_pvalues(k, n, a + 1e-3) < delta < binomial_pvalues(k, n, a - 1e-3)
    assert binomial_pvalues(3, 10, 0.2) == pytest.approx(binom.cdf(3, 10, 0.2))
    lams = candidate_thresholds(4)
    assert lams.tolist() == [RUN_ALL, 1.0, 0.75, 0.5, 0.25, 0.0]


def test_ltt_stops_at_the_first_unrejected_threshold(mmlu_free):
    """Fixed-sequence testing: every threshold up to λ̂ passes the test, the next one fails
    (or λ̂ is the last of the grid)."""
    _, ep, _ = mmlu_free
    pol = fit_policy("cstop", ep, np.arange(300), 0.1, seed=0, single=True)
    cal = ep.subset(np.arange(300, 570))
    h = pol.stop_scores(cal.obs)
    got = ltt_threshold(cal, h, 0.1, 0.1)
    lams = candidate_thresholds()
    j = int(np.flatnonzero(lams == got.threshold)[0])
    misses = [int((~single_rollout(cal, h, lam).covered).sum()) for lam in lams[: j + 2]]
    assert misses[j] == got.misses and got.tested == j + 1
    assert all(binomial_pvalues(m, cal.n, 0.1) <= 0.1 for m in misses[: j + 1])
    if j + 1 < lams.size:
        assert binomial_pvalues(misses[j + 1], cal.n, 0.1) > 0.1


# ----------------------------------------------------------------------------- coverage
def _held_out_coverage(ep, alpha, method="cstop", seed=0, n_train=200, splits=100):
    """Fit on n_train questions, LTT on each of ``splits`` random halves of the rest, score
    the other half: per-split coverage [K] and the refused mask [K]."""
    sp = make_splits(ep.n, (n_train, (ep.n - n_train) // 2, (ep.n - n_train) // 2), splits, seed)
    # the learned rule: calling the reference alone would agree by construction
    pol = fit_policy(method, ep, sp.train, alpha, seed, single=True,
                     settings={"auto_reference": False, "auto_route": False})  # fmt: skip
    h = pol.stop_scores(ep.obs)
    lams, refused = calibrate_splits(ep, h, alpha, 0.1, sp.cal)
    m = single_rollout(ep, h, lams, sp.test)
    assert (m.set_size == 1).all()
    return m.covered.mean(-1), refused, sp.test.shape[1]


def _check_coverage(cov, refused, n_test, alpha, delta=0.1):
    """The guarantee, tested: P(R(λ̂) > α) ≤ δ over calibration draws. Slack: a split's
    coverage is noisy (sd sqrt(α(1−α)/n_test)), so a split counts as a violation only below
    1 − α − 2 sd; at most δ + 0.05 of the certified splits may violate, and the mean over
    certified splits must reach 1 − α."""
    ok = cov[~refused]
    assert ok.size >= 50
    sd = np.sqrt(alpha * (1 - alpha) / n_test)
    assert ok.mean() >= 1 - alpha
    assert (ok < 1 - alpha - 2 * sd).mean() <= delta + 0.05


@pytest.mark.parametrize("seed", [0, 1])
def test_single_coverage_on_held_out_splits_gold(mmlu_gold, seed):
    """mmlu-public with gold labels at α = 0.2 (seeds 0, 1; 100 splits of 185/185)."""
    cov, refused, n_test = _held_out_coverage(mmlu_gold, 0.2, seed=seed)
    _check_coverage(cov, refused, n_test, 0.2)


@pytest.mark.parametrize("alpha", [0.1, 0.2])
def test_single_coverage_on_held_out_splits_label_free(mmlu_free, alpha):
    """mmlu-public without labels: correct = equals the strongest model's answer (seed 0,
    100 splits of 185/185); no split is refused (the reference itself is a candidate)."""
    _, ep, _ = mmlu_free
    assert ep.labels == reference_labels(STRONGEST) and ep.solvable.all()
    cov, refused, n_test = _held_out_coverage(ep, alpha, method="auto")
    assert not refused.any()
    _check_coverage(cov, refused, n_test, alpha)


@pytest.mark.parametrize(
    ("guarantee", "says"), [("pac", r"0\.\d+ at δ = 0\.1"), ("marginal", r"0\.\d+ \(marginal\)")]
)
def test_unreachable_alpha_is_refused_with_the_reachable_one(guarantee, says):
    ep = build_episodes(read_traces(HOTPOT), prices_for(HOTPOT))
    pol = fit_policy("depth-k", ep, np.arange(300), 0.1, single=True,
                     settings={"guarantee": guarantee})  # fmt: skip
    with pytest.raises(Unreachable, match=rf"certifies α ≥ {says}.*--answer set"):
        pol.calibrate(ep.subset(np.arange(300, 500)))


def test_train_single_refuses_through_the_cli(tmp_path):
    out = tmp_path / "p"
    r = subprocess.run(
        [sys.executable, "-m", "ccpo", "train", "--traces", HOTPOT, "--alpha",
         "0.1", "--answer", "single", "--method", "depth-k", "--out", str(out)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode != 0 and not out.exists()
    line = r.stderr.strip().splitlines()[-1]
    assert "cannot be certified" in line and "--answer set" in line
    r = subprocess.run(
        [sys.executable, "-m", "ccpo", "train", "--traces", HOTPOT, "--answer",
         "single", "--method", "ccpo", "--out", str(out)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 2 and "--answer single works with --method auto" in r.stderr


# ----------------------------------------------------------------------------- one rollout
@pytest.fixture(scope="module")
def trained_free(mmlu_free, tmp_path_factory):
    """The label-free set as a file (with its sidecar prices) and `ccpo train --answer
    single` on it, through the console script's function (``ccpo.cli.main``)."""
    traces, _, model = mmlu_free
    d = tmp_path_factory.mktemp("free")
    path = d / "free.jsonl.gz"
    write_traces(path, traces)
    shutil.copy(MMLU.removesuffix(".jsonl.gz") + ".prices.json", d / "free.prices.json")
    out = d / "pol"
    ccpo_ok("train", "--traces", str(path), "--alpha", "0.1", "--answer", "single",
            "--out", str(out))  # fmt: skip
    return path, out, model


def test_train_single_records_answer_and_against(trained_free):
    _, out, model = trained_free
    meta = json.loads((out / "policy.json").read_text())
    assert meta["answer"] == "single" and meta["provenance"]["against"] == f"reference:{model}"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["calibration_coverage"] >= 0.9 and summary["auto"]["picked"]
    # the folder is a row of `evaluate`, re-calibrated by LTT on each split, set size 1
    path = trained_free[0]
    ev = out.parent / "ev"
    ccpo_ok("evaluate", "--traces", str(path), "--policy", str(out), "--alpha", "0.1",
            "--splits", "5", "--out", str(ev))  # fmt: skip
    (row,) = json.loads((ev / "results.json").read_text())["rows"]
    assert row["policy"] == "pol" and row["set_size"] == 1.0
    assert row["extra"]["answer"] == "single" and row["extra"]["refused_share"] == 0.0


def test_decide_returns_the_replayed_single_answer(mmlu_free):
    """The live decision, stepped over each trace's rounds, stops where the replay stops and
    names the one answer the replay returns; going on it returns no action."""
    traces, ep, _ = mmlu_free
    pol = ConformalPolicy("cstop", alpha=0.1, answer="single", prices=prices_for(MMLU))
    pol.fit(ep.subset(np.arange(300))).calibrate(ep.subset(np.arange(300, 470)))
    test = traces[470:]
    want = pol.predict_set(test)
    for tr, w in zip(test, want, strict=True):
        for t in range(1, tr.n_rounds + 1):
            d = decide(pol.policy, tr.task, tr.n_rounds, tr.rounds[:t], None, tr.family)
            if d.go_on:
                assert d.actions == ()
                continue
            assert t == w.rounds and len(d.actions) == 1
            step = getattr(tr.rounds[t - 1], d.actions[0])
            # an answer empty after the task's normaliser is never a member, as served
            empty = normalizer_for(tr.task, tr.family)(step.answer) == ""
            assert ([] if empty else [step.answer]) == w.answers
            break
    assert {len(w.answers) for w in want} <= {0, 1}


def test_dry_run_live_equals_replay_for_a_single_answer_policy(trained_free):
    """The live agent (real HTTP to the replay endpoint) returns exactly the replayed answer,
    rounds and cost for a single-answer policy trained by `ccpo train --answer single`."""
    from ccpo.evaluation.dry_run import dry_run

    path, folder, _ = trained_free
    rep = dry_run(folder, path, n=30, concurrency=4)
    assert rep.questions == 30 and rep.equal == 30, rep.differences


# ----------------------------------------------------------------------------- empty answers
def test_an_empty_answer_is_never_in_a_set(mmlu_gold):
    """mmlu-public has 248 empty answers (round 1's cut-off CoT): at κ = 0 every action is in
    C, yet the set holds only the non-empty distinct answers."""
    ep = mmlu_gold
    assert ep.empty.any()
    m = conformal_rollout(ep, np.ones((ep.n, ep.horizon, 3)), 0.0)
    pol = ConformalPolicy("depth-k", alpha=0.2, prices=prices_for(MMLU))
    pol.fit(ep.subset(np.arange(10))).calibrate(ep)
    pol.policy.kappa_batch = 0.0  # every round, every answer
    sets = pol.predict_set(read_traces(MMLU))
    for i, s in enumerate(sets):
        assert all(a.strip() for a in s.answers)
        assert len(s.answers) == m.set_size[i]
        distinct = {int(x) for x in ep.answer_id[i][~ep.empty[i]]}
        assert m.set_size[i] == len(distinct)
    assert (m.set_size[ep.empty.any((1, 2))] < 8).all()


def test_serve_refuses_online_kappa_for_a_single_answer_policy(trained_free, tmp_path):
    """The online κ tracker would move a threshold Learn-then-Test certified: refused, one
    line, through the real entry point."""
    _, folder, _ = trained_free
    conf = tmp_path / "c.yaml"
    conf.write_text('endpoints:\n  "*": {url: http://127.0.0.1:9/v1}\n')
    r = subprocess.run(
        [sys.executable, "-m", "ccpo", "serve", "--policy", str(folder),
         "--config", str(conf), "--adapt-kappa", "--port", "0"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode != 0
    assert "single-answer policy" in r.stderr and "without --adapt-kappa" in r.stderr


def test_set_policies_say_answer_set(tmp_path):
    ep = build_episodes(read_traces(MMLU), prices_for(MMLU))
    pol = ConformalPolicy("depth-k", alpha=0.2, prices=prices_for(MMLU))
    pol.fit(ep.subset(np.arange(100))).calibrate(ep.subset(np.arange(100, 300)))
    meta = json.loads((pol.save(tmp_path / "p") / "policy.json").read_text())
    assert meta["answer"] == "set" and pol.policy.answer == "set"


def test_single_rollout_matches_a_plain_loop(mmlu_gold):
    """single_rollout (vectorised, [K, n] splits) against the rule written as a loop: stop at
    the first round with h_t ≥ λ (or T), return the guide's answer unless it is empty and the
    base's is not; cost = rounds run."""
    ep = mmlu_gold
    rng = np.random.default_rng(7)
    h = rng.random((ep.n, ep.horizon))
    idx = np.stack([rng.permutation(ep.n)[:50] for _ in range(3)])
    lams = np.array([0.3, 0.7, RUN_ALL])
    m = single_rollout(ep, h, lams, idx)
    for k in range(3):
        for j, i in enumerate(idx[k]):
            t = next(t for t in range(ep.horizon) if h[i, t] >= lams[k] or t == ep.horizon - 1)
            a = 0 if ep.empty[i, t, 1] and not ep.empty[i, t, 0] else 1
            assert m.length[k, j] == t + 1
            assert m.cost[k, j] == pytest.approx(ep.round_cost[i, : t + 1].sum())
            assert m.covered[k, j] == (ep.correct[i, t, a] or not ep.solvable[i])
    assert (m.length[2] == ep.horizon).all()
