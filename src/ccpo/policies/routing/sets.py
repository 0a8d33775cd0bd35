"""Routing a set policy: CStop answer sets that may start at a later round.

The router of :mod:`ccpo.policies.routing.router` picks, before any call, the round s at which a
question starts; the CStop set policy (:mod:`ccpo.policies.cstop`) runs from there. The
replay builds each question's *started view* (:func:`started_view`): observations and round
costs of the episode started at its s, and membership scores (−∞, −∞, 1) for the skipped
rounds (never in a set at any κ, never a reason to stop). κ̂ is split conformal on the
started views' covering scores; the router, τ and the stopping classifier are fitted on the
training split only, so P(the set covers a correct answer) ≥ 1 − α holds marginally as for
any set policy, with a question whose only right answers lie in skipped rounds counted as a
miss (docs/theory.md, "Routing before the first call", "Sets").

Main names: :class:`RoutedSetPolicy`, :func:`route_sets`, :func:`started_view`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from ccpo.errors import CCPOError
from ccpo.learning.conformal import CalibrationScores, split_conformal_threshold
from ccpo.policies.base import Calibration, Policy
from ccpo.policies.cstop import STOPPING_METHODS, StoppingPolicy, fixable_labels
from ccpo.policies.routing.holder import TAUS, RouterHolder
from ccpo.policies.routing.router import Router, fit_router
from ccpo.traces.episodes import (
    BASE,
    GUIDE,
    Episodes,
    Metrics,
    conformal_rollout,
    conformal_sets,
    covering_scores,
    round_steps,
)


@dataclass(frozen=True)
class StartedView:
    """Every question of ``ep`` as started at ``start`` [N]: ``ep`` with the started
    observations, round costs and latencies, and the membership scores ``probs`` [N, T, 3]."""

    ep: Episodes
    probs: np.ndarray
    start: np.ndarray


def started_view(ep: Episodes, start: np.ndarray, probs_of: Any) -> StartedView:
    """The view of each question started at ``start`` [N] (0-based): o_t, round costs and
    latencies of :attr:`ccpo.traces.episodes.Episodes.routes` at that start, and the
    membership scores ``probs_of(obs)`` with the skipped rounds set to (−∞, −∞, 1)."""
    if ep.routes is None:
        raise CCPOError("a routed policy needs traces of an agree ladder (see --route)")
    q = np.arange(ep.n)
    obs = ep.routes.obs[start, q]
    lat = None if ep.routes.latency is None else ep.routes.latency[start, q]
    view = replace(ep, obs=obs, round_cost=ep.routes.cost[start, q], round_latency=lat)
    probs = np.array(probs_of(obs), dtype=np.float64)
    skipped = np.arange(ep.horizon)[None, :] < start[:, None]
    probs[skipped, BASE] = probs[skipped, GUIDE] = -np.inf
    probs[skipped, 2] = 1.0
    return StartedView(view, probs, np.asarray(start))


def _kappa(scores: np.ndarray, alpha: float) -> float | None:
    """Split-conformal κ̂ of the started views' covering ``scores``, or None when more than
    α of the questions are covered at no κ (their only right answers were skipped): no κ̂
    is valid then."""
    k = int(np.floor(alpha * (scores.size + 1)))
    if k and np.partition(scores, k - 1)[k - 1] == -np.inf:
        return None
    return float(split_conformal_threshold(scores, alpha))


@dataclass
class RoutedSetPolicy(RouterHolder, Policy):
    """A CStop set policy (``inner``) behind a :class:`Router` at threshold ``tau`` (its
    text router: question embeddings route single answers only, for now)."""

    inner: StoppingPolicy
    router: Router
    tau: float | None = None  # τ̂, chosen on the training split
    taus: tuple[float, ...] = TAUS
    fallback: Router | None = None

    answer = "set"

    @property
    def kappa(self) -> float:
        return self.inner.kappa

    @property
    def calibration(self) -> CalibrationScores | None:  # type: ignore[override]
        return self.inner.calibration

    # ------------------------------------------------------------------ replay
    def starts(self, ep: Episodes, tau: float | None = None) -> np.ndarray:
        assert ep.routes is not None
        probs = self.router.question_probs(ep.routes.questions, ep.routes.embeddings)
        return self.router.start(probs, self._tau() if tau is None else tau)

    def scores(self, obs: np.ndarray) -> np.ndarray:
        return self.inner.probs(obs)

    def episode_scores(self, ep: Episodes) -> StartedView:  # type: ignore[override]
        if ep.routes is None:
            raise CCPOError("a routed policy needs traces of an agree ladder (see --route)")
        return started_view(ep, self.starts(ep), self.inner.probs)

    def round_costs(self, ep: Episodes) -> np.ndarray:
        return self.episode_scores(ep).ep.round_cost

    def full_set_rate(self, ep: Episodes, scores: Any, threshold: float | None) -> float:
        return super().full_set_rate(scores.ep, scores.probs, threshold)  # the started view

    def calibrate(self, ep: Episodes, cal: np.ndarray | None = None) -> Calibration:
        view = self.episode_scores(ep if cal is None else ep.subset(cal))
        scores = covering_scores(view.ep, view.probs)
        kappa = _kappa(scores, self.alpha)
        if kappa is None:
            raise CCPOError(
                f"routing at τ = {self._tau():g} skips the only right answers of more than "
                f"α = {self.alpha:g} of the calibration questions: train without --route"
            )
        self.inner.kappa_batch = kappa
        self.inner.calibration = CalibrationScores.from_scores(scores)
        return Calibration(kappa, None, view.ep.n)

    def split_thresholds(
        self, ep: Episodes, scores: StartedView, cal: np.ndarray, alpha: float
    ) -> tuple[np.ndarray, np.ndarray]:
        """κ̂ of every calibration split; a split where none is valid gets 0 (every round
        from the start, every answer), marked refused."""
        out, refused = np.zeros(len(cal)), np.zeros(len(cal), dtype=bool)
        covering = covering_scores(scores.ep, scores.probs)
        for k, c in enumerate(cal):
            got = _kappa(covering[c], alpha)
            refused[k] = got is None
            out[k] = 0.0 if got is None else got
        return out, refused

    def rollout(
        self, ep: Episodes, scores: StartedView, thresholds: Any, idx: np.ndarray | None = None
    ) -> Metrics:
        m = conformal_rollout(scores.ep, scores.probs, thresholds, idx)
        start = scores.start if idx is None else scores.start[np.asarray(idx)]
        run = round_steps(np.arange(ep.horizon) >= start[..., None])  # skipped: not called
        assert m.called is not None
        # latency: the skipped rounds cost 0 s
        return replace(m, length=m.length - start, called=m.called & run)

    def replay_answers(self, ep: Episodes) -> tuple[np.ndarray, np.ndarray]:
        view = self.episode_scores(ep)
        reach, included = conformal_sets(view.ep, view.probs, self.inner.kappa)
        ran = reach & (np.arange(ep.horizon)[None, :] >= view.start[:, None])
        return ran, included

    # ------------------------------------------------------------------ persistence
    @classmethod
    def load(cls, folder: str | Path, meta: dict[str, Any]) -> RoutedSetPolicy:
        inner = StoppingPolicy.load(folder, meta)
        router, fallback, tau, taus = RouterHolder.load_router(folder, meta)
        return cls(inner, router, tau, taus, fallback)


def started_stopping(inner: StoppingPolicy, ep: Episodes, train_idx: np.ndarray) -> StoppingPolicy:
    """``inner`` with its continuation classifier refitted on the training questions' rows of
    every start s (rounds s..T − 1 of the view started at s; "fixable" counts only answers of
    rounds ≥ s, and a question stays solvable by its whole ladder)."""
    from ccpo.learning.config import StopConfig
    from ccpo.policies.classifier import fit_classifier, stop_features

    if inner.model is None or isinstance(inner.model, float) or ep.routes is None:
        return inner
    sub = ep.subset(np.asarray(train_idx))
    T = ep.horizon
    xs, ys = [], []
    for s in range(T - 1):
        correct = sub.correct.copy()
        correct[:, :s] = False
        y = fixable_labels(correct, sub.solvable)
        x = stop_features(sub.routes.obs[s])
        xs.append(x[:, s : T - 1].reshape(-1, x.shape[-1]))
        ys.append(y[:, s : T - 1].reshape(-1))
    learner = StopConfig(**{**asdict(inner.config), "learner": STOPPING_METHODS[inner.method]})
    return replace(inner, model=fit_classifier(np.concatenate(xs), np.concatenate(ys), learner))


def route_set_policy(pol: Policy, ep: Episodes, train_idx: np.ndarray, seed: int = 0) -> Policy:
    """``pol`` behind a router (:func:`route_sets`) when it is a CStop set policy; any other
    policy (a fixed rule, CCPO, ``always-<reference>``) is returned as it is, unrouted."""
    if isinstance(pol, StoppingPolicy) and pol.method in STOPPING_METHODS:
        return route_sets(pol, ep, train_idx, seed)
    return pol


def route_sets(
    inner: StoppingPolicy, ep: Episodes, train_idx: np.ndarray, seed: int = 0, splits: int = 20
) -> RoutedSetPolicy:
    """``inner`` (a CStop set policy fitted on ``train_idx``) behind a router fitted on the
    same questions, its classifier refitted on every start, and τ of :data:`TAUS` chosen on
    the training questions alone (κ̂ on random halves, cost on the others; a τ with no valid
    κ̂ on some half is out; ties to the earlier τ); not calibrated yet."""
    idx = np.asarray(train_idx)
    pol = RoutedSetPolicy(started_stopping(inner, ep, idx), fit_router(ep, idx, seed=seed))
    sub = ep.subset(idx)
    rng = np.random.default_rng([seed, 0x7A1])
    halves = np.stack([rng.permutation(sub.n) for _ in range(splits)])
    cal, test = halves[:, : sub.n // 2], halves[:, sub.n // 2 :]
    figures: dict[float, float] = {}
    for tau in TAUS:
        view = started_view(sub, pol.starts(sub, tau), pol.inner.probs)
        kappas, refused = pol.split_thresholds(sub, view, cal, pol.alpha)
        cost = conformal_rollout(view.ep, view.probs, kappas, test).cost.mean()
        figures[float(tau)] = float("inf") if refused.any() else float(cost)
    pol.tau = min(figures, key=lambda t: (figures[t], TAUS.index(t)))
    pol.taus = (pol.tau,)
    costs = {f"route/cost@{t:g}": c for t, c in figures.items() if np.isfinite(c)}
    pol.inner.log.append({"route/tau": pol.tau, **costs})
    return pol


__all__ = ["RoutedSetPolicy", "route_set_policy", "route_sets", "started_stopping", "started_view"]
