"""Routing before the first call: a single-answer policy that may start at a later round.

A :class:`~ccpo.policies.routing.router.Router` predicts from the question alone whether each
round's answer is correct; at a threshold τ the question starts at the cheapest round whose
prediction clears τ (:data:`NO_ROUTE`: round 1); a router that reads question embeddings has
a text-only fallback for a question whose embedding is missing. The wrapped single-answer
policy's stopping rule goes on from there; skipped rounds are neither called nor paid
(:mod:`ccpo.traces.routing`). :func:`route` fits it on the training split and, from
out-of-fold scores there (:func:`out_of_fold`), orders the (τ, λ) pairs its calibration walks
(:mod:`ccpo.policies.routing.pareto`: Pareto testing, one fixed sequence at δ); a folder
without that order picks τ on the training split (:func:`choose_tau`) and certifies λ̂ there
(:func:`joint_ltt`). Either way each question counts at its worse of with and without its
embedding, so P_cal(P(wrong answer on a solvable question) ≤ α) ≥ 1 − δ holds with routing in
play (docs/theory.md, "Routing before the first call").

Main names: :class:`RoutedPolicy`, :func:`route`, :func:`choose_tau`, :func:`joint_ltt`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from ccpo.errors import CCPOError
from ccpo.policies.base import Calibration, Policy
from ccpo.policies.routing.holder import NO_ROUTE, ROUTE_FILE, SUFFIX, TAUS, RouterHolder
from ccpo.policies.routing.pareto import pareto_ltt, pareto_sequence
from ccpo.policies.routing.router import Router, fit_router
from ccpo.policies.single import (
    GRID,
    RUN_ALL,
    SingleAnswerPolicy,
    Unreachable,
    ltt_threshold,
    reached_labels,
)
from ccpo.traces.episodes import (
    Episodes,
    Metrics,
    answer_actions,
    one_step,
    round_steps,
    single_losses,
    single_stops,
)


# ----------------------------------------------------------------------------- replay
@dataclass(frozen=True)
class RoutedScores:
    """What a routed replay needs: r̂ [N, T] and the stopping scores of every start [S, N, T]
    (−∞ before the start: a skipped round never stops the episode)."""

    probs: np.ndarray
    stops: np.ndarray
    cost: np.ndarray  # [S, N, T]
    router: Router
    latency: np.ndarray | None = None  # [S, N, T] estimated seconds (RouteViews.latency)
    fallback_probs: np.ndarray | None = None  # [N, T] r̂ of the text-only fallback router

    def take(self, idx: np.ndarray) -> RoutedScores:
        lat = None if self.latency is None else self.latency[:, idx]
        fb = None if self.fallback_probs is None else self.fallback_probs[idx]
        return RoutedScores(
            self.probs[idx], self.stops[:, idx], self.cost[:, idx], self.router, lat, fb
        )

    def at(
        self, tau: Any, sel: Any = slice(None), fallback: bool = False
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(start [...], stopping scores [..., T], round costs [..., T]) of questions ``sel``
        (an index array of any shape) at τ (a scalar or broadcasting on ``sel``'s shape);
        ``fallback``: as routed without the question's embedding."""
        q = np.arange(self.probs.shape[0])[sel]
        probs = self.fallback_probs if fallback and self.fallback_probs is not None else self.probs
        s = self.router.start(probs[q], tau)
        return s, self.stops[s, q], self.cost[s, q]


def routed_outcomes(
    ep: Episodes,
    sc: RoutedScores,
    tau: Any,
    lam: Any,
    sel: Any = slice(None),
    fallback: bool = False,
) -> tuple[np.ndarray, np.ndarray, Metrics]:
    """(start, stop, metrics) of the routed episodes of questions ``sel`` at (τ, λ)
    (``fallback``: every question routed without its embedding)."""
    s, h, cost = sc.at(tau, sel, fallback)
    stop = single_stops(h, lam)
    t = np.arange(ep.horizon)
    ran = (t >= s[..., None]) & (t <= stop[..., None])
    q = np.arange(ep.n)[sel]
    act = np.take_along_axis(answer_actions(ep.answered[q]), stop[..., None], -1)[..., 0]
    corr = np.take_along_axis(ep.correct[q], stop[..., None, None], -2)[..., 0, :]
    hit = np.take_along_axis(corr, act[..., None], -1)[..., 0]
    lat = None if sc.latency is None else (sc.latency[s, q] * ran).sum(-1)
    m = Metrics(
        cost=(cost * ran).sum(-1),
        covered=hit | ~ep.solvable[q],
        length=stop - s + 1,
        set_size=np.ones_like(stop),
        latency=lat,  # rounds s..stop, as run: the start round's calls at once
        called=round_steps(ran),  # round s's repeat of a skipped call stands for that call
        returned=one_step(stop, act, ep.horizon),
    )
    return s, stop, m


