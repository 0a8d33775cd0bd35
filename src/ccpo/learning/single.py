"""Single-answer policies: exactly one answer per question, calibrated by Learn-then-Test.

A set policy (:mod:`ccpo.learning.stopping`, CCPO) returns every answer it collected; an app
needs one. A **single-answer policy** stops at some round and returns that round's answer.

**Rule.** After round t a stopping score h_t ∈ [0, 1] is computed from o_1..o_t; the episode
stops at the first round with h_t ≥ λ (at round T at the latest) and returns the answer of
that round given by :func:`ccpo.traces.episodes.answer_actions`: the guide's answer (the
stronger model of the round; it repeats the base's when it agreed), or the base's where the
guide gave none. The replay (:func:`ccpo.traces.episodes.single_rollout`) and the live decision
(:func:`ccpo.runtime.decision.decide`) share the stopping rule
:func:`ccpo.traces.episodes.single_clears`.

The score (``cstop`` / ``cstop-lr`` learners of CStop, same features
:func:`ccpo.learning.stopping.stop_features`) is a classifier fitted on the training questions,
one row per (question, round t < T), labelled

    y_t = 1[round t's returned answer is correct, or the question is unsolvable],

so h_t = P̂(stopping here is not a miss | o_1..o_t). ``depth-k`` uses h_t = t/T (stop at a
fixed round). A poor score costs money, never the guarantee.

**Loss.** L_q(λ) = 1[the answer returned at λ is wrong and q is solvable] (the calibration
convention of the set policies: an unsolvable question is never held against the policy).
L is *not* monotone in λ: a larger λ runs more rounds, and a later round can be wrong where an
earlier one was right. Split conformal (which needs nested sets) therefore does not apply.

**Calibration: Learn-then-Test with fixed-sequence testing** (Angelopoulos, Bates, Candès,
Jordan & Lei 2021). Fix, before seeing calibration data, the candidate thresholds in the order
λ_0 = 2 (above every score in [0, 1]: run all T rounds, return round T's answer; the most
conservative rule), then λ_1 = 1, λ_2 = 1 − 1/G, …, λ_G = 0 (G = :data:`GRID`), from most
rounds to fewest. Let
R(λ) = E[L_q(λ)] for a new question q (the classifier is fitted on other questions and held
fixed). For each j test H_j : R(λ_j) > α with the calibration questions q_1..q_n (i.i.d. from
the same distribution as q): k_j = Σ_i L_{q_i}(λ_j) is Binomial(n, R(λ_j)), so

    p_j = P(Binomial(n, α) ≤ k_j)

is a valid p-value for H_j (under H_j, Binomial(n, R) is stochastically larger than
Binomial(n, α), hence P(p_j ≤ u) ≤ u). Fixed-sequence testing rejects H_0, H_1, … while
p_j ≤ δ and stops at the first j with p_j > δ; λ̂ = the last rejected λ_j. It controls the
family-wise error rate at δ: a wrong λ̂ (R(λ̂) > α) needs the first true null of the sequence
to be rejected, which has probability ≤ δ. Hence

    P_calibration( R(λ̂) ≤ α ) ≥ 1 − δ,   R(λ̂) = P_q(answer wrong and q solvable),

i.e. with probability ≥ 1 − δ over the calibration draw, a new question gets a correct answer
or is unsolvable with probability ≥ 1 − α (the coverage convention of the set policies), for
*any* loss, monotone or not. On label-free traces (labels by agreement with a reference model,
:mod:`ccpo.traces.labels`) every question is solvable and this reads: the answer equals the
reference's with probability ≥ 1 − α. Marginally over calibration and test,
E[L] ≤ α + δ(1 − α) at worst; in practice the binomial test is conservative and the measured
miss rate is below α (see the tests).

**When even λ_0 fails** (round T's answer is wrong on too many solvable calibration questions,
e.g. a final round wrong where an earlier one was right), no threshold is certified:
:func:`ltt_threshold` refuses with :class:`Unreachable`, naming the least α the most
conservative rule certifies at this δ and n, α_min = the Clopper–Pearson upper bound
Beta⁻¹(1 − δ; k_0 + 1, n − k_0) (the least α with P(Binomial(n, α) ≤ k_0) ≤ δ), and
suggesting ``--answer set``.

:func:`fit_single` fits; :class:`SingleAnswerPolicy` is the artifact (``answer = "single"``);
:func:`fit_single_method` is the one entry point (``auto`` cross-fits the candidates and keeps
the least validation cost among those whose calibration succeeds).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ccpo.errors import CCPOError
from ccpo.learning.stopping import (
    STOPPING_METHODS,
    StopConfig,
    _make_learner,
    load_classifier_folder,
    round_scores,
    save_classifier_folder,
    stop_features,
)
from ccpo.traces.episodes import (
    Episodes,
    answer_actions,
    single_losses,
    single_rollout,
)
from ccpo.traces.featurize import FEATURE_SPEC

GRID = 1000
"""Candidate thresholds after :data:`RUN_ALL`: 1, 1 − 1/GRID, …, 0 (fixed before calibration)."""
RUN_ALL = 2.0
"""λ_0: above every stopping score, so the episode runs all T rounds."""
DELTA = 0.1
"""Default δ: the guarantee holds with probability ≥ 1 − δ over the calibration draw."""
SINGLE_METHODS = ("cstop", "cstop-lr", "depth-k")
"""Methods that have a single-answer form (``--answer single``); ``auto`` picks among them."""
SUFFIX = "-single"


class Unreachable(CCPOError):
    """Even the most conservative rule is not certified at this α: use a larger α or sets."""


def single_name(method: str) -> str:
    """The row / variant name of a single-answer method: ``cstop`` → ``cstop-single``."""
    return method + SUFFIX


# ----------------------------------------------------------------------------- pure pieces
def candidate_thresholds(grid: int = GRID) -> np.ndarray:
    """λ_0 = :data:`RUN_ALL`, then 1, 1 − 1/G, …, 0: the fixed order of the test (most rounds
    first)."""
    return np.concatenate([[RUN_ALL], np.arange(grid, -1, -1) / grid])


def binomial_pvalues(losses: np.ndarray, n: int, alpha: float) -> np.ndarray:
    """p_j = P(Binomial(n, α) ≤ k_j) for miss counts ``losses`` (k_j): valid p-values for
    H_j : R(λ_j) > α (see the module docstring)."""
    from scipy.stats import binom

    return binom.cdf(np.asarray(losses), n, alpha)


def reachable_alpha(k: int, n: int, delta: float) -> float:
    """The least α at which k misses in n pass the binomial test at δ: the Clopper–Pearson
    upper bound Beta⁻¹(1 − δ; k + 1, n − k) (1 when k = n)."""
    from scipy.stats import beta

    return 1.0 if k >= n else float(beta.ppf(1.0 - delta, k + 1, n - k))


@dataclass(frozen=True)
class Calibration:
    """What :func:`ltt_threshold` found: λ̂, its calibration miss count, and n."""

    threshold: float  # λ̂ (RUN_ALL: run all T rounds)
    misses: int  # Σ L_i(λ̂) on the calibration questions
    n: int
    tested: int  # hypotheses rejected (λ_0 … λ̂)


def ltt_threshold(
    ep: Episodes, scores: np.ndarray, alpha: float, delta: float = DELTA, grid: int = GRID
) -> Calibration:
    """λ̂ by fixed-sequence testing on the calibration questions ``ep`` with stopping scores
    ``scores`` [n, T] (module docstring). Raises :class:`Unreachable` when λ_0 is not
    certified."""
    n = ep.n
    if n < 1:
        raise CCPOError("cannot calibrate a single-answer policy on zero questions")
    lams = candidate_thresholds(grid)
    k = single_losses(ep, scores, lams).sum(-1)  # [M]
    p = binomial_pvalues(k, n, alpha)
    fails = np.flatnonzero(p > delta)
    last = (fails[0] if fails.size else lams.size) - 1
    if last < 0:
        raise Unreachable(
            f"a single answer cannot be certified at α = {alpha:g}: even running all "
            f"{ep.horizon} rounds and returning round {ep.horizon}'s answer misses on "
            f"{int(k[0])} of {n} calibration questions, which certifies α ≥ "
            f"{reachable_alpha(int(k[0]), n, delta):.3f} at δ = {delta:g}; use a larger "
            "--alpha, or --answer set (a set can hold the earlier right answer)"
        )
    return Calibration(float(lams[last]), int(k[last]), n, int(last + 1))


def reached_labels(ep: Episodes) -> np.ndarray:
    """[n, T] bool: stopping at round t returns a correct answer, or q is unsolvable."""
    act = answer_actions(ep.answered)
    hit = np.take_along_axis(ep.correct, act[..., None], -1)[..., 0]
    return hit | ~ep.solvable[:, None]


def depth_scores(horizon: int) -> np.ndarray:
    """``depth-k`` single: h_t = t/T, so λ picks a fixed depth (shape [T])."""
    return np.arange(1, horizon + 1) / horizon


# ----------------------------------------------------------------------------- artifact
@dataclass
class SingleAnswerPolicy:
    """A single-answer policy: the stopping-score classifier, T, λ̂ (``kappa``), α, δ.

    Duck-types the set policies where the harness and the live agent use them (``alpha``,
    ``kappa``, ``kappa_batch``, ``variant``, ``scoring``, ``save``); ``answer = "single"`` and
    :meth:`stop_scores` are what :func:`ccpo.runtime.decision.decide` branches on."""

    model: Any  # fitted classifier, a float (constant score), or None (depth-k)
    horizon: int
    config: StopConfig
    variant: str = "cstop-single"
    delta: float = DELTA
    kappa_batch: float | None = None  # λ̂ (RUN_ALL: always run T rounds)
    feature_spec: dict[str, Any] = field(default_factory=lambda: dict(FEATURE_SPEC))
    prices: dict[str, Any] | None = None
    log: list[dict[str, float]] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)

    answer = "single"
    scoring = "single"
    kappa_online = None

    @property
    def alpha(self) -> float:
        return self.config.alpha

    @property
    def method(self) -> str:
        return self.variant.removesuffix(SUFFIX)

    @property
    def kappa(self) -> float:
        """λ̂, the stopping threshold in force."""
        if self.kappa_batch is None:
            raise CCPOError(f"the {self.variant} policy is not calibrated yet (no λ̂)")
        return self.kappa_batch

    def stop_scores(self, obs: np.ndarray) -> np.ndarray:
        """h_t for observations [..., T, F] (1 at round T, where the episode stops anyway).
        Row t depends on observation rows t and t − 1 only (live = replay)."""
        obs = np.asarray(obs)
        if obs.ndim < 2 or obs.shape[-2] != self.horizon:
            raise ValueError(f"obs must have shape [..., {self.horizon}, F], got {obs.shape}")
        lead = obs.shape[:-2]
        if self.model is None:
            return np.broadcast_to(depth_scores(self.horizon), (*lead, self.horizon)).copy()
        out = np.ones((*lead, self.horizon))
        out[..., :-1] = np.clip(round_scores(self.model, obs), 0.0, 1.0)
        return out

    def calibrate(self, ep: Episodes) -> Calibration:
        """λ̂ by Learn-then-Test on the calibration questions ``ep`` (sets ``kappa_batch``)."""
        cal = ltt_threshold(ep, self.stop_scores(ep.obs), self.alpha, self.delta)
        self.kappa_batch = cal.threshold
        return cal

    # ------------------------------------------------------------------ persistence
    def save(self, folder: str | Path) -> Path:
        meta = {
            "method": self.method,
            "variant": self.variant,
            "answer": self.answer,
            "alpha": self.alpha,
            "delta": self.delta,
            "kappa_online": None,
            "kappa_batch": self.kappa_batch,
            "horizon": self.horizon,
            "config": asdict(self.config),
            "info": self.info,
            "provenance": self.provenance,
        }
        return save_classifier_folder(folder, meta, self, self.model)

    @classmethod
    def load(cls, folder: str | Path, meta: dict[str, Any]) -> SingleAnswerPolicy:
        """Load a folder whose policy.json says ``"answer": "single"`` (a pickle made by this
        ccpo: only load folders you trust; another scikit-learn version is refused)."""
        model, spec, prices, log = load_classifier_folder(
            folder, meta, f"ccpo train --method {meta['method']} --answer single"
        )
        return cls(
            model=model,
            horizon=int(meta["horizon"]),
            config=StopConfig(**meta["config"]),
            variant=meta.get("variant", single_name(meta["method"])),
            delta=float(meta.get("delta", DELTA)),
            kappa_batch=meta.get("kappa_batch"),
            feature_spec=spec,
            prices=prices,
            log=log,
            info=meta.get("info") or {},
            provenance=meta.get("provenance") or {},
        )


# ----------------------------------------------------------------------------- fitting
def fit_single(
    ep: Episodes, train_idx: np.ndarray, cfg: StopConfig, method: str = "cstop", delta=DELTA
) -> SingleAnswerPolicy:
    """Fit the stopping score of ``method`` (:data:`SINGLE_METHODS`) on ``train_idx``
    (rows t < T); not calibrated yet (call :meth:`SingleAnswerPolicy.calibrate`)."""
    if method not in SINGLE_METHODS:
        raise CCPOError(
            f"--answer single: method must be auto or one of {', '.join(SINGLE_METHODS)}, "
            f"got '{method}'"
        )
    idx = np.asarray(train_idx)
    if idx.size == 0:
        raise CCPOError("cannot fit a single-answer policy on zero training questions")
    T = ep.horizon
    if T < 2:
        raise CCPOError("a single-answer policy needs traces with at least 2 rounds")
    name = single_name(method)
    if method == "depth-k":
        return SingleAnswerPolicy(None, T, cfg, name, delta)
    sub = ep.subset(idx)
    x = stop_features(sub.obs)[:, :-1].reshape(-1, 2 * ep.obs.shape[-1])
    y = reached_labels(sub)[:, :-1].reshape(-1)
    if y.all() or not y.any():
        model: Any = float(y.mean())
    else:
        from threadpoolctl import threadpool_limits

        model = _make_learner(StopConfig(**{**asdict(cfg), "learner": STOPPING_METHODS[method]}))
        with threadpool_limits(limits=1):
            model.fit(x, y)
    pol = SingleAnswerPolicy(model, T, cfg, name, delta)
    pol.log.append({"fit/rows": float(y.size), "fit/correct_rate": float(y.mean())})
    return pol


def calibrate_splits(
    ep: Episodes, scores: np.ndarray, alpha: float, delta: float, cal: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """λ̂ of every calibration split ``cal`` [K, n] (question indices of ``ep``) and whether
    it was refused ([K] bool; a refused split gets :data:`RUN_ALL`, the most conservative
    rule, so that the harness can still score what such a policy would do)."""
    lams = np.full(len(cal), RUN_ALL)
    refused = np.zeros(len(cal), dtype=bool)
    for k, c in enumerate(cal):
        try:
            lams[k] = ltt_threshold(ep.subset(c), scores[c], alpha, delta).threshold
        except Unreachable:
            refused[k] = True
    return lams, refused


def validation_cost(
    ep: Episodes, scores: np.ndarray, alpha: float, delta: float, splits: int = 20, seed=0
) -> tuple[float, float]:
    """(cost USD per question, coverage) of the calibrated rule on ``ep`` as the harness
    measures it: λ̂ by LTT on random halves, scored on the others; (inf, nan) when some half
    cannot be calibrated. Used by ``auto`` on out-of-fold scores of training questions."""
    rng = np.random.default_rng([seed, 0x5146])
    perms = np.stack([rng.permutation(ep.n) for _ in range(splits)])
    cal, test = perms[:, : ep.n // 2], perms[:, ep.n // 2 :]
    lams, refused = calibrate_splits(ep, scores, alpha, delta, cal)
    if refused.any():
        return float("inf"), float("nan")
    m = single_rollout(ep, scores, lams, test)
    return float(m.cost.mean()), float(m.covered.mean())


def fit_single_method(
    method: str,
    ep: Episodes,
    train_idx: np.ndarray,
    alpha: float,
    seed: int = 0,
    delta: float = DELTA,
    candidates: Sequence[str] = SINGLE_METHODS,
    settings: dict[str, Any] | None = None,
    folds: int = 5,
) -> SingleAnswerPolicy:
    """The one entry point of the CLI, the API and the harness for ``--answer single``:
    ``auto`` cross-fits ``candidates`` on the training questions (K folds), scores each by
    :func:`validation_cost` of its out-of-fold scores, and refits the cheapest that can be
    calibrated on all of ``train_idx`` (its choice in ``info["auto"]``); any other name is fitted
    as is. Only training questions are used: the calibration questions stay untouched."""
    kw = {k: v for k, v in (settings or {}).items() if k not in ("alpha", "seed", "learner")}
    cfg = StopConfig(alpha=alpha, seed=seed, **kw)
    if method != "auto":
        return fit_single(ep, train_idx, cfg, method, delta)
    idx = np.asarray(train_idx)
    k = max(2, min(folds, idx.size // 10)) if idx.size >= 20 else 1
    perm = np.random.default_rng([seed, 0xA071]).permutation(idx)
    parts = np.array_split(perm, k) if k > 1 else [perm]
    sub = ep.subset(perm)
    figures: dict[str, dict[str, float]] = {}
    for name in candidates:
        scores = np.zeros((perm.size, ep.horizon))
        start = 0
        for i, held in enumerate(parts):
            rest = np.concatenate([p for j, p in enumerate(parts) if j != i]) if k > 1 else held
            pol = fit_single(ep, rest, cfg, name, delta)
            scores[start : start + held.size] = pol.stop_scores(ep.obs[held])
            start += held.size
        c, cov = validation_cost(sub, scores, alpha, delta, seed=seed)
        figures[name] = {"cost_cents_per_question": c * 100, "coverage": cov}
    best = min(candidates, key=lambda n: figures[n]["cost_cents_per_question"])
    pol = fit_single(ep, idx, cfg, best, delta)
    pol.info = {"auto": {"picked": best, "folds": k, "validation": figures}}
    return pol
