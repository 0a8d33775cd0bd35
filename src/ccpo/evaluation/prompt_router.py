"""``prompt-router``: the routers teams use today, as a comparison row. No guarantee.

Before any call, a text classifier per cheaper model (the
:class:`ccpo.policies.routing.router.Router` of ``--route``: one logistic classifier per round on
hashed n-grams of the question) predicts whether that model's reply is accepted; the question goes
to the cheapest model (by mean call cost on the training questions) whose prediction clears a
threshold τ, else to the strongest, and that one reply is returned. τ is the cheapest of the
training questions' out-of-fold predictions whose acceptance on the training questions reaches 1 −
α: fitted on training data, with nothing certified on new questions (compare ``cstop-single+route``,
whose λ̂ is certified by Learn-then-Test: docs/theory.md, "Routing before the first call").

Rungs of an ``agree`` ladder of pairs: rung 0 is round 1's base, rung k round k's guide; a
question routed to rung k pays that one call (its latency: that call's, rounds 1's two calls'
longer one for rungs 0 and 1). Of a ladder of one-model steps, rung k is round k + 1; a
question routed to a verify step's rung pays the reply it verifies, then the verifier, and
returns that reply.
Main names: :class:`PromptRouterRow`, :func:`rung_arrays`.
"""

from __future__ import annotations

import numpy as np

from ccpo.errors import CCPOError
from ccpo.learning.baselines import Row, Splits
from ccpo.policies.routing.router import Router, fit_router, starts
from ccpo.policies.single import reached_labels
from ccpo.traces.episodes import BASE, GUIDE, Episodes, Metrics, one_step
from ccpo.traces.schema import ACTIONS

NAME = "prompt-router"


