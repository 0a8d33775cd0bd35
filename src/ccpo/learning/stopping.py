"""CStop — conformal stopping on replayed traces: the method beyond the paper.

A trace holds every round that was run, so at training time the outcome of every stopping
choice is known. CStop learns from all of it with a supervised classifier instead of sampled
policy gradients, and keeps the paper's conformal family C_κ so that every piece of the
harness (calibration, replay, live ``ask`` / ``serve``) is shared with CCPO.

**Rule.** After round t the answers of rounds 1..t are all in the set (base and guide), and the
agent goes on to round t+1 iff its *continuation score* g_t ≥ κ (t < T):

    g_t = P̂( no answer of rounds 1..t is correct, and some later one is | o_1..o_t ),

the probability that paying for more rounds can still fix the question ("fixable"), estimated
by a gradient-boosted classifier (scikit-learn's ``HistGradientBoostingClassifier``; a logistic
regression as the ``logistic`` learner) fitted on the training questions, one row per
(question, round t < T), with the label read off the replayed trace. Its features are o_t and
o_{t−1} (:func:`stop_features`): rounds 1..t only, never ``correct``. Unsolvable questions are
never fixable, so the score learns to stop on them early, which is where a coverage-driven
score (P(uncovered so far)) would waste the most.

**As membership scores.** In the conformal-policy notation of :mod:`ccpo.traces.episodes`,
e(base|o_t) = e(guide|o_t) = 1 and e(next|o_t) = g_t, so C_κ(o_t) = {base, guide} ∪ {next if
g_t ≥ κ} for κ ∈ [0, 1] — exactly C(o) = {a : e(a|o) ≥ κ} with the set-valued rollout. The sets
are nested (κ' ≤ κ ⇒ every question runs at least as many rounds and returns a superset), a
monotone family, so split conformal applies unchanged.

**Guarantee (derivation).** Let t*(q) be the first round holding a correct answer. The
question is covered at κ iff the rollout reaches t*, i.e. iff

    s(q) = min_{t < t*(q)} g_t(q) ≥ κ     (s = +∞ when t* = 1 or q is unsolvable),

which is :func:`ccpo.traces.episodes.covering_scores` for these membership scores. The
classifier is fitted on the training split only, so for calibration questions q_1..q_n and a
test question q exchangeable with them the scores s(q_1..q_n), s(q) are exchangeable. With
κ̂ = the k-th smallest calibration score, k = ⌊α(n+1)⌋ (κ̂ = 0 when k = 0:
:func:`ccpo.learning.conformal.split_conformal_threshold`), the rank argument of split conformal
prediction (Vovk et al. 2005; Angelopoulos & Bates 2023, Thm. D.1) gives

    P(q covered) = P(s(q) ≥ κ̂) ≥ 1 − k/(n+1) ≥ 1 − α,

over the draw of the calibration and test questions, for *any* classifier — a poor one costs
money, never coverage. (Clipping κ̂ to [0, 1] only enlarges the sets.)

**Why it is cheap.** Fitting is one classifier on ≤ (T−1)·n_train rows (well under a second
for 1,000 questions); the score does not depend on α, so one fit serves every α.

:func:`fit_stopping` fits; :class:`StoppingPolicy` is the artifact (``probs`` gives the
membership scores above, so ``covering_scores`` / ``conformal_rollout`` / the live agent use it
like a CCPO π). :func:`depth_schedule` gives the ``depth-k`` baseline in the same family, and
:func:`select_method` is ``--method auto``: it picks the candidate of least *validation
calibrated cost* by K-fold cross-fitting on the training split (never the calibration split, so
the guarantee above still holds for the choice).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ccpo.errors import CCPOError
from ccpo.learning.artifact import read_side_files, write_folder
from ccpo.learning.conformal import CalibrationScores, check_alpha
from ccpo.learning.replay import calibrated_cost
from ccpo.learning.trees import compile_hgb
from ccpo.traces.episodes import NEXT, Episodes
from ccpo.traces.featurize import FEATURE_NAMES, FEATURE_SPEC

Learner = Literal["hgb", "logistic"]
#: method name → learner of the stopping classifier (``depth-k``: none, a fixed schedule)
STOPPING_METHODS: dict[str, Learner] = {"cstop": "hgb", "cstop-lr": "logistic"}
#: fixed rules in the same family (nothing to learn; κ̂ still calibrates them)
FIXED_RULES = ("depth-k", "agree-k")
SCORE_METHODS = (*STOPPING_METHODS, *FIXED_RULES)
#: what ``--method auto`` chooses among by default: the score methods (cheap to cross-fit)
#: and CCPO in bounded time (:mod:`ccpo.learning.candidates`)
AUTO_CANDIDATES = ("cstop", "cstop-lr", "depth-k", "agree-k", "ccpo")


@dataclass
class StopConfig:
    """Hyperparameters of CStop (defaults measured on the bundled sets, see the benchmark)."""

    alpha: float = 0.1  # miscoverage level α the artifact is calibrated for
    learner: Learner = "hgb"  # "hgb": HistGradientBoostingClassifier; "logistic"
    max_iter: int = 200  # boosting iterations (hgb)
    learning_rate: float = 0.05  # shrinkage (hgb)
    max_leaf_nodes: int = 15  # leaves per tree (hgb)
    min_samples_leaf: int = 20  # smallest leaf (hgb)
    l2_regularization: float = 1.0  # leaf-value L2 penalty (hgb)
    c: float = 1.0  # inverse L2 strength (logistic)
    seed: int = 0  # seeds the learner
    # auto: CCPO training steps per cross-fitting fold (0: CCPO is not a candidate)
    auto_ccpo_steps: int = 300
    # online κ tracker of `ccpo serve --adapt-kappa` (κ̂ steps per feedback)
    eta0: float = 0.05
    xi: float = 0.1
    batch_size: int = 1

    def __post_init__(self) -> None:
        check_alpha(self.alpha)
        if self.learner not in ("hgb", "logistic"):
            raise ValueError(f"learner must be 'hgb' or 'logistic', got {self.learner!r}")
        if self.auto_ccpo_steps < 0:
            raise ValueError(f"auto_ccpo_steps must be >= 0, got {self.auto_ccpo_steps}")


# ----------------------------------------------------------------------------- pure pieces
def stop_features(obs: np.ndarray) -> np.ndarray:
    """Classifier inputs per round: [o_t, o_{t−1}] (zeros for t = 1), shape [..., T, 2F].

    Row t depends on observation rows t and t−1 only, so a live agent that has run t rounds
    (later rows zero-padded) gets the same row t as replay.
    """
    obs = np.asarray(obs, dtype=np.float64)
    prev = np.zeros_like(obs)
    prev[..., 1:, :] = obs[..., :-1, :]
    return np.concatenate([obs, prev], axis=-1)


def fixable_labels(correct: np.ndarray, solvable: np.ndarray) -> np.ndarray:
    """[n, T] bool: no answer of rounds 1..t is correct, but one of a later round is.

    ``correct`` [n, T, 2], ``solvable`` [n]. This is the event that going on can still fix
    the question; it is False at t = T.
    """
    hit = np.asarray(correct).any(-1)
    so_far = np.logical_or.accumulate(hit, axis=-1)
    return ~so_far & np.asarray(solvable)[:, None]


def fixable_probability(model: Any, rows: np.ndarray) -> np.ndarray:
    """P̂(fixable) for classifier rows ``[n, 2F]``, each row's value independent of the others.

    A row's score must not depend on which rows share its batch: κ̂ is the score of a
    calibration question (computed in a batch of all of them), and a live question (a batch
    of its own rounds) whose score equals κ̂ must compare equal to it. BLAS matrix-vector
    products round a row differently by its position and the batch size (OpenBLAS's gemv
    blocks rows), so the logistic learner's z = ((x − μ)/σ)·w + b is summed here row by row
    (an elementwise product reduced along the row) instead of by ``predict_proba``. The
    gradient-boosted learner's trees are walked row by row from their compiled form
    (:mod:`ccpo.learning.trees`: scikit-learn's numbers without its per-call overhead).
    """
    from scipy.special import expit
    from sklearn.pipeline import Pipeline

    if isinstance(model, Pipeline) and [n for n, _ in model.steps] == [
        "standardscaler",
        "logisticregression",
    ]:
        scaler, lr = model.named_steps["standardscaler"], model.named_steps["logisticregression"]
        x = np.asarray(rows, dtype=np.float64)
        if scaler.with_mean:
            x = x - scaler.mean_
        if scaler.with_std:
            x = x / scaler.scale_
        z = (x * lr.coef_[0]).sum(axis=-1) + lr.intercept_[0]
        return expit(z)
    trees = compile_hgb(model)
    if trees is not None:
        return trees.predict_proba(rows)
    from threadpoolctl import threadpool_limits

    # a few hundred rows at most: OpenMP threads cost far more than they give (measured 1.3 s
    # vs 4–16 ms for 240 rows of boosted trees on a busy 2-core machine)
    with threadpool_limits(limits=1):
        return model.predict_proba(rows)[:, 1]


def round_scores(model: Any, obs: np.ndarray) -> np.ndarray:
    """A stopping classifier's scores of rounds 1..T−1 for observations [..., T, F], shape
    [..., T − 1] (features of rounds t and t − 1 only, :func:`stop_features`; a float
    ``model`` is a constant score). CStop's g_t and the single-answer rules' h_t."""
    x = stop_features(obs)
    rows = x[..., :-1, :].reshape(-1, x.shape[-1])
    if isinstance(model, float):
        g = np.full(rows.shape[0], model)
    else:
        g = fixable_probability(model, rows)
    return g.reshape(*x.shape[:-2], x.shape[-2] - 1)


def membership_scores(g: np.ndarray) -> np.ndarray:
    """[..., T, 3] membership scores (1, 1, g_t): C_κ = {base, guide} ∪ {next iff g_t ≥ κ}."""
    g = np.clip(np.asarray(g, dtype=np.float64), 0.0, 1.0)
    out = np.ones((*g.shape, 3))
    out[..., NEXT] = g
    out[..., -1, NEXT] = 0.0  # masked at T anyway
    return out


def depth_schedule(horizon: int) -> np.ndarray:
    """``depth-k`` in the same family: g_t = 1 − t/T, so C_κ runs the least k rounds with
    1 − k/T < κ and returns every answer of them. Split-conformal κ̂ then picks the least depth
    whose calibration coverage reaches the conformal level (shape [T])."""
    return 1.0 - np.arange(1, horizon + 1) / horizon


def agree_schedule(obs: np.ndarray) -> np.ndarray:
    """``agree-k``, the rule a practitioner tries first: stop as soon as the guide agrees with
    the base answer (verdict yes), else go on, at most k rounds: g_t = (1 − yes_t)(1 − t/T).
    Nested in κ (a lower κ only raises the cap k), so split conformal calibrates k; when
    stopping on agreement alone misses the level, κ̂ = 0 runs every round. ``obs`` [..., T, F]."""
    yes = np.asarray(obs)[..., FEATURE_NAMES.index("verdict_yes")] > 0.5
    return np.where(yes, 0.0, depth_schedule(obs.shape[-2]))


# ----------------------------------------------------------------------------- the learner
def _make_learner(cfg: StopConfig):
    if cfg.learner == "logistic":
        from sklearn.linear_model import LogisticRegression
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler

        return make_pipeline(StandardScaler(), LogisticRegression(C=cfg.c, max_iter=2000))
    from sklearn.ensemble import HistGradientBoostingClassifier

    return HistGradientBoostingClassifier(
        max_iter=cfg.max_iter,
        learning_rate=cfg.learning_rate,
        max_leaf_nodes=cfg.max_leaf_nodes,
        min_samples_leaf=cfg.min_samples_leaf,
        l2_regularization=cfg.l2_regularization,
        early_stopping=False,
        random_state=cfg.seed,
    )


@dataclass
class StoppingPolicy:
    """The CStop artifact: the fitted classifier, T, κ̂ and provenance.

    Duck-types :class:`ccpo.learning.policy.TrainedPolicy` where the harness and the live
    agent use it (``probs``, ``kappa``, ``alpha``, ``scoring``, ``variant``, ``save``).
    """

    model: Any  # a fitted scikit-learn classifier, a float (constant score), None (fixed rule)
    horizon: int
    config: StopConfig
    variant: str = "cstop"
    kappa_batch: float | None = None
    calibration: CalibrationScores | None = None  # κ̂'s scores (online level tracker)
    feature_spec: dict[str, Any] = field(default_factory=lambda: dict(FEATURE_SPEC))
    prices: dict[str, Any] | None = None
    log: list[dict[str, float]] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)  # e.g. the choice made by auto
    provenance: dict[str, Any] = field(default_factory=dict)  # see policy.check_provenance

    scoring = "batch"
    kappa_online = None
    answer = "set"  # single-answer policies: ccpo.learning.single

    @property
    def alpha(self) -> float:
        return self.config.alpha

    @property
    def kappa(self) -> float:
        if self.kappa_batch is None:
            raise CCPOError(f"the {self.variant} policy is not calibrated yet (no κ̂)")
        return self.kappa_batch

    def continuation(self, obs: np.ndarray) -> np.ndarray:
        """g_t for observations [..., T, F] (0 at round T)."""
        obs = np.asarray(obs)
        if obs.ndim < 2 or obs.shape[-2] != self.horizon:
            raise ValueError(f"obs must have shape [..., {self.horizon}, F], got {obs.shape}")
        if self.variant == "agree-k":
            return agree_schedule(obs)
        if self.model is None:  # depth-k: a fixed schedule
            return np.broadcast_to(depth_schedule(self.horizon), obs.shape[:-1]).copy()
        out = np.zeros(obs.shape[:-1])
        out[..., :-1] = round_scores(self.model, obs)
        return out

    def probs(self, obs: np.ndarray) -> np.ndarray:
        """Membership scores [..., T, 3] = (1, 1, g_t) (see the module docstring)."""
        return membership_scores(self.continuation(obs))

    # ------------------------------------------------------------------ persistence
    def save(self, folder: str | Path) -> Path:
        meta = {
            "method": self.variant,
            "variant": self.variant,
            "answer": self.answer,
            "alpha": self.alpha,
            "kappa_online": None,
            "kappa_batch": self.kappa_batch,
            **({"calibration_scores": self.calibration.to_json()} if self.calibration else {}),
            "horizon": self.horizon,
            "config": asdict(self.config),
            "info": self.info,
            "provenance": self.provenance,
        }
        return save_classifier_folder(folder, meta, self, self.model)

    @classmethod
    def load(cls, folder: str | Path, meta: dict[str, Any]) -> StoppingPolicy:
        """Load from a folder whose ``policy.json`` (already parsed: ``meta``) names CStop.

        The classifier is a pickle made by this ccpo (only load folders you trust, as with
        any model file); a different scikit-learn version is refused rather than risk
        silently different scores.
        """
        model, spec, prices, log = load_classifier_folder(
            folder, meta, f"ccpo train --method {meta['method']}"
        )
        return cls(
            model=model,
            horizon=int(meta["horizon"]),
            config=StopConfig(**meta["config"]),
            variant=meta.get("variant", meta["method"]),
            kappa_batch=meta.get("kappa_batch"),
            calibration=CalibrationScores.from_json(meta.get("calibration_scores")),
            feature_spec=spec,
            prices=prices,
            log=log,
            info=meta.get("info") or {},
            provenance=meta.get("provenance") or {},
        )


def save_classifier_folder(folder: str | Path, meta: dict[str, Any], pol: Any, model: Any) -> Path:
    """A policy folder of a classifier-scored policy (CStop, the single-answer rules):
    ``policy.json`` (``meta`` plus the scikit-learn version), the side files of ``pol``
    (feature spec, prices, log) and ``model.pkl``."""
    import sklearn

    meta = {**meta, "sklearn_version": sklearn.__version__}
    out = write_folder(folder, meta, pol.feature_spec, pol.prices, pol.log)
    with open(out / "model.pkl", "wb") as fh:
        pickle.dump(model, fh, protocol=pickle.HIGHEST_PROTOCOL)
    return out


def load_classifier_folder(
    folder: str | Path, meta: dict[str, Any], retrain: str
) -> tuple[Any, Any, Any, Any]:
    """(classifier, feature spec, prices, log) of a folder written by
    :func:`save_classifier_folder`. The classifier is a pickle made by this ccpo (only load
    folders you trust, as with any model file); a different scikit-learn version is refused
    (``retrain``: the command that makes a new one) rather than risk silently different
    scores."""
    import sklearn

    d = Path(folder)
    made = meta.get("sklearn_version")
    if made != sklearn.__version__:
        raise CCPOError(
            f"{d}: the classifier was saved with scikit-learn {made}, this is "
            f"{sklearn.__version__}; retrain it with `{retrain}`"
        )
    spec, prices, log = read_side_files(d)
    try:
        with open(d / "model.pkl", "rb") as fh:
            model = pickle.load(fh)
    except (OSError, pickle.UnpicklingError, EOFError) as e:
        raise CCPOError(f"{d}/model.pkl: cannot load the classifier ({e})") from None
    return model, spec, prices, log


def fit_stopping(
    ep: Episodes, train_idx: np.ndarray, cfg: StopConfig, variant: str = "cstop"
) -> StoppingPolicy:
    """Fit the continuation classifier on the questions ``train_idx`` (rows t < T).

    With a single class in the labels (tiny data) the score is that constant: still a valid
    conformal policy (κ̂ then runs every question to the same depth).
    """
    idx = np.asarray(train_idx)
    if idx.size == 0:
        raise CCPOError("cannot fit a stopping policy on zero training questions")
    T = ep.horizon
    if T < 2:
        raise CCPOError("a stopping policy needs traces with at least 2 rounds")
    x = stop_features(ep.obs[idx])[:, :-1].reshape(-1, 2 * ep.obs.shape[-1])
    y = fixable_labels(ep.correct[idx], ep.solvable[idx])[:, :-1].reshape(-1)
    if y.all() or not y.any():
        model: Any = float(y.mean())
    else:
        from threadpoolctl import threadpool_limits

        model = _make_learner(cfg)
        with threadpool_limits(limits=1):  # small data: threads cost more than they give
            model.fit(x, y)
    pol = StoppingPolicy(model=model, horizon=T, config=cfg, variant=variant)
    pol.log.append({"fit/rows": float(y.size), "fit/fixable_rate": float(y.mean())})
    return pol


# ----------------------------------------------------------------------------- auto
Fitter = Callable[[Episodes, np.ndarray, float, int], Any]


def stopping_fitter(method: str, settings: dict[str, Any] | None = None) -> Fitter:
    """(ep, idx, α, seed) → fitted scorer for a CStop method or a fixed rule; ``settings``:
    other :class:`StopConfig` fields (the learner's hyperparameters)."""
    kw = dict(settings or {})
    if method in FIXED_RULES:
        return lambda ep, idx, alpha, seed: StoppingPolicy(
            None, ep.horizon, StopConfig(alpha=alpha, seed=seed, **kw), variant=method
        )
    if method not in STOPPING_METHODS:
        raise CCPOError(f"unknown method '{method}' (stopping methods: {', '.join(SCORE_METHODS)})")
    kw["learner"] = STOPPING_METHODS[method]
    return lambda ep, idx, alpha, seed: fit_stopping(
        ep, idx, StopConfig(alpha=alpha, seed=seed, **kw), variant=method
    )


@dataclass(frozen=True)
class Selection:
    """What ``--method auto`` chose and the validation figures behind the choice."""

    method: str
    figures: dict[str, dict[str, float]]  # candidate → validation cost (cents/question), cov
    folds: int

    def to_json(self) -> dict[str, Any]:
        return {"picked": self.method, "folds": self.folds, "validation": self.figures}


def candidate_fitter(name: str, settings: dict[str, Any] | None = None) -> Fitter:
    """The fitter of an ``auto`` candidate: a score method (:func:`stopping_fitter`, with the
    learner's ``settings``) or an RL method in bounded time
    (:func:`ccpo.learning.candidates.rl_fitter`)."""
    from ccpo.learning.candidates import AUTO_RL_STEPS, RL_CANDIDATES, rl_fitter

    if name in RL_CANDIDATES:
        return rl_fitter(name, (settings or {}).get("auto_ccpo_steps", AUTO_RL_STEPS))
    return stopping_fitter(name, settings)


def select_method(
    ep: Episodes,
    train_idx: np.ndarray,
    alpha: float,
    candidates: Sequence[str] = AUTO_CANDIDATES,
    fitters: dict[str, Fitter] | None = None,
    folds: int = 5,
    seed: int = 0,
) -> Selection:
    """Pick the candidate of least validation calibrated cost by K-fold cross-fitting.

    Each candidate is fitted K times on K−1 folds of ``train_idx`` and scores the held-out
    fold; the out-of-fold scores of all training questions are then scored as the harness
    would, calibrated on random halves and tested on the others (:func:`calibrated_cost`).
    Ties go to the earlier candidate. Only training questions are used, so the conformal
    guarantee of the calibrated choice is untouched.
    """
    idx = np.asarray(train_idx)
    if len(candidates) == 0:
        raise CCPOError("auto needs at least one candidate method")
    fitters = fitters or {}
    k = max(2, min(folds, idx.size // 10)) if idx.size >= 20 else 1
    rng = np.random.default_rng([seed, 0xA070])
    perm = rng.permutation(idx)
    parts = np.array_split(perm, k) if k > 1 else [perm]
    sub = ep.subset(perm)
    figures: dict[str, dict[str, float]] = {}
    for name in candidates:
        fit = fitters.get(name) or candidate_fitter(name)
        probs = np.zeros((perm.size, ep.horizon, 3))
        start = 0
        for i, held in enumerate(parts):
            rest = np.concatenate([p for j, p in enumerate(parts) if j != i]) if k > 1 else held
            scorer = fit(ep, rest, alpha, seed)
            probs[start : start + held.size] = scorer.probs(ep.obs[held])
            start += held.size
        got = calibrated_cost(sub, probs, alpha)
        figures[name] = {"cost_cents_per_question": got.cost * 100, "coverage": got.coverage}
    best = min(candidates, key=lambda n: figures[n]["cost_cents_per_question"])
    return Selection(best, figures, k)


def fit_auto(
    ep: Episodes,
    train_idx: np.ndarray,
    alpha: float,
    seed: int = 0,
    candidates: Sequence[str] = AUTO_CANDIDATES,
    fitters: dict[str, Fitter] | None = None,
) -> tuple[Any, Selection]:
    """``--method auto``: :func:`select_method`, then the winner refitted on all of
    ``train_idx``; its ``info`` records the choice and the validation figures."""
    sel = select_method(ep, train_idx, alpha, candidates, fitters, seed=seed)
    fit = (fitters or {}).get(sel.method) or candidate_fitter(sel.method)
    scorer = fit(ep, np.asarray(train_idx), alpha, seed)
    if hasattr(scorer, "info"):
        scorer.info = {"auto": sel.to_json()}
    return scorer, sel


def fit_method(
    method: str,
    ep: Episodes,
    train_idx: np.ndarray,
    alpha: float,
    seed: int = 0,
    candidates: Sequence[str] = AUTO_CANDIDATES,
    settings: dict[str, Any] | None = None,
) -> tuple[Any, Selection | None]:
    """Fit ``auto`` (:func:`fit_auto`, with its :class:`Selection`) or one of
    :data:`SCORE_METHODS` (selection ``None``): the one entry point of the CLI, the API and
    the harness. ``settings``: :class:`StopConfig` fields other than α, seed and learner."""
    if method == "auto":
        if (settings or {}).get("auto_ccpo_steps", 1) == 0:
            candidates = [c for c in candidates if c != "ccpo"]
        fitters = {name: candidate_fitter(name, settings) for name in candidates}
        return fit_auto(ep, train_idx, alpha, seed, candidates, fitters)
    return stopping_fitter(method, settings)(ep, train_idx, alpha, seed), None
