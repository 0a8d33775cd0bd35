"""The CCPO / CPO training loop, artifacts and the phase-checked API (SYNTHETIC data,
ccpo.traces.sim).

Training runs here are short (a few hundred steps) to keep the suite fast; the full-length
comparison lives in the benchmarks and in `ccpo compare`.
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from ccpo.api import ConformalPolicy
from ccpo.errors import CCPOError, PhaseError
from ccpo.evaluation.harness import make_splits
from ccpo.learning.config import TrainConfig
from ccpo.learning.conformal import split_conformal_threshold
from ccpo.learning.training import train
from ccpo.learning.training.update import target_log_probs
from ccpo.policies.rl import TrainedPolicy
from ccpo.traces.episodes import allowed_actions, build_episodes, conformal_rollout, covering_scores
from ccpo.traces.prices import load_prices
from ccpo.traces.sim import SimConfig, generate
from tests.helpers.probs import random_probs


@pytest.fixture(scope="module")
def big_sim():
    traces = generate(SimConfig(n=700, seed=21))
    return traces, build_episodes(traces, load_prices())


@pytest.fixture(scope="module")
def splits(big_sim):
    return make_splits(big_sim[1].n, (400, 150, 150), 100, seed=1)


@pytest.fixture(scope="module")
def ccpo_run(big_sim, splits):
    return train(big_sim[1], splits.train, TrainConfig(alpha=0.2, steps=400, seed=3, val_every=100))


def test_training_is_deterministic(big_sim, splits):
    cfg = TrainConfig(steps=25, seed=5, val_every=0)
    a = train(big_sim[1], splits.train, cfg)
    b = train(big_sim[1], splits.train, cfg)
    assert a.log == b.log
    np.testing.assert_array_equal(a.policy.theta, b.policy.theta)  # same machine: bit for bit
    c = train(big_sim[1], splits.train, TrainConfig(steps=25, seed=6, val_every=0))
    assert c.log != a.log


def test_log_has_the_diagnostics(ccpo_run):
    keys = set(ccpo_run.log[-1])
    for k in (
        "train/cost",
        "train/coverage",
        "constraint/surrogate_violation",
        "conformal/kappa",
        "cpo/case",
        "cpo/lambda",
        "cpo/nu",
        "cpo/kl",
        "cpo/backtracks",
        "val/coverage",
        "val/length",
    ):
        assert k in keys, k
    kls = [e["cpo/kl"] for e in ccpo_run.log]
    assert max(kls) <= TrainConfig().delta + 1e-9  # the line search keeps KL ≤ δ


def test_online_kappa_tracks_target_coverage(ccpo_run):
    """Batch coverage of C under the online κ averages near 1 − α over the second half."""
    cov = [e["train/coverage"] for e in ccpo_run.log[200:]]
    assert abs(np.mean(cov) - 0.8) < 0.05


def test_ccpo_beats_random_scores_at_equal_coverage(big_sim, splits, ccpo_run):
    """Trained π is a better conformal score than random π: cheaper at calibrated coverage."""
    ep, alpha = big_sim[1], 0.2
    costs = {}
    for name, probs in (
        ("ccpo", ccpo_run.probs(ep.obs)),
        ("random", random_probs(np.random.default_rng(0), ep.n, ep.horizon)),
    ):
        kappa = split_conformal_threshold(covering_scores(ep, probs)[splits.cal], alpha)
        m = conformal_rollout(ep, probs, kappa, splits.test)
        costs[name] = m.cost.sum(1).mean()
    assert costs["ccpo"] < 0.85 * costs["random"]


def test_ccpo_coverage_over_100_splits(big_sim, splits, ccpo_run):
    """Mean test coverage over 100 evaluation splits ≥ 1 − α − 0.01 (batch calibration)."""
    ep, alpha = big_sim[1], 0.2
    probs = ccpo_run.probs(ep.obs)
    kappa = split_conformal_threshold(covering_scores(ep, probs)[splits.cal], alpha)
    m = conformal_rollout(ep, probs, kappa, splits.test)
    assert m.covered.mean() >= 1 - alpha - 0.01


def expected_point_coverage(ep, probs):
    """Exact coverage of the stochastic point policy π (no sampling noise)."""
    reach = np.cumprod(np.concatenate([np.ones((ep.n, 1)), probs[:, :-1, 2]], 1), axis=1)
    hit = (probs[..., :2] * ep.correct).sum(-1)
    return float(np.where(ep.solvable, (reach * hit).sum(1), 1.0).mean())


def test_cpo_raises_coverage_toward_its_constraint(big_sim, splits):
    """At α = 0.1 the point constraint is violated at the start, so CPO's steps raise coverage."""
    ep = big_sim[1]
    sub = ep.subset(splits.train)
    short = train(
        ep, splits.train, TrainConfig(method="cpo", alpha=0.1, steps=1, seed=2, val_every=0)
    )
    longer = train(
        ep, splits.train, TrainConfig(method="cpo", alpha=0.1, steps=300, seed=2, val_every=0)
    )
    before = expected_point_coverage(sub, short.probs(sub.obs))
    after = expected_point_coverage(sub, longer.probs(sub.obs))
    assert after > before + 0.03


