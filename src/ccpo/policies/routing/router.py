"""The router: from a question alone, before any call, the chance that each round's answer
is correct, and the round to start at.

:class:`Router` holds one logistic classifier per round s < T on features of the question
(:mod:`ccpo.traces.text_features`: hashed n-grams and lengths, no download; with
``embedding_model`` in its spec, the question's recorded embedding too, scaled to unit length:
``ccpo traces embed``); at a threshold τ the question starts at the cheapest round whose
prediction clears τ (:func:`starts`). :func:`fit_router` fits it on training questions only.
The routed policy and its guarantee: :mod:`ccpo.policies.routing.single`; derivation:
docs/theory.md, "Routing before the first call".

Main names: :class:`Router`, :func:`fit_router`, :func:`starts`, :func:`unit_rows`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ccpo.errors import CCPOError
from ccpo.policies.single import reached_labels
from ccpo.traces.episodes import Episodes
from ccpo.traces.text_features import TEXT_FEATURE_SPEC, text_matrix


@dataclass
class Router:
    """Per round s < T a logistic classifier w_s·x + b_s on text features x (round T: 1)."""

    coef: np.ndarray  # [T − 1, D]
    intercept: np.ndarray  # [T − 1]
    start_cost: np.ndarray  # [T] mean USD of round s's calls when started at s (training)
    spec: dict[str, Any] = field(default_factory=lambda: dict(TEXT_FEATURE_SPEC))

    @property
    def horizon(self) -> int:
        return self.coef.shape[0] + 1

    def probs(self, x: np.ndarray) -> np.ndarray:
        """r̂_s for text features [N, D]: [N, T] (column T is 1). Summed row by row, so a
        question's value does not depend on its batch (live = replay, bit for bit)."""
        from scipy.special import expit

        x = np.asarray(x, dtype=np.float64)
        z = (x[:, None, :] * self.coef[None]).sum(-1) + self.intercept[None]
        return np.concatenate([expit(z), np.ones((x.shape[0], 1))], axis=1)

    @property
    def embedding_model(self) -> str | None:
        """The model whose question embeddings this router reads beside the text (None:
        text alone)."""
        return self.spec.get("embedding_model")

    def features(self, questions: Sequence[str], embeddings: Any = None) -> np.ndarray:
        """[N, D] text features, then the questions' unit-length embeddings [N, E] when the
        router reads them (:attr:`embedding_model`)."""
        x = text_matrix(list(questions), int(self.spec["dim"]))
        if self.embedding_model is None:
            return x
        if embeddings is None:
            raise CCPOError(f"this router reads question embeddings by {self.embedding_model}")
        return np.concatenate([x, unit_rows(embeddings, self.spec["embedding_dim"])], axis=1)

    def question_probs(self, questions: Sequence[str], embeddings: Any = None) -> np.ndarray:
        return self.probs(self.features(questions, embeddings))

    def start(self, probs: np.ndarray, tau: Any) -> np.ndarray:
        """:func:`starts` with this router's start costs."""
        return starts(probs, tau, self.start_cost)

    def to_json(self) -> dict[str, Any]:
        return {
            "spec": self.spec,
            "coef": self.coef.tolist(),
            "intercept": self.intercept.tolist(),
            "start_cost": self.start_cost.tolist(),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Router:
        text_spec = {k: (d.get("spec") or {}).get(k) for k in TEXT_FEATURE_SPEC}
        if text_spec != TEXT_FEATURE_SPEC:
            raise CCPOError(
                f"the router was fitted on text features {d.get('spec')}, this ccpo computes "
                f"{TEXT_FEATURE_SPEC}; retrain the policy with --route"
            )
        return cls(
            np.asarray(d["coef"], dtype=np.float64),
            np.asarray(d["intercept"], dtype=np.float64),
            np.asarray(d["start_cost"], dtype=np.float64),
            d["spec"],
        )


def starts(probs: np.ndarray, tau: Any, cost: np.ndarray) -> np.ndarray:
    """The 0-based start round of each question: of the rounds s with r̂_s ≥ τ (round T
    always is), the one whose own calls cost least on the training questions (``cost`` [T];
    ties to the earliest: on a ladder ordered by price, the first such round); 0 where τ > 1
    (:data:`NO_ROUTE`). ``probs`` [..., T]; ``tau`` a scalar or broadcasting on [...]."""
    tau = np.asarray(tau, dtype=np.float64)
    priced = np.where(probs >= tau[..., None], np.asarray(cost, dtype=np.float64), np.inf)
    return np.where(tau > 1.0, 0, np.argmin(priced, axis=-1))


def unit_rows(vectors: Any, dim: int) -> np.ndarray:
    """Embeddings [N, dim] scaled to unit length (a zero vector stays zero); a
    :class:`CCPOError` when their length is not ``dim``."""
    v = np.atleast_2d(np.asarray(vectors, dtype=np.float64))
    if v.shape[1] != int(dim):
        raise CCPOError(f"question embeddings of length {v.shape[1]}, the router reads {dim}")
    norm = np.linalg.norm(v, axis=1, keepdims=True)
    return np.divide(v, norm, out=np.zeros_like(v), where=norm > 0)


def fit_router(
    ep: Episodes, train_idx: np.ndarray, c: float = 1.0, seed: int = 0, embedded: bool = False
) -> Router:
    """The router fitted on the training questions only: for each round s < T, labels
    "stopping at s returns a correct answer (or q is unsolvable)" on their text features
    (and, ``embedded``, their recorded question embeddings: ``ccpo traces embed``)."""
    from sklearn.linear_model import LogisticRegression

    if ep.routes is None:
        raise CCPOError(
            "--route needs a ladder of agree rounds (an import or a bundled set): a judge "
            "round's base reads the earlier rounds, which routing would skip"
        )
    sub = ep.subset(np.asarray(train_idx))
    assert sub.routes is not None
    spec = dict(TEXT_FEATURE_SPEC)
    if embedded:
        if sub.routes.embeddings is None:
            raise CCPOError(
                "--route-embeddings needs every trace to record its question's embedding by "
                "one model: run `ccpo traces embed` on the traces first"
            )
        spec.update(embedding_model=sub.routes.embedding_model,
                    embedding_dim=int(sub.routes.embeddings.shape[1]))  # fmt: skip
    probe = Router(np.zeros((0, 0)), np.zeros(0), np.zeros(0), spec)
    x = probe.features(sub.routes.questions, sub.routes.embeddings)
    y = reached_labels(sub)
    T = ep.horizon
    coef, icpt = np.zeros((T - 1, x.shape[1])), np.zeros(T - 1)
    for s in range(T - 1):
        ys = y[:, s]
        if ys.all() or not ys.any():
            rate = min(max(float(ys.mean()), 1e-6), 1 - 1e-6)
            icpt[s] = np.log(rate / (1 - rate))
            continue
        lr = LogisticRegression(C=c, max_iter=2000, random_state=seed).fit(x, ys)
        coef[s], icpt[s] = lr.coef_[0], lr.intercept_[0]
    own = np.stack([sub.routes.cost[s, :, s] for s in range(T)], axis=1)  # [n, T]
    return Router(coef, icpt, own.mean(axis=0), spec)