def joint_ltt(
    ep: Episodes, sc: RoutedScores, alpha: float, delta: float | None, taus=TAUS
) -> tuple[float, Calibration]:
    """(τ̂, the calibration of λ̂) on the calibration questions ``ep``: for each τ of ``taus``
    fixed-sequence LTT over λ at δ/m; the certified pair of least calibration cost (``delta``
    None: the marginal walk over λ, at a single τ only). With a
    fallback router, a question's loss is its worse with or without its embedding, so the
    pair holds whichever each question meets. Raises :class:`Unreachable` when no τ
    certifies λ_0."""
    m = len(taus)
    if delta is None and m > 1:  # the least cost over several marginal walks is not one
        raise CCPOError("a marginal guarantee at one of several τ needs a Pareto sequence: "
                        "retrain the policy with --route")  # fmt: skip
    level = None if delta is None else delta / m
    best: tuple[float, float, Calibration] | None = None
    last_error: Unreachable | None = None
    for tau in taus:
        _, h, _ = sc.at(tau)
        also = () if sc.fallback_probs is None else (sc.at(tau, fallback=True)[1],)
        try:
            cal = ltt_threshold(ep, h, alpha, level, GRID, *also)
        except Unreachable as e:
            last_error = e
            continue
        cost = float(routed_outcomes(ep, sc, tau, cal.threshold)[2].cost.sum())
        if best is None or cost < best[0]:
            best = (cost, float(tau), cal)
    if best is None:
        assert last_error is not None
        raise last_error
    return best[1], best[2]


