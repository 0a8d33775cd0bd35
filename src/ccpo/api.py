"""The Python API, in MAPIE's spirit: explicit phases ``fit`` → ``calibrate`` → ``predict_set``,
each refusing to run out of order with a message that says what to call first.

>>> from ccpo import ConformalPolicy                      # doctest: +SKIP
>>> pol = ConformalPolicy(alpha=0.1).fit("train.jsonl")   # doctest: +SKIP
>>> pol.calibrate("calibration.jsonl")                    # doctest: +SKIP
>>> sets = pol.predict_set("new_traces.jsonl")            # doctest: +SKIP
>>> sets[0].answers, sets[0].rounds, sets[0].cost_usd     # doctest: +SKIP

``predict_set`` replays traces (no LLM calls); answering live questions is the runtime's job.
``ConformalPolicy(method="auto", answer="single")`` learns a policy that returns exactly one
answer per question (:mod:`ccpo.policies.single`; ``calibrate`` then runs Learn-then-Test and
``predict_set`` returns one-answer sets). The policy itself is ``.policy``, a
:class:`ccpo.policies.Policy`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ccpo.errors import CCPOError, PhaseError
from ccpo.evaluation.harness import check_alpha
from ccpo.learning.config import TrainConfig
from ccpo.policies.base import Policy
from ccpo.policies.pipeline import train_policy
from ccpo.policies.registry import load_policy
from ccpo.policies.single import DELTA
from ccpo.policies.spec import API_METHODS, METHODS, parse_spec
from ccpo.traces.answers import normalizer_for
from ccpo.traces.episodes import Episodes, build_episodes, returned_answers
from ccpo.traces.io import read_traces
from ccpo.traces.prices import PriceTable, load_prices, prices_from_mapping
from ccpo.traces.schema import Trace

TracesLike = str | Path | Sequence[Trace]


@dataclass(frozen=True)
class PredictedSet:
    """The answer set the conformal policy returns for one question (by replay)."""

    id: str
    answers: list[str]  # de-duplicated under the task normaliser, in the order returned
    rounds: int  # rounds run (the deepest branch)
    cost_usd: float
    covered: bool | None  # whether a returned answer is correct (None if unknown)
    first_round: int = 1  # the round it started at (later than 1 when a router skipped some)


__all__ = ["API_METHODS", "ConformalPolicy", "PredictedSet"]


class ConformalPolicy:
    """A conformal policy C(o) = {a : π(a|o) ≥ κ}: train π, calibrate κ̂, predict answer sets.

    Args:
        method: ``"ccpo"`` (paper Algorithm 1), ``"cpo"`` (CPO π, then split-conformal κ̂:
            the paper's CPO-batch), ``"cstop"`` / ``"cstop-lr"`` (replay-trained conformal
            stopping, :mod:`ccpo.policies.cstop`), ``"depth-k"``, or ``"auto"`` (the
            stopping candidates, the one of least cross-fitted validation calibrated cost).
        alpha: target miscoverage α; coverage ≥ 1 − α holds in expectation over calibration
            sets exchangeable with the test questions.
        config: all training hyperparameters (:class:`TrainConfig`); ``method``/``alpha`` win.
        prices: a price table (default: the bundled one).
        answer: ``"set"`` (an answer set covering a correct answer) or ``"single"`` (exactly
            one answer, correct w.p. ≥ 1 − α on solvable questions, on average over
            calibration draws, or with probability ≥ 1 − δ over them with
            ``settings={"guarantee": "pac"}``; methods ``auto``, ``cstop``, ``cstop-lr``,
            ``depth-k``).
        delta: δ of a single-answer policy's Learn-then-Test calibration (``"pac"``).
    """

    def __init__(
        self,
        method: str = "ccpo",
        alpha: float = 0.1,
        config: TrainConfig | None = None,
        prices: PriceTable | None = None,
        answer: str = "set",
        delta: float = DELTA,
    ) -> None:
        check_alpha(alpha)
        self.spec = parse_spec(method, answer=answer, delta=delta, caller="api")
        self.answer, self.delta, self.method = self.spec.answer, delta, method
        base = config or TrainConfig()
        trainer = self.spec.technique.trainer or "ccpo"
        self.config = replace(base, method=trainer, alpha=alpha, lam=self.spec.lam or base.lam)
        self.spec = replace(self.spec, lam=self.config.lam, train_config=self.config)
        self.prices = prices or load_prices()
        self.policy: Policy | None = None

    # ------------------------------------------------------------------ helpers
    def _episodes(self, data: TracesLike | Episodes) -> tuple[Episodes, list[Trace] | None]:
        if isinstance(data, Episodes):
            return data, None
        traces = read_traces(data) if isinstance(data, str | Path) else list(data)
        return build_episodes(traces, self.prices), traces

    @property
    def is_fitted(self) -> bool:
        return self.policy is not None

    @property
    def is_calibrated(self) -> bool:
        return self.policy is not None and self.policy.is_calibrated

    # ------------------------------------------------------------------ phases
    def fit(self, data: TracesLike | Episodes) -> ConformalPolicy:
        """Train π (and the online κ) on every question of ``data``, in an order set by a
        seeded hash of the question ids (:func:`ccpo.evaluation.harness.id_order`), so the same
        questions in any order give the same policy, as ``ccpo train`` does."""
        from ccpo.evaluation.harness import id_order

        ep, _ = self._episodes(data)
        ep = ep.subset(id_order(ep.ids, self.config.seed))
        alpha, seed = self.config.alpha, self.config.seed
        self.policy = train_policy(self.spec, ep, np.arange(ep.n), alpha, seed).policy
        self.policy.prices = self.prices.to_price_file()
        return self

    def calibrate(self, data: TracesLike | Episodes) -> ConformalPolicy:
        """Split-conformal κ̂ on held-out calibration questions (not the training ones); a
        single-answer policy: λ̂ by Learn-then-Test (raises when no λ is certified)."""
        if self.policy is None:
            raise PhaseError("calibrate() needs a trained policy: call fit(traces) first")
        ep, _ = self._episodes(data)
        self.policy.calibrate(ep)
        return self

    def predict_set(self, data: TracesLike) -> list[PredictedSet]:
        """The answer set (never an empty answer, as served; one answer for a single-answer
        policy), rounds run and cost of each question, by replaying its trace."""
        if self.policy is None:
            raise PhaseError("predict_set() needs a trained policy: call fit(traces) first")
        if not self.policy.is_calibrated:
            raise PhaseError(
                "predict_set() needs a calibrated threshold: call calibrate(held_out_traces) "
                "after fit()"
            )
        ep, traces = self._episodes(data)
        assert traces is not None
        reach, included = self.policy.replay_answers(ep)
        paid = (self.policy.round_costs(ep) * reach).sum(-1)
        returned = returned_answers(ep, included)  # an empty answer is never a member
        out = []
        for i, tr in enumerate(traces):
            norm = normalizer_for(tr.task, tr.family)
            answers: dict[str, str] = {}
            for t in np.flatnonzero(reach[i]):
                r = tr.rounds[t]
                for j, step in enumerate((r.base, r.guide)):
                    if returned[i, t, j]:
                        answers.setdefault(norm(step.answer), step.answer)
            hit = (included[i] & ep.correct[i]).any() or not ep.solvable[i]
            out.append(
                PredictedSet(
                    id=tr.id,
                    answers=list(answers.values()),
                    rounds=int(reach[i].sum()),
                    cost_usd=float(paid[i]),
                    covered=bool(hit),
                    first_round=int(np.argmax(reach[i])) + 1,
                )
            )
        return out

    # ------------------------------------------------------------------ persistence
    def save(self, folder: str | Path) -> Path:
        if self.policy is None:
            raise PhaseError("nothing to save: call fit(traces) first")
        return self.policy.save(folder)

    @classmethod
    def load(cls, folder: str | Path) -> ConformalPolicy:
        pol = load_policy(folder)
        if pol.greedy:
            raise CCPOError(f"{folder} holds a pointwise CPO policy, not a conformal one")
        own = (
            None if pol.prices is None else prices_from_mapping(pol.prices, f"{folder}/prices.json")
        )
        prices = load_prices(own)
        method = pol.method if pol.method in METHODS else "auto"  # one model alone: auto's
        if pol.single:
            obj = cls(method, pol.alpha, prices=prices, answer="single", delta=pol.delta)
        else:
            obj = cls(method, pol.alpha, pol.train_config, prices)
        obj.policy = pol
        return obj
