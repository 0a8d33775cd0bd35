"""Single-answer policies: exactly one answer per question, calibrated along a fixed sequence.

After round t a stopping score h_t ∈ [0, 1] is computed from o_1..o_t; the episode stops at
the first round with h_t ≥ λ̂ (round T at the latest) and returns that round's answer
(:func:`ccpo.traces.episodes.answer_actions`). The score is a classifier of
:mod:`ccpo.policies.classifier` labelled "stopping here returns a correct answer"
(``cstop`` / ``cstop-lr``) or the fixed h_t = t/T (``depth-k``).

The loss is not monotone in λ, so split conformal does not apply: λ̂ is the last threshold
passed along the fixed sequence λ = 2 (run every round), 1, 1 − 1/G, …, 0, by conformal risk
control on the monotonised loss (the default, ``guarantee = "marginal"``: P(wrong answer on a
solvable question) ≤ α on average over calibration draws) or by fixed-sequence Learn-then-Test
(``"pac"``: P_cal(P(wrong answer on a solvable question) ≤ α) ≥ 1 − δ); derivations in
:mod:`ccpo.policies.risk_control` and docs/theory.md ("Learn-then-Test (single answer)",
"Marginal single answers"). When even running every round is not certified,
:func:`ltt_threshold` refuses with :class:`Unreachable`, naming the least α that is.

Main names: :class:`SingleAnswerPolicy`, :func:`fit_single`, :func:`ltt_threshold`,
:func:`validation_cost` (:func:`validation_figures`: with the estimated latency).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ccpo.errors import CCPOError
from ccpo.learning.config import StopConfig
from ccpo.policies.base import Answered, Calibration, Policy, RoundDecision
from ccpo.policies.classifier import (
    fit_classifier,
    round_scores,
    training_questions,
    training_rows,
)
from ccpo.policies.cstop import STOPPING_METHODS
from ccpo.policies.folder import load_classifier, save_classifier, shared_fields
from ccpo.policies.risk_control import (
    MARGINAL,
    PAC,
    allowed_misses,
    last_passing,
    marginal_questions,
    test_level,
)
from ccpo.policies.rules import depth_scores
from ccpo.traces.episodes import (
    NEXT,
    Episodes,
    Metrics,
    answer_actions,
    single_clears,
    single_losses,
    single_rollout,
    single_stops,
)
from ccpo.traces.featurize import FEATURE_SPEC
from ccpo.traces.latency import mean_latency
from ccpo.traces.schema import ACTIONS

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


def questions_for(alpha: float, delta: float = DELTA, share: float = 0.0) -> int:
    """The least number of calibration questions n at which a rule missing on ``share`` · α of
    them can be certified (:func:`allowed_misses` ≥ ⌈share · α · n⌉, and ≥ 0): ``share = 0``
    is the least n that can certify anything, ⌈log δ / log(1 − α)⌉."""
    import math

    if share <= 0.0:
        return max(1, math.ceil(math.log(delta) / math.log1p(-alpha) - 1e-12))
    n = questions_for(alpha, delta)
    while allowed_misses(n, alpha, delta) < math.ceil(share * alpha * n - 1e-9):
        n += 1  # one at a time: the least such n (k*(n) / n is not monotone in n)
    return n


def _too_few(n: int, alpha: float, delta: float) -> str:
    """ " (… certify nothing below N calibration questions)" when ``n`` is below that."""
    need = questions_for(alpha, delta)
    if n >= need:
        return ""
    return f"; at α = {alpha:g} nothing can be certified on fewer than {need} calibration questions"


def ltt_threshold(
    ep: Episodes,
    scores: np.ndarray,
    alpha: float,
    delta: float | None = DELTA,
    grid: int = GRID,
    *also: np.ndarray,
    like: int | None = None,
) -> Calibration:
    """λ̂ by fixed-sequence testing on the calibration questions ``ep`` with stopping scores
    ``scores`` [n, T] (module docstring); ``delta`` None: by conformal risk control, a
    marginal guarantee (:mod:`ccpo.policies.risk_control`). With ``also`` (more score arrays
    of the same questions), a question's loss is its worst under any of them, so λ̂ holds
    whichever one each question meets (a router's fallback: docs/theory.md). ``like``: the
    test emulates that many calibration questions (``auto``'s validation:
    :func:`~ccpo.policies.risk_control.passes`). Raises :class:`Unreachable` when λ_0 is
    not certified."""
    n = ep.n
    if n < 1:
        raise CCPOError("cannot calibrate a single-answer policy on zero questions")
    lams = candidate_thresholds(grid)
    loss = single_losses(ep, scores, lams)
    for other in also:
        loss = loss | single_losses(ep, other, lams)
    k = loss.sum(-1)  # [M]
    last = last_passing(loss, alpha, delta, like)
    if last < 0:
        raise unreachable(alpha, delta, int(k[0]), n, ep.horizon)
    return Calibration(float(lams[last]), int(k[last]), n, int(last + 1))


def unreachable(alpha: float, delta: float | None, k0: int, n: int, horizon: int) -> Unreachable:
    """The refusal when the most conservative rule (all ``horizon`` rounds, round T's answer)
    misses on ``k0`` of ``n`` calibration questions: it names the α that is certified
    (``delta`` None: the marginal bound (k0 + 1)/(n + 1))."""
    if delta is None:
        need = marginal_questions(alpha)
        few = (f"; at α = {alpha:g} nothing can be certified on fewer than {need} calibration "
               "questions" if n < need else "")  # fmt: skip
        reach = f"{(k0 + 1) / (n + 1):.3f} (marginal){few}"
    else:
        reach = f"{reachable_alpha(k0, n, delta):.3f} at δ = {delta:g}{_too_few(n, alpha, delta)}"
    return Unreachable(
        f"a single answer cannot be certified at α = {alpha:g}: even running all "
        f"{horizon} rounds and returning round {horizon}'s answer misses on "
        f"{k0} of {n} calibration questions, which certifies α ≥ {reach}; "
        "use a larger --alpha, more questions, or --answer set (a set can hold the earlier "
        "right answer)"
    )


def reached_labels(ep: Episodes) -> np.ndarray:
    """[n, T] bool: stopping at round t returns a correct answer, or q is unsolvable."""
    act = answer_actions(ep.answered)
    hit = np.take_along_axis(ep.correct, act[..., None], -1)[..., 0]
    return hit | ~ep.solvable[:, None]


# ----------------------------------------------------------------------------- artifact
@dataclass
class SingleAnswerPolicy(Policy):
    """A single-answer policy: the stopping-score classifier, T, λ̂ (``lam``), α and δ."""

    model: Any  # fitted classifier, a float (constant score), or None (depth-k)
    horizon: int
    config: StopConfig
    variant: str = "cstop-single"
    delta: float = DELTA
    lam: float | None = None  # λ̂ (RUN_ALL: always run T rounds); None: not calibrated
    feature_spec: dict[str, Any] = field(default_factory=lambda: dict(FEATURE_SPEC))
    prices: dict[str, Any] | None = None
    log: list[dict[str, float]] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)

    answer = "single"

    @property
    def alpha(self) -> float:
        return self.config.alpha

    @property
    def method(self) -> str:
        return self.variant.removesuffix(SUFFIX)

    @property
    def threshold(self) -> float:
        """λ̂, the stopping threshold in force."""
        if self.lam is None:
            raise CCPOError(f"the {self.variant} policy is not calibrated yet (no λ̂)")
        return self.lam

    def set_threshold(self, value: float) -> None:
        self.lam = float(value)

    @property
    def is_calibrated(self) -> bool:
        return self.lam is not None

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

    def scores(self, obs: np.ndarray) -> np.ndarray:
        return self.stop_scores(obs)

    @property
    def marginal(self) -> bool:
        """λ̂ holds on average over calibration draws (conformal risk control), not with
        probability 1 − δ (:mod:`ccpo.policies.risk_control`)."""
        return self.config.guarantee == MARGINAL

    @property
    def level(self) -> float | None:
        """What the calibration tests at: δ, or None for the marginal guarantee."""
        return test_level(self.config.guarantee, self.delta)

    def calibrate(self, ep: Episodes, cal: np.ndarray | None = None) -> Calibration:
        """λ̂ by Learn-then-Test (or conformal risk control: :attr:`marginal`) on the
        calibration questions (sets ``lam``)."""
        sub = ep if cal is None else ep.subset(cal)
        found = ltt_threshold(sub, self.stop_scores(sub.obs), self.alpha, self.level)
        self.lam = found.threshold
        return found

    def split_thresholds(
        self, ep: Episodes, scores: np.ndarray, cal: np.ndarray, alpha: float
    ) -> tuple[np.ndarray, np.ndarray]:
        return calibrate_splits(ep, scores, alpha, self.level, cal)

    def rollout(
        self, ep: Episodes, scores: np.ndarray, thresholds: Any, idx: np.ndarray | None = None
    ) -> Metrics:
        return single_rollout(ep, scores, thresholds, idx)

    def replay_answers(self, ep: Episodes) -> tuple[np.ndarray, np.ndarray]:
        """Rounds 1..stop run, and the one answer action of the stop round."""
        stop = single_stops(self.stop_scores(ep.obs), self.threshold)
        reach = np.arange(ep.horizon) <= stop[:, None]
        rows = np.arange(ep.n)
        included = np.zeros((ep.n, ep.horizon, 2), dtype=bool)
        included[rows, stop, answer_actions(ep.answered)[rows, stop]] = True
        return reach, included

    def decide(
        self, obs: np.ndarray, t: int, threshold: float | None, answered: Answered
    ) -> RoundDecision:
        """Stop at round t iff it clears λ (``threshold``; ``None``: λ̂), by the replay's own
        rule: going on, no answer joins (π = (0, 0, 1)); stopping, the one answer action of
        :func:`ccpo.traces.episodes.answer_actions` (π one-hot on it)."""
        lam = self.threshold if threshold is None else float(threshold)
        h = self.stop_scores(obs)  # row t depends on rows t, t − 1 only: as in the replay
        p = np.zeros(3)
        if not single_clears(h, lam)[t - 1]:
            p[NEXT] = 1.0
            return RoundDecision(p, (), fallback=False, go_on=True)
        a = int(answer_actions(np.array([answered()]))[0])
        p[a] = 1.0
        return RoundDecision(p, (ACTIONS[a],), fallback=False, go_on=False)

    # ------------------------------------------------------------------ persistence
    def save(self, folder: str | Path) -> Path:
        meta = {**self.folder_header(), "delta": self.delta, "lambda_hat": self.lam}
        return save_classifier(folder, meta, (self.feature_spec, self.prices, self.log), self.model)

    @classmethod
    def load(cls, folder: str | Path, meta: dict[str, Any]) -> SingleAnswerPolicy:
        """Load a folder whose policy.json says ``"answer": "single"`` (a pickle made by this
        ccpo: only load folders you trust; another scikit-learn version is refused). λ̂ is
        ``lambda_hat``, or ``kappa_batch`` in folders of ccpo 0.1."""
        model, side = load_classifier(
            folder, meta, f"ccpo train --method {meta['method']} --answer single"
        )
        return cls(
            model=model,
            horizon=int(meta["horizon"]),
            # folders made before the marginal guarantee were certified by Learn-then-Test
            config=StopConfig(**{"guarantee": PAC, **meta["config"]}),
            variant=meta.get("variant", single_name(meta["method"])),
            delta=float(meta.get("delta", DELTA)),
            lam=meta["lambda_hat"] if "lambda_hat" in meta else meta.get("kappa_batch"),
            **shared_fields(meta, side),
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
    idx, T = training_questions(ep, train_idx, "a single-answer policy")
    name = single_name(method)
    if method == "depth-k":
        return SingleAnswerPolicy(None, T, cfg, name, delta)
    sub = ep.subset(idx)
    y = reached_labels(sub)[:, :-1].reshape(-1)
    learner = StopConfig(**{**asdict(cfg), "learner": STOPPING_METHODS[method]})
    model = fit_classifier(training_rows(sub.obs), y, learner)
    pol = SingleAnswerPolicy(model, T, cfg, name, delta)
    pol.log.append({"fit/rows": float(y.size), "fit/correct_rate": float(y.mean())})
    return pol


def calibrate_splits(
    ep: Episodes, scores: np.ndarray, alpha: float, delta: float | None, cal: np.ndarray,
    like: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """λ̂ of every calibration split ``cal`` [K, n] (question indices of ``ep``) and whether
    it was refused ([K] bool; a refused split gets :data:`RUN_ALL`, the most conservative
    rule, so that the harness can still score what such a policy would do). ``like``: each
    split emulates that many calibration questions (:func:`ltt_threshold`)."""
    lams = np.full(len(cal), RUN_ALL)
    refused = np.zeros(len(cal), dtype=bool)
    for k, c in enumerate(cal):
        try:
            lams[k] = ltt_threshold(ep.subset(c), scores[c], alpha, delta, like=like).threshold
        except Unreachable:
            refused[k] = True
    return lams, refused


def _refused(ep: Episodes, scores: np.ndarray, alpha: float, delta: float | None, like: int):
    """Whether the emulated test (``like``) refuses on all of ``ep``'s questions."""
    try:
        ltt_threshold(ep, scores, alpha, delta, like=like)
    except Unreachable:
        return True
    return False


def validation_cost(
    ep: Episodes, scores: np.ndarray, alpha: float, delta: float | None, splits: int = 20, seed=0,
    like: int | None = None,
) -> tuple[float, float]:  # fmt: skip
    """(cost USD per question, coverage) of the calibrated rule on ``ep`` as the harness
    measures it: λ̂ by LTT on random halves, scored on the others; (inf, nan) when some half
    cannot be calibrated. Used by ``auto`` on out-of-fold scores of training questions.
    ``like``: the halves emulate that many calibration questions (``train``'s calibration
    split: :func:`~ccpo.policies.risk_control.passes`)."""
    cost, coverage, _ = validation_figures(ep, scores, alpha, delta, splits, seed, like)
    return cost, coverage


def validation_figures(
    ep: Episodes, scores: np.ndarray, alpha: float, delta: float | None, splits: int = 20, seed=0,
    like: int | None = None,
) -> tuple[float, float, float]:  # fmt: skip
    """:func:`validation_cost` and the estimated seconds per question of the same replay
    (:mod:`ccpo.traces.latency`); (inf, nan, nan) when some half cannot be calibrated. With
    ``like`` a half that cannot is scored running every round (λ_0, what its calibration
    keeps at best), and the candidate is out (inf) only when all of ``ep`` cannot: a few dozen
    questions' halves refuse by chance where ``like`` calibration questions would not."""
    rng = np.random.default_rng([seed, 0x5146])
    perms = np.stack([rng.permutation(ep.n) for _ in range(splits)])
    cal, test = perms[:, : ep.n // 2], perms[:, ep.n // 2 :]
    lams, refused = calibrate_splits(ep, scores, alpha, delta, cal, like)
    if refused.any() and (like is None or _refused(ep, scores, alpha, delta, like)):
        return float("inf"), float("nan"), float("nan")
    m = single_rollout(ep, scores, lams, test)
    latency = mean_latency(ep.round_latency, test, m)
    return float(m.cost.mean()), float(m.covered.mean()), latency