# ----------------------------------------------------------------------------- the policy
@dataclass
class RoutedPolicy(RouterHolder, Policy):
    """A single-answer policy (``inner``) behind a :class:`Router` at threshold ``tau``."""

    inner: SingleAnswerPolicy
    router: Router
    tau: float | None = None  # τ̂ (NO_ROUTE: never skips); None: not calibrated
    taus: tuple[float, ...] = TAUS  # the τ calibration may choose (one: chosen on training)
    #: the text-only router used when a question's embedding is missing (``router`` reads
    #: embeddings); None when ``router`` reads the text alone
    fallback: Router | None = None
    #: the fixed sequence of (τ, λ) pairs Pareto testing walks ([m, 2], made on the training
    #: split: :func:`~ccpo.policies.routing.pareto.pareto_sequence`); None: τ among ``taus``,
    #: λ by Learn-then-Test at each (:func:`joint_ltt`; folders of earlier versions)
    sequence: np.ndarray | None = None

    answer = "single"

    # ------------------------------------------------------------------ replay
    def scores(self, obs: np.ndarray) -> np.ndarray:
        """The stopping scores of observations (any start's view)."""
        return self.inner.stop_scores(obs)

    def episode_scores(self, ep: Episodes) -> RoutedScores:
        if ep.routes is None:
            raise CCPOError("a routed policy needs traces of an agree ladder (see --route)")
        views = ep.routes
        stops = self.inner.stop_scores(views.obs)  # [S, N, T]
        for s in range(1, stops.shape[0]):
            stops[s, :, :s] = -np.inf
        if self.router.embedding_model not in (None, views.embedding_model):
            raise CCPOError(
                f"the {self.variant} policy routes by question embeddings of "
                f"{self.router.embedding_model}; these traces record "
                f"{views.embedding_model or 'none'} (run `ccpo traces embed`)"
            )
        probs = self.router.question_probs(views.questions, views.embeddings)
        fb = None if self.fallback is None else self.fallback.question_probs(views.questions)
        return RoutedScores(probs, stops, views.cost, self.router, views.latency, fb)

    def summary_fields(self) -> dict[str, Any]:
        how = "tau-first" if self.sequence is None else "pareto"
        return {"route_tau": self.tau, "route_calibration": how}

    def round_costs(self, ep: Episodes) -> np.ndarray:
        sc = self.episode_scores(ep)
        return sc.at(self._tau())[2]

    def certify(self, ep: Episodes, sc: RoutedScores, alpha: float) -> tuple[float, Calibration]:
        """(τ̂, the calibration of λ̂) on the calibration questions ``ep``: Pareto testing
        along :attr:`sequence` (:func:`~ccpo.policies.routing.pareto.pareto_ltt`), or, without
        one, :func:`joint_ltt` over :attr:`taus`. Raises :class:`Unreachable`."""
        if self.sequence is None:
            return joint_ltt(ep, sc, alpha, self.inner.level, self.taus)
        return pareto_ltt(ep, sc, alpha, self.inner.level, self.sequence)

    def calibrate(self, ep: Episodes, cal: np.ndarray | None = None) -> Calibration:
        """(τ̂, λ̂) by :meth:`certify` on the calibration questions (sets both)."""
        sub = ep if cal is None else ep.subset(cal)
        tau, found = self.certify(sub, self.episode_scores(sub), self.alpha)
        self.tau = tau
        self.inner.lam = found.threshold
        return found

    def restoring(self) -> RoutedPolicy:
        """This policy calibrated at its own τ̂ alone (λ by Learn-then-Test there): what
        ``check`` proposes, since a deploy config sets λ, not τ."""
        return replace(self, taus=(self._tau(),), sequence=None)

    def split_thresholds(
        self, ep: Episodes, scores: RoutedScores, cal: np.ndarray, alpha: float
    ) -> tuple[np.ndarray, np.ndarray]:
        """(τ̂, λ̂) of every calibration split as [K, 2]; a refused split gets (no routing,
        run every round)."""
        out = np.tile([NO_ROUTE, RUN_ALL], (len(cal), 1))
        refused = np.zeros(len(cal), dtype=bool)
        for k, c in enumerate(cal):
            try:
                tau, found = self.certify(ep.subset(c), scores.take(c), alpha)
                out[k] = (tau, found.threshold)
            except Unreachable:
                refused[k] = True
        return out, refused

    def rollout(
        self, ep: Episodes, scores: RoutedScores, thresholds: Any, idx: np.ndarray | None = None
    ) -> Metrics:
        """``thresholds``: (τ, λ), or [K, 2] with ``idx`` [K, n]; a float is λ at τ̂."""
        th = np.asarray(thresholds, dtype=np.float64)
        if th.ndim == 0:
            th = np.array([self._tau(), float(th)])
        if idx is None:
            return routed_outcomes(ep, scores, th[0], th[1])[2]
        idx = np.asarray(idx)
        if th.ndim == 1:
            th = np.tile(th, (idx.shape[0], 1))
        return routed_outcomes(ep, scores, th[:, :1], th[:, 1:], idx)[2]

    def replay_answers(self, ep: Episodes) -> tuple[np.ndarray, np.ndarray]:
        """Rounds start..stop run, and the one answer action of the stop round."""
        s, stop, _ = routed_outcomes(ep, self.episode_scores(ep), self._tau(), self.threshold)
        t = np.arange(ep.horizon)
        reach = (t >= s[:, None]) & (t <= stop[:, None])
        rows = np.arange(ep.n)
        included = np.zeros((ep.n, ep.horizon, 2), dtype=bool)
        included[rows, stop, answer_actions(ep.answered)[rows, stop]] = True
        return reach, included

    def losses(self, ep: Episodes, tau: float, lams: np.ndarray) -> np.ndarray:
        """L_i(τ, λ) [M, N] for every λ of ``lams`` (tests and diagnostics)."""
        _, h, _ = self.episode_scores(ep).at(tau)
        return single_losses(ep, h, lams)

    # ------------------------------------------------------------------ persistence
    def save(self, folder: str | Path) -> Path:
        """:meth:`RouterHolder.save`, with the Pareto sequence in ``route.json``."""
        out = RouterHolder.save(self, folder)
        if self.sequence is not None:
            path = Path(folder) / ROUTE_FILE
            d = json.loads(path.read_text())
            d["sequence"] = np.asarray(self.sequence).tolist()
            path.write_text(json.dumps(d) + "\n")
        return out

    @classmethod
    def load(cls, folder: str | Path, meta: dict[str, Any]) -> RoutedPolicy:
        router, fallback, tau, taus = RouterHolder.load_router(folder, meta)
        seq = json.loads((Path(folder) / ROUTE_FILE).read_text()).get("sequence")
        seq = None if seq is None else np.asarray(seq, dtype=np.float64).reshape(-1, 2)
        return cls(SingleAnswerPolicy.load(folder, meta), router, tau, taus, fallback, seq)


