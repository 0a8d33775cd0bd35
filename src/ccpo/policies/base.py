"""The one interface every policy implements: :class:`Policy`.

A policy reads the observations o_1..o_t of a question's rounds and, after each round, says
which answers join what it returns and whether to run another round. Two answer kinds:

- ``"set"``: an answer set C(o_t) = {a : e(a|o_t) ≥ κ} that covers a correct answer with
  probability ≥ 1 − α (split conformal; a *greedy* policy acts on argmax π, without κ);
- ``"single"``: exactly one answer, stopping at the first round whose score clears λ̂
  (Learn-then-Test: correct with probability ≥ 1 − α, with probability ≥ 1 − δ).

The same methods serve replay (``scores`` → ``split_thresholds`` → ``rollout``), calibration
(``calibrate``), the live agent (``decide``) and persistence (``save`` / ``load``, the folder
format of :mod:`ccpo.policies.folder`). Derivations: docs/theory.md.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np

from ccpo.traces.episodes import Episodes, Metrics, conformal_sets
from ccpo.traces.labels import GOLD, claim, every_question_solvable
from ccpo.traces.verify import SIMULATED_KEY, simulated_note

AnswerKind = Literal["set", "single"]
#: whether round t's base and guide gave an answer (asked only by policies that need it)
Answered = Callable[[], tuple[bool, bool]]


@dataclass(frozen=True)
class RoundDecision:
    """The policy's decision after round t: π(·|o_t), C(o_t), and whether to go on."""

    probs: np.ndarray  # [3]
    actions: tuple[str, ...]
    fallback: bool
    go_on: bool


@dataclass(frozen=True)
class Calibration:
    """What a calibration found: the threshold, its miss count on the calibration questions
    (Learn-then-Test; ``None`` for split conformal), n, and the hypotheses rejected (LTT)."""

    threshold: float
    misses: int | None
    n: int
    tested: int | None = None


def action_set(probs: list[float], last: bool, kappa: float | None) -> tuple[list[bool], bool]:
    """C(o_t) = {a : e(a|o_t) ≥ κ} for one round's π (``last``: round T, ``next`` masked) as
    :func:`~ccpo.traces.episodes.effective_scores` defines e (the first argmax of the
    allowed actions is in for every κ), on three floats rather than arrays (the agent asks
    every round); and whether that argmax is in only as the fallback (no allowed π ≥ κ).
    ``kappa=None``: κ = +inf (greedy)."""
    k = math.inf if kappa is None else float(kappa)
    allowed = [True, True, not last]
    masked = [v if ok else -math.inf for v, ok in zip(probs, allowed, strict=True)]
    top = masked.index(max(masked))
    members = [i == top or v >= k for i, v in enumerate(masked)]
    return members, not any(v >= k for v in masked)