def rung_arrays(ep: Episodes) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(cost [N, R] USD, accepted [N, R] bool, latency [N, R] s or None) of calling each of
    the R rungs alone. One-model steps: R = T, a rung is a round (a verify step's: its reply
    and the verifier's call). Pairs: R = T + 1; a later
    round's base repeats the earlier guide, so round k ≥ 2 (1-based) pays only its guide;
    round 1's two calls split by the view started at round 2. Any other ladder (one guide for
    every round) is refused."""
    if ep.routes is None:
        raise CCPOError(
            f"'{NAME}' needs the traces of an agree ladder (an import or a bundled set)"
        )
    rc, T = ep.round_cost, ep.horizon
    if ep.one_model:
        ok = ep.correct[:, :, BASE] | ~ep.solvable[:, None]
        return rc.copy(), ok, None if ep.round_latency is None else ep.round_latency.copy()
    if ep.verify_rounds:  # a verify step called alone pays the reply it verifies too
        ok = ep.correct[:, :, BASE] | ~ep.solvable[:, None]
        views = ep.routes
        cost = np.stack([views.cost[k, :, k] for k in range(T)], axis=1)
        lat = (
            None
            if views.latency is None
            else np.stack([views.latency[k, :, k] for k in range(T)], axis=1)
        )
        return cost, ok, lat
    cost = np.zeros((ep.n, T + 1))
    cost[:, 2:] = rc[:, 1:]
    cost[:, 1] = ep.routes.cost[1, :, 1] - rc[:, 1]
    cost[:, 0] = rc[:, 0] - cost[:, 1]
    started = np.stack([ep.routes.cost[k, :, k] for k in range(T)], axis=1)
    if not np.allclose(started, cost[:, :-1] + cost[:, 1:], rtol=1e-9, atol=1e-15):
        raise CCPOError(
            f"'{NAME}' needs a cascade ladder (each round's guide the next round's base, as "
            "`traces import` builds without --guide)"
        )
    ok = np.concatenate([ep.correct[:, :1, BASE], ep.correct[:, :, GUIDE]], axis=1)
    ok |= ~ep.solvable[:, None]
    lat = None
    if ep.round_latency is not None:
        lat = np.concatenate([ep.round_latency[:, :1], ep.round_latency], axis=1)
    return cost, ok, lat


def rung_steps(ep: Episodes, rung: np.ndarray, count: int) -> np.ndarray | None:
    """[..., T, 2] bool: the one step that calls rung ``rung`` [...] of :func:`rung_arrays`
    (its ``count`` rungs are the ladder's :class:`~ccpo.traces.rungs.Rungs`, in order); None
    when the ladder's rungs are not known or not those."""
    if ep.rungs is None or ep.rungs.count != count:
        return None
    at = np.array([(t - 1, ACTIONS.index(role)) for t, role in ep.rungs.steps])[rung]
    return one_step(at[..., 0], at[..., 1], ep.horizon)


def rung_calls(ep: Episodes, step: np.ndarray | None) -> np.ndarray | None:
    """The steps run to call the rungs ``step`` [..., T, 2] marks (:func:`rung_steps`): those
    steps, and a verify step's base with its verifier (the reply it verifies is asked
    first: the base's rung, :attr:`~ccpo.traces.rungs.Rungs.of_step`)."""
    if step is None or not ep.verify_rounds:
        return step
    out = np.array(step)
    v = list(ep.verify_rounds)
    out[..., v, BASE] |= out[..., v, GUIDE]
    return out


class PromptRouterRow(Row):
    """A prompt-only router: a threshold on per-model text classifiers fitted on training data;
    no guarantee."""

    name = NAME
    kind = "point"
    router: Router | None = None
    tau: float | None = None

    def fit(self, ep: Episodes, train_idx: np.ndarray, alpha: float, seed: int) -> None:
        idx = np.asarray(train_idx)
        cost = rung_arrays(ep)[0]
        shift = cost.shape[1] - ep.horizon  # pairs: round s's reply is rung s + 1
        self.rung_cost = cost[idx].mean(axis=0)
        self.router = fit_router(ep, idx, seed=seed)
        probs = self._out_of_fold(ep, idx, seed)
        y = reached_labels(ep.subset(idx))  # round s's answer accepted: rung s + 1's
        taus = np.unique(np.concatenate([probs[:, :-1].ravel(), [1.0]]))
        best = (np.inf, 1.0)
        for tau in taus:
            s = starts(probs, tau, self.rung_cost[shift:])
            hit = y[np.arange(idx.size), s]
            spend = float(cost[idx, s + shift].mean())
            if hit.mean() >= 1 - alpha and spend < best[0]:
                best = (spend, float(tau))
        self.tau = best[1]

    def _out_of_fold(self, ep: Episodes, idx: np.ndarray, seed: int, folds: int = 5):
        """r̂ [n, T] of the training questions, each from a router fitted without its fold."""
        rng = np.random.default_rng([seed, 0x9207])
        parts = np.array_split(rng.permutation(idx.size), folds)
        probs = np.ones((idx.size, ep.horizon))
        assert ep.routes is not None
        texts = ep.routes.questions
        for held in parts:
            rest = np.setdiff1d(np.arange(idx.size), held)
            r = fit_router(ep, idx[rest], seed=seed)
            probs[held] = r.question_probs([texts[i] for i in idx[held]])
        return probs

    def evaluate(self, ep: Episodes, splits: Splits, alpha: float, seed: int) -> Metrics:
        if self.router is None or self.tau is None:
            raise CCPOError(f"policy '{self.name}' was evaluated before it was fitted")
        assert ep.routes is not None
        cost, ok, lat = rung_arrays(ep)
        probs = self.router.question_probs(ep.routes.questions)
        shift = cost.shape[1] - ep.horizon  # pairs: round s's reply is rung s + 1
        rung = starts(probs, self.tau, self.rung_cost[shift:]) + shift  # [N]
        q = np.arange(ep.n)
        test = splits.test
        ones = np.ones(test.shape, dtype=np.int64)
        step = rung_steps(ep, rung[test], cost.shape[1])
        return Metrics(
            cost=cost[q, rung][test],
            covered=ok[q, rung][test],
            length=ones,
            set_size=ones,
            latency=None if lat is None else lat[q, rung][test],
            called=rung_calls(ep, step),
            returned=step,
        )

    def result_extra(self) -> dict[str, float]:
        return {} if self.tau is None else {"tau": self.tau}