def route(
    inner: Policy,
    ep: Episodes,
    train_idx: np.ndarray,
    seed: int = 0,
    folds: int = 5,
    embedded: bool = False,
) -> RoutedPolicy:
    """``inner`` (a single-answer policy fitted on ``train_idx``) behind a router fitted on
    the same questions, its stopping classifier refitted on every start
    (:func:`started_stopper`), and, from out-of-fold scores of the training questions alone
    (:func:`out_of_fold`), the Pareto sequence its calibration walks
    (:func:`~ccpo.policies.routing.pareto.pareto_sequence`) and the τ of :func:`choose_tau`
    (kept in ``taus``: the calibration without a sequence); not calibrated yet (call
    :meth:`RoutedPolicy.calibrate`). ``embedded``: the router reads the recorded question
    embeddings too, with a text-only fallback router for questions whose embedding is
    missing at serve time."""
    return routed_fit(inner, ep, train_idx, seed, folds, embedded)[0]


def routed_fit(
    inner: Policy,
    ep: Episodes,
    train_idx: np.ndarray,
    seed: int = 0,
    folds: int = 5,
    embedded: bool = False,
    grid: int = GRID,
) -> tuple[RoutedPolicy, Episodes, RoutedScores]:
    """:func:`route`, with the training questions and their out-of-fold scores it ordered
    the sequence on (what ``auto`` validates a routed candidate on). ``grid``: the λ grid
    of the sequence (1: λ ∈ {run every round, 1, 0}; with ``depth-k`` inside, λ = 0 returns
    the start round's reply: a router alone)."""
    if not isinstance(inner, SingleAnswerPolicy):
        raise CCPOError(
            "--route applies to single-answer policies (--answer single): routing a set "
            "policy is not built yet (docs/theory.md, 'Routing before the first call')"
        )
    idx = np.asarray(train_idx)
    router = fit_router(ep, idx, seed=seed, embedded=embedded)
    fallback = fit_router(ep, idx, seed=seed) if embedded else None
    pol = RoutedPolicy(started_stopper(inner, ep, idx), router, fallback=fallback)
    rng = np.random.default_rng([seed, 0x7A0])
    sub, sc = out_of_fold(pol, ep, rng.permutation(idx), seed, folds)
    tau, figures = choose_tau(pol, sub, sc, rng)
    pol.taus = (tau,)
    pol.sequence, est = pareto_sequence(sub, sc, grid=grid)
    costs = {f"route/cost@{t:g}": c for t, c in figures.items() if np.isfinite(c)}
    pol.log.append({"route/tau": tau, "route/pareto_pairs": float(len(est)), **costs})
    return pol, sub, sc