class Policy(ABC):
    """A trained policy: scores of observations, a calibrated threshold, decisions.

    Every technique (:mod:`ccpo.policies.rl`, :mod:`~ccpo.policies.cstop`,
    :mod:`~ccpo.policies.single`) is a dataclass deriving from this class and sets the
    attributes below; callers use nothing else.
    """

    #: "set": returns an answer set; "single": exactly one answer
    answer: ClassVar[AnswerKind] = "set"

    variant: str  # the name it carries and its rows are shown under (ccpo, cstop, ...)
    horizon: int | None  # T, the rounds of the traces it was trained on
    feature_spec: dict[str, Any]  # the featurizer spec (checked on load)
    prices: dict[str, Any] | None  # the price table used for training
    log: list[dict[str, float]]  # training diagnostics, one entry per step
    info: dict[str, Any]  # e.g. the choice made by auto
    provenance: dict[str, Any]  # what it was trained on (ccpo.policies.provenance)
    config: Any  # its typed hyperparameters (ccpo.learning.config)

    #: δ of a Learn-then-Test calibration (single answer); ``None`` for split conformal
    delta: float | None = None
    #: the :class:`~ccpo.learning.config.TrainConfig` of an RL policy, else ``None``
    train_config: Any = None
    #: a point policy: acts on argmax π, with no threshold and so no guarantee
    greedy: bool = False
    #: its threshold is calibrated on held-out questions (split conformal or Learn-then-Test),
    #: so it can be calibrated again, at any α
    calibrates: bool = True

    @property
    def single(self) -> bool:
        """Returns exactly one answer (rather than a set)."""
        return self.answer == "single"

    @property
    @abstractmethod
    def method(self) -> str:
        """The registry name that fits this technique again (``ccpo``, ``cstop``, ...)."""

    # ------------------------------------------------------------------ what it promises
    @property
    @abstractmethod
    def alpha(self) -> float:
        """The target miscoverage α it is calibrated for."""

    @property
    @abstractmethod
    def threshold(self) -> float | None:
        """The calibrated threshold in force (κ̂ or the online κ of a set policy, λ̂ of a
        single-answer one); ``None`` for a greedy policy. Raises :class:`CCPOError` when the
        policy is not calibrated yet."""

    @abstractmethod
    def set_threshold(self, value: float) -> None:
        """Put ``value`` in force as the calibrated threshold (κ̂ or λ̂)."""

    @property
    @abstractmethod
    def is_calibrated(self) -> bool:
        """Whether :attr:`threshold` is set (a greedy policy needs none: True)."""

    @property
    def tracks_online(self) -> bool:
        """The online κ tracker of ``ccpo serve --adapt-kappa`` may move its threshold: not
        a greedy policy's (it has none), nor one certified at δ (:attr:`delta`: λ̂ of
        Learn-then-Test, the reference's binomial test), which the tracker does not keep."""
        return not self.greedy and self.delta is None

    @property
    def online_step(self) -> tuple[float, float]:
        """(η₀ per question, ξ) of the online κ tracker (docs/theory.md, "Online κ (ACI)"):
        the training η₀ over its batch size, and ξ, from :attr:`config`."""
        return self.config.eta0 / self.config.batch_size, self.config.xi

    #: κ̂'s calibration scores (:class:`ccpo.learning.conformal.CalibrationScores`), which the
    #: online tracker moves along; ``None`` when not kept
    calibration: Any = None

    def escalation_chance(self, question: str, start: int) -> float | None:
        """Its chance, from the question's text alone, that round ``start`` (1-based) does not
        settle the question (a routed policy's router: 1 − r̂); None when it has no such
        estimate before its first call. Hedging reads it (``hedge_above``)."""
        return None

    def decided_step(self, horizon: int) -> tuple[int, str] | None:
        """(round t, role) of the step whose reply is returned whatever the calls before it
        say, so that it can be streamed as it is written: a single answer's guide of round T
        (round T always stops with it); None for a set."""
        return (horizon, "guide") if self.answer == "single" else None

    def round_roles(self, t: int) -> tuple[str, ...]:
        """The steps of round ``t`` (1-based) it calls when it runs that round: both by
        default; ``always-<reference>`` calls its one step (the others are neither called nor
        paid). Live and dry runs ask this; the replay prices it by :meth:`round_costs`."""
        return ("base", "guide")

    @property
    def threshold_name(self) -> str:
        """How reports name its threshold: κ̂ (sets), λ̂ (single answer), '' (none)."""
        return "λ̂" if self.answer == "single" else "κ̂"

    def threshold_text(self, how: str = "") -> str:
        """ "κ̂ = 0.42", "λ̂ = 0.93 (Learn-then-Test, δ = 0.1)" (``how``), or what a policy
        without one does, for what ``train`` prints."""
        return f"{self.threshold_name} = {self.threshold:.4g}{how}"

    def summary_fields(self) -> dict[str, Any]:
        """What its technique adds to ``summary.json`` beyond the calibration figures."""
        return {}

    def full_set_rate(self, ep: Episodes, scores: Any, threshold: float | None) -> float:
        """Share of the questions of ``ep`` on which its set C(o) holds every action at every
        round (all T rounds run, every answer returned) at ``threshold``, from ``scores``
        (:meth:`episode_scores`): 1.0 means it decides nothing and costs as much as running
        everything (degenerate)."""
        reach, included = conformal_sets(ep, scores, threshold)  # type: ignore[arg-type]
        return float((reach.all(1) & included.all((1, 2))).mean())

    def guarantee_statement(self) -> str:
        """The guarantee in words, against what its provenance's ``against`` labels say: gold
        labels, a reference model, scores or a judge (:func:`ccpo.traces.labels.claim`).
        Against gold labels a question no round can answer counts as covered, so what is
        controlled is P(wrong and answerable) ≤ α. Calibrated on simulated verdicts (its
        provenance's ``simulated_verifier``), it says so."""
        target = round(1.0 - float(self.alpha), 12)
        against = self.provenance.get("against") or GOLD
        if against == GOLD:
            what = (
                "the answer is wrong"
                if self.answer == "single"
                else "the answer set misses every correct answer"
            )
            statement = f"P({what} and some round answers correctly) ≤ {1.0 - target:g}"
        else:
            what = claim(against, self.answer == "single")
            scope = (
                "" if every_question_solvable(against) else " on questions some round can answer"
            )
            statement = f"{what} with probability ≥ {target:g}{scope}"
        note = simulated_note(self.provenance.get(SIMULATED_KEY))
        statement += f" ({note})" if note else ""
        if self.greedy:
            return "none: a point policy acts greedily (no calibrated κ); trained for " + statement
        return statement

    # ------------------------------------------------------------------ replay
    @abstractmethod
    def scores(self, obs: np.ndarray) -> np.ndarray:
        """The policy's scores of observations [..., T, F]: membership scores [..., T, 3]
        (set) or stopping scores [..., T] (single). Row t depends on rows ≤ t only."""

    def episode_scores(self, ep: Episodes) -> Any:
        """The scores the replay of ``ep`` uses (``split_thresholds``, ``rollout``): by default
        :meth:`scores` of its observations; a routed policy's also hold each start's view."""
        return self.scores(ep.obs)

    def round_costs(self, ep: Episodes) -> np.ndarray:
        """[N, T] USD of round t of each question as this policy runs it (a routed policy
        pays a call of a skipped round where first needed; ``always-<reference>`` its one call
        in its round); by default ``ep.round_cost``. Its replay pays these over the rounds
        :meth:`replay_answers` reaches."""
        return ep.round_cost

    @property
    def route_embedding_model(self) -> str | None:
        """The model whose embedding of the question :meth:`start_rung` reads (None: none)."""
        return None

    def start_rung(self, question: str, embedding: Sequence[float] | None = None) -> int:
        """The 0-based round to start at, decided from the question alone before any call
        (rounds before it are neither called nor paid); 0 for a policy without a router.
        ``embedding``: the question's, by :attr:`route_embedding_model` (None: missing)."""
        return 0

    @abstractmethod
    def calibrate(self, ep: Episodes, cal: np.ndarray | None = None) -> Calibration:
        """Calibrate the threshold at :attr:`alpha` on the questions ``cal`` of ``ep`` (all
        when ``None``) and set it."""

    @abstractmethod
    def split_thresholds(
        self, ep: Episodes, scores: np.ndarray, cal: np.ndarray, alpha: float
    ) -> tuple[np.ndarray, np.ndarray]:
        """(thresholds [K], refused [K]) calibrated at ``alpha`` on each row of ``cal``
        [K, n]; a refused split gets the most conservative threshold."""

    def restoring(self) -> Policy:
        """The policy whose :meth:`split_thresholds` gives the threshold ``check`` proposes
        to restore (the ``kappa:`` a deploy config sets): itself; a routed single answer at
        its own τ̂, since only λ can be set."""
        return self

    @abstractmethod
    def rollout(
        self, ep: Episodes, scores: np.ndarray, thresholds: Any, idx: np.ndarray | None = None
    ) -> Metrics:
        """Replay the questions ``idx`` (all when ``None``; [R, n] for R splits) at
        ``thresholds`` (a float or one per split)."""

    @abstractmethod
    def replay_answers(self, ep: Episodes) -> tuple[np.ndarray, np.ndarray]:
        """What it returns on each question of ``ep`` at its own threshold: rounds run
        [n, T] and the answers returned [n, T, 2] (base, guide) before dropping empty ones."""

    # ------------------------------------------------------------------ live
    @abstractmethod
    def decide(
        self, obs: np.ndarray, t: int, threshold: float | None, answered: Answered
    ) -> RoundDecision:
        """The decision after round t for observations ``obs`` [T, F] (rows after t zero):
        the same rule as the replay. ``answered()``: whether round t's base and guide gave an
        answer (called only by policies that need it)."""

    # ------------------------------------------------------------------ persistence
    @abstractmethod
    def save(self, folder: str | Path) -> Path:
        """Write the policy folder (:mod:`ccpo.policies.folder`)."""

    @classmethod
    @abstractmethod
    def load(cls, folder: str | Path, meta: dict[str, Any]) -> Policy:
        """Read a folder whose ``policy.json`` (already parsed: ``meta``) names this class."""

    def folder_header(self) -> dict[str, Any]:
        """The ``policy.json`` fields every technique writes; each adds its own after them."""
        return {
            "method": self.method,
            "variant": self.variant,
            "answer": self.answer,
            "alpha": self.alpha,
            "horizon": self.horizon,
            "config": asdict(self.config),
            "info": self.info,
            "provenance": self.provenance,
        }

    def trained_horizon(self) -> int | None:
        """T of the traces it was trained on, when known."""
        return self.horizon
