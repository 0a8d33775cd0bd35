"""Online κ under a real shift: a policy ``ccpo train`` fits on the easier half of ``mmlu-public``'s
subjects, served on the harder half (where its κ̂ covers 0.83) with ``kappa_eta0: 0.5`` and honest
feedback (the gold answer, or ``unanswerable`` when no round of the trace answers right). The stream
runs in process through the runtime's own feedback step
(:func:`ccpo.runtime.feedback.apply_feedback`; ``benchmarks/bench_shift.py`` checks that ``serve``
over HTTP gives the same κ, feedback by feedback)."""

from __future__ import annotations

import numpy as np

from ccpo.evaluation.harness import sidecar_prices
from ccpo.policies.registry import load_policy
from ccpo.runtime.config import ServerConfig
from ccpo.runtime.feedback import Counters, apply_feedback, online_kappa
from ccpo.testing.shift import subject_shift
from ccpo.traces.episodes import build_episodes, covering_scores
from ccpo.traces.io import read_traces
from ccpo.traces.prices import load_prices, prices_from_mapping
from tests.helpers.cli import ccpo_ok


def test_online_kappa_holds_coverage_over_the_second_half_of_a_shifted_stream(tmp_path):
    """1,300 feedbacks drawn with replacement from the harder half (seeds 0–4). Coverage over
    feedbacks 651–1,300 ≥ 0.885 on every seed (the team's bar; the level tracker's figures:
    0.899 mean over 10 seeds, lowest 0.894, in docs/decisions.md), where fixed κ̂ covers less
    than 0.85 on every seed. Slack: 0.885 is 0.015 below 1 − α, 1.3 standard errors of a
    650-feedback window."""
    easy, hard = subject_shift(tmp_path)
    ccpo_ok("train", "--traces", str(easy), "--method", "cstop", "--alpha", "0.1", "--seed", "0",
            "--out", str(tmp_path / "p"))  # fmt: skip
    pol = load_policy(tmp_path / "p")
    assert pol.calibration is not None and pol.calibration.kappa(0.1) == pol.kappa
    ep = build_episodes(
        read_traces(hard), load_prices(prices_from_mapping(pol.prices), sidecar_prices(hard))
    )
    scores = covering_scores(ep, pol.probs(ep.obs))  # covered at κ iff score ≥ κ
    cfg = ServerConfig(adapt_kappa=True, kappa_eta0=0.5)
    for seed in range(5):
        order = np.random.default_rng([seed, 31]).integers(0, ep.n, 1300)
        tracker, bounds = online_kappa(pol.kappa, 0.1, 0.05, 0.1, cfg, pol.calibration)
        c, hits = Counters(), []
        for i in order:
            hit = bool(scores[i] >= tracker.kappa)  # unsolvable: score +inf, covered
            apply_feedback(tracker, c, hit, True, cfg.kappa_max_step, bounds)
            hits.append(hit)
        fixed = float(np.mean(scores[order[650:]] >= pol.kappa))
        assert fixed < 0.85, (seed, fixed)
        assert np.mean(hits[650:]) >= 0.885, (seed, np.mean(hits[650:]), fixed)