def routed_validation(
    sub: Episodes, sc: RoutedScores, sequence: np.ndarray, alpha: float,
    delta: float | None, seed: int = 0, splits: int = 20,
) -> tuple[float, float, float]:  # fmt: skip
    """(USD per question, coverage, estimated seconds per question) of a routed policy on
    the training questions ``sub`` from their out-of-fold scores ``sc``, as
    :func:`~ccpo.policies.single.validation_figures` scores a cascade: (τ̂, λ̂) by Pareto
    testing along ``sequence`` on random halves, the figures on the other halves; (inf, nan,
    nan) when some half is refused. The sequence was ordered on all of ``sub``, so the
    estimate leans a little to the routed side; it only ranks ``auto``'s candidates, on
    training questions (docs/theory.md, "auto: cross-fitting keeps the guarantee")."""
    rng = np.random.default_rng([seed, 0x5146])
    perms = np.stack([rng.permutation(sub.n) for _ in range(splits)])
    cost, covered, latency = [], [], []
    for p in perms:
        c, t = p[: sub.n // 2], p[sub.n // 2 :]
        try:
            tau, found = pareto_ltt(sub.subset(c), sc.take(c), alpha, delta, sequence)
        except Unreachable:
            return float("inf"), float("nan"), float("nan")
        m = routed_outcomes(sub, sc, tau, found.threshold, t)[2]
        cost.append(m.cost.mean())
        covered.append(m.covered.mean())
        latency.append(np.nan if m.latency is None else m.latency.mean())
    return float(np.mean(cost)), float(np.mean(covered)), float(np.mean(latency))


def out_of_fold(
    pol: RoutedPolicy, ep: Episodes, perm: np.ndarray, seed: int = 0, folds: int = 5
) -> tuple[Episodes, RoutedScores]:
    """(the training questions ``perm`` of ``ep``, in that order; their routed scores, each
    fold's from a router, fallback and stopping classifier fitted as ``pol`` was on the
    other folds): what the choices made on the training split are estimated on."""
    from ccpo.policies.single import fit_single

    k = folds if perm.size >= 10 * folds else 2
    parts = np.array_split(perm, k)
    sub = ep.subset(perm)
    probs = np.zeros((sub.n, ep.horizon))
    fb = None if pol.fallback is None else np.zeros((sub.n, ep.horizon))
    stops = np.zeros((ep.horizon, sub.n, ep.horizon))
    at = 0
    for j, held in enumerate(parts):
        rest = np.concatenate([p for i, p in enumerate(parts) if i != j])
        inner = fit_single(ep, rest, pol.inner.config, pol.inner.method, pol.inner.delta)
        router = fit_router(ep, rest, seed=seed, embedded=pol.fallback is not None)
        text = None if fb is None else fit_router(ep, rest, seed=seed)
        fold = RoutedPolicy(started_stopper(inner, ep, rest), router, fallback=text)
        sc = fold.episode_scores(ep.subset(held))
        got = slice(at, at + held.size)
        probs[got], stops[:, got] = sc.probs, sc.stops
        if fb is not None:
            fb[got] = sc.fallback_probs
        at += held.size
    assert sub.routes is not None
    return sub, RoutedScores(probs, stops, sub.routes.cost, pol.router, sub.routes.latency, fb)


def choose_tau(
    pol: RoutedPolicy, sub: Episodes, sc: RoutedScores, rng: np.random.Generator,
    splits: int = 20,
) -> tuple[float, dict[float, float]]:  # fmt: skip
    """The τ of :data:`TAUS` of least validation cost on the training questions ``sub``
    alone, from their out-of-fold scores ``sc`` (:func:`out_of_fold`): λ̂ by Learn-then-Test
    at δ on random halves (drawn from ``rng``), cost on the other halves; a τ that some half
    cannot certify costs +∞; ties go to the earlier τ (no routing first)."""
    halves = np.stack([rng.permutation(sub.n) for _ in range(splits)])
    cal, test = halves[:, : sub.n // 2], halves[:, sub.n // 2 :]
    figures: dict[float, float] = {}
    for tau in TAUS:
        costs = []
        for c, t in zip(cal, test, strict=True):
            try:
                found = ltt_threshold(sub.subset(c), sc.take(c).at(tau)[1], pol.alpha,
                                      pol.inner.level)  # fmt: skip
            except Unreachable:
                costs = [float("inf")]
                break
            costs.append(float(routed_outcomes(sub, sc, tau, found.threshold, t)[2].cost.mean()))
        figures[float(tau)] = float(np.mean(costs))
    best = min(figures, key=lambda t: (figures[t], TAUS.index(t)))
    return best, figures


def started_stopper(
    inner: SingleAnswerPolicy, ep: Episodes, train_idx: np.ndarray
) -> SingleAnswerPolicy:
    """``inner`` with its stopping classifier refitted on the training questions' rows of
    every start s (rounds s..T − 1 of the view started at s: what it will score once routed);
    a fixed rule (``depth-k``) or a constant score is kept as it is."""
    from ccpo.learning.config import StopConfig
    from ccpo.policies.classifier import fit_classifier, stop_features
    from ccpo.policies.cstop import STOPPING_METHODS

    if inner.model is None or isinstance(inner.model, float) or ep.routes is None:
        return inner
    sub = ep.subset(np.asarray(train_idx))
    y = reached_labels(sub)
    T = ep.horizon
    xs, ys = [], []
    for s in range(T - 1):
        x = stop_features(sub.routes.obs[s])
        xs.append(x[:, s : T - 1].reshape(-1, x.shape[-1]))
        ys.append(y[:, s : T - 1].reshape(-1))
    learner = StopConfig(**{**asdict(inner.config), "learner": STOPPING_METHODS[inner.method]})
    return replace(inner, model=fit_classifier(np.concatenate(xs), np.concatenate(ys), learner))


__all__ = [
    "NO_ROUTE", "ROUTE_FILE", "SUFFIX", "TAUS", "RoutedPolicy", "RoutedScores", "choose_tau",
    "joint_ltt", "out_of_fold", "route", "routed_fit", "routed_outcomes", "routed_validation",
    "started_stopper",
]  # fmt: skip