def test_exact_cpo_raises_its_expected_point_coverage(big_sim, splits):
    """cpo_rollouts="exact": the point policy's exact expectations drive the same CPO step
    (no critics), and its expected point coverage on the training questions rises toward the
    constraint as with the sampled loop."""
    ep = big_sim[1]
    sub = ep.subset(splits.train)
    cfg = dict(method="cpo", alpha=0.1, seed=2, val_every=0, cpo_rollouts="exact")
    short = train(ep, splits.train, TrainConfig(steps=1, **cfg))
    longer = train(ep, splits.train, TrainConfig(steps=150, **cfg))
    assert "point/coverage" in longer.log[-1] and "critic/v_loss" not in longer.log[-1]
    before = expected_point_coverage(sub, short.probs(sub.obs))
    after = expected_point_coverage(sub, longer.probs(sub.obs))
    assert after > before + 0.03


def test_keep_best_ends_at_the_checkpoint_of_least_training_calibrated_cost(big_sim, splits):
    """keep_best (on by default, scored on the training questions) returns θ of the logged
    checkpoint with the least score (its calibrated cost, at λ = 0): the same θ as a run
    stopped at that step."""
    ep = big_sim[1]
    cfg = TrainConfig(alpha=0.2, steps=300, seed=4, val_every=50)
    assert cfg.keep_best and cfg.select_on == "train"
    run = train(ep, splits.train, cfg)
    checks = {e["step"]: e["select/score"] for e in run.log if "select/score" in e}
    assert sorted(checks) == [50, 100, 150, 200, 250, 300]
    best = int(run.log[-1]["train/best_step"])
    assert checks[best] == min(checks.values())
    stopped = train(ep, splits.train, replace(cfg, steps=best, keep_best=False))
    np.testing.assert_array_equal(run.policy.theta, stopped.policy.theta)


def test_target_policy_softmask():
    probs = np.array([[[0.7, 0.2, 0.1], [0.6, 0.4, 0.0]]])
    with np.errstate(divide="ignore"):
        logits = np.log(probs)  # the last round's 'next' is masked anyway
    allowed = allowed_actions(2)
    S = np.exp(target_log_probs(logits, kappa=0.3, eps=0.01, method="ccpo", allowed=allowed))
    np.testing.assert_allclose(S.sum(-1), np.ones((1, 2)), rtol=1e-12)
    assert S[0, 0, 0] > 0.99  # only 'base' is above κ in round 1
    assert abs(S[0, 1, 0] - 0.5) < 0.01 and S[0, 1, 2] == 0  # uniform over {base, guide}
    # every action below κ: S concentrates on argmax π (the empty-set fallback)
    S_low = np.exp(target_log_probs(logits, kappa=0.95, eps=0.01, method="ccpo", allowed=allowed))
    assert S_low[0, 0, 0] > 0.99
    cpo = np.exp(target_log_probs(logits, 0.3, 0.01, "cpo", allowed))
    np.testing.assert_allclose(cpo, probs, rtol=1e-12, atol=1e-15)


