"""The stopping classifier shared by CStop and the single-answer rules.

One row per (question, round t < T): features [o_t, o_{t−1}] (:func:`stop_features`, so a live
agent that has run t rounds gets the row the replay gets), a scikit-learn learner
(:func:`make_learner`: gradient-boosted trees or a logistic regression) and its scores computed
row by row (:func:`fixable_probability`, :func:`round_scores`), so that a row's score never
depends on which rows share its batch: a live question whose score equals κ̂ must compare
equal to the calibration question it came from.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ccpo.errors import CCPOError
from ccpo.learning.config import StopConfig
from ccpo.learning.trees import compile_hgb
from ccpo.traces.episodes import Episodes


def stop_features(obs: np.ndarray) -> np.ndarray:
    """Classifier inputs per round: [o_t, o_{t−1}] (zeros for t = 1), shape [..., T, 2F].

    Row t depends on observation rows t and t−1 only, so a live agent that has run t rounds
    (later rows zero-padded) gets the same row t as replay.
    """
    obs = np.asarray(obs, dtype=np.float64)
    prev = np.zeros_like(obs)
    prev[..., 1:, :] = obs[..., :-1, :]
    return np.concatenate([obs, prev], axis=-1)


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


def make_learner(cfg: StopConfig) -> Any:
    """The unfitted scikit-learn learner of ``cfg.learner`` with ``cfg``'s hyperparameters."""
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


def training_questions(ep: Episodes, train_idx: np.ndarray, what: str) -> tuple[np.ndarray, int]:
    """(question indices, T) to fit ``what`` on; refused on zero questions or T < 2."""
    idx = np.asarray(train_idx)
    if idx.size == 0:
        raise CCPOError(f"cannot fit {what} on zero training questions")
    if ep.horizon < 2:
        raise CCPOError(f"{what} needs traces with at least 2 rounds")
    return idx, ep.horizon


def training_rows(obs: np.ndarray) -> np.ndarray:
    """The classifier's training rows of observations [n, T, F]: rounds t < T, [n(T−1), 2F]."""
    return stop_features(obs)[:, :-1].reshape(-1, 2 * obs.shape[-1])


def fit_classifier(x: np.ndarray, y: np.ndarray, cfg: StopConfig) -> Any:
    """The learner of ``cfg`` fitted on rows ``x`` with labels ``y``; with a single class in
    the labels (tiny data), that constant rate (still a valid score: the threshold then runs
    every question to the same depth). Boosted trees on fewer than 10 × ``min_samples_leaf``
    rows (a two-model ladder has one row per question) take leaves of a tenth of the rows
    (at least 5), so that a split remains possible."""
    if y.all() or not y.any():
        return float(y.mean())
    from threadpoolctl import threadpool_limits

    model = make_learner(cfg)
    if cfg.learner != "logistic":
        model.set_params(min_samples_leaf=min(cfg.min_samples_leaf, max(5, len(y) // 10)))
    with threadpool_limits(limits=1):  # small data: threads cost more than they give
        model.fit(x, y)
    return model