def test_artifact_round_trip_and_incompatible_versions(tmp_path, big_sim, ccpo_run):
    ep = big_sim[1]
    pol = TrainedPolicy.from_result(ccpo_run, "ccpo", load_prices().to_price_file())
    pol.kappa_batch = 0.123
    folder = pol.save(tmp_path / "pol")
    back = TrainedPolicy.load(folder)
    np.testing.assert_allclose(back.probs(ep.obs[:20]), pol.probs(ep.obs[:20]))
    assert back.kappa == 0.123 and back.variant == "ccpo" and len(back.log) == len(pol.log)
    meta = json.loads((folder / "policy.json").read_text())
    meta["format"] = "ccpo.policy/v0"
    (folder / "policy.json").write_text(json.dumps(meta))
    with pytest.raises(CCPOError, match="retrain"):
        TrainedPolicy.load(folder)
    meta["format"] = "ccpo.policy/v1"
    (folder / "policy.json").write_text(json.dumps(meta))
    (folder / "features.json").write_text(
        json.dumps({"version": "ccpo.features/v0", "names": ["x"]})
    )
    with pytest.raises(CCPOError, match="feature spec"):
        TrainedPolicy.load(folder)
    with pytest.raises(CCPOError, match="not a trained policy"):
        TrainedPolicy.load(tmp_path)


def test_api_phases_and_predictions(big_sim, tmp_path):
    traces, _ = big_sim
    pol = ConformalPolicy(alpha=0.2, config=TrainConfig(steps=40, val_every=0))
    with pytest.raises(PhaseError, match="fit"):
        pol.calibrate(traces[400:550])
    with pytest.raises(PhaseError, match="fit"):
        pol.predict_set(traces[550:])
    pol.fit(traces[:400])
    with pytest.raises(PhaseError, match="calibrate"):
        pol.predict_set(traces[550:])
    pol.calibrate(traces[400:550])
    sets = pol.predict_set(traces[550:])
    ep = build_episodes(traces[550:], load_prices())
    m = conformal_rollout(ep, pol.policy.probs(ep.obs), pol.policy.kappa)
    assert [s.rounds for s in sets] == m.length.tolist()
    assert [len(s.answers) for s in sets] == m.set_size.tolist()
    np.testing.assert_allclose([s.cost_usd for s in sets], m.cost)
    assert [s.covered for s in sets] == m.covered.tolist()
    back = ConformalPolicy.load(pol.save(tmp_path / "api"))
    assert [s.answers for s in back.predict_set(traces[550:])] == [s.answers for s in sets]


def test_sampled_rollouts_are_still_the_papers_loop(big_sim, splits):
    """rollouts="sampled" (paper Algorithm 1: sampled paths, V-trace critics) still trains,
    and differs from the exact variant."""
    cfg = TrainConfig(steps=25, seed=5, val_every=0, rollouts="sampled")
    a = train(big_sim[1], splits.train, cfg)
    assert "critic/v_loss" in a.log[-1] and np.isfinite(a.log[-1]["critic/v_loss"])
    b = train(big_sim[1], splits.train, TrainConfig(steps=25, seed=5, val_every=0))
    assert "soft/coverage" in b.log[-1] and "critic/v_loss" not in b.log[-1]


@pytest.mark.slow
def test_set_size_shrinks_as_lambda_grows(big_sim, splits):
    """λ does what it says: on fixed traces, the calibrated answer sets of CCPO get smaller as λ
    (the price of an answer, in mean-round costs) grows. One seed's run is one draw of the
    initial weights, so the claim is on the mean over seeds 0–2, and λ = 4 must beat λ = 0 on
    every seed (keep_best scores checkpoints by cost + λ c̄ · size, the objective trained).
    200 steps a run (measured on seeds 0–4: mean sizes 1.49 > 1.22 > 1.12 over seeds 0–2;
    λ = 4 below λ = 0 on all five)."""
    from ccpo.evaluation.rows import conformal_metrics

    ep = big_sim[1]
    lams = (0.0, 0.25, 4.0)
    sizes = np.zeros((3, len(lams)))
    for seed in range(3):
        for j, lam in enumerate(lams):
            res = train(ep, splits.train, TrainConfig(alpha=0.1, lam=lam, steps=200, seed=seed))
            m, _ = conformal_metrics(ep, res.probs(ep.obs), splits, 0.1, None)
            sizes[seed, j] = m.set_size.mean()
    assert (sizes[:, 0] > 1.2).all(), sizes  # at λ = 0 the sets hold several answers
    mean = sizes.mean(0)
    assert mean[0] > mean[1] > mean[2], sizes
    assert (sizes[:, 2] < sizes[:, 0]).all(), sizes
