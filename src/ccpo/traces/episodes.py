"""The episode engine: vectorised (numpy) scoring of point and conformal policies over traces.
Everything that scores a policy uses exactly these semantics, replay and live alike.

- :func:`build_episodes` → :class:`Episodes`: traces as arrays (o_t, correct, cost per round).
- :func:`point_rollout`: one action per round, the episode ends at the first answer.
- :func:`conformal_rollout`, :func:`conformal_sets`, :func:`returned_answers`: the set-valued
  rollout of C(o) = {a : π(a|o) ≥ κ}; :func:`effective_scores` builds in the fallback
  {argmax π} and masks ``next`` at T; :func:`covering_scores` for split conformal.
- :func:`single_clears` (the stopping rule the live decision shares), :func:`single_rollout`,
  :func:`answer_actions`, :func:`single_losses`: single-answer policies.
- :func:`strongest_model`, :func:`strongest_calls`: the ``always-<model>`` row.
- :class:`Metrics`: cost, covered, length and set size per question, and which steps were
  run and returned (:func:`round_steps`, :func:`one_step`: where the money goes,
  :mod:`ccpo.traces.rungs`).

Shapes: N questions, T rounds, F features, K evaluation splits, n questions per split.
Contract: docs/design.md, section "Episode semantics"; derivation of the covering score:
docs/theory.md, section "Split-conformal κ̂ (set policies)".
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ccpo.errors import CCPOError
from ccpo.traces.answers import family_of, normalizer_for
from ccpo.traces.featurize import FEATURE_SPEC, feature_spec, featurize_trace
from ccpo.traces.labels import labels_of, reference_model
from ccpo.traces.latency import call_seconds, round_seconds
from ccpo.traces.prices import PriceTable
from ccpo.traces.routing import RouteViews, route_views
from ccpo.traces.rungs import Rungs, ladder_rungs
from ccpo.traces.schema import ACTIONS, Trace
from ccpo.traces.signals import is_solo, is_verify
from ccpo.traces.verify import simulated_note, simulated_of

BASE, GUIDE, NEXT = 0, 1, 2
ACTION_INDEX = {a: i for i, a in enumerate(ACTIONS)}


@dataclass(frozen=True)
class Episodes:
    """Traces turned into arrays, ready for fast replay. Build with :func:`build_episodes`."""

    ids: list[str]
    task: str
    obs: np.ndarray  # [N, T, F] float32, o_t from rounds 1..t only
    correct: np.ndarray  # [N, T, 2] bool (base, guide)
    answer_id: np.ndarray  # [N, T, 2] int64, ids of distinct normalised answers per question
    round_cost: np.ndarray  # [N, T] float64 USD, base + guide cost of round t
    verdict_yes: np.ndarray  # [N, T] float64: 1 yes, 0 no, nan missing
    uncertainty: np.ndarray  # [N, T] float64, nan missing
    llm_actions: dict[str, np.ndarray] = field(default_factory=dict)  # model -> [N, T] int8, -1
    llm_cost: dict[str, np.ndarray] = field(default_factory=dict)  # model -> [N, T] USD
    feature_spec: dict[str, Any] = field(default_factory=lambda: dict(FEATURE_SPEC))
    empty: np.ndarray | None = None  # [N, T, 2] bool: the answer is '' after the normaliser
    strongest: str = ""  # the reference of reference labels, else the ladder's most expensive
    # model ('' when some question lacks it): the model of the ``always-<model>`` row
    strongest_cost: np.ndarray | None = None  # [N] USD of calling only that model
    strongest_correct: np.ndarray | None = None  # [N] bool: its answer is correct
    labels: str = "gold"  # what correct means: "gold" or "reference:<model>" (traces.labels)
    models: tuple[str, ...] = ()  # every model whose usage the traces record (sorted)
    #: (round t, role) of the call ``always-<strongest>`` pays, when it is the same ``agree``
    #: step (the model answers the question alone) in every trace; else None
    strongest_step: tuple[int, str] | None = None
    #: [N, T] estimated seconds of each round (:mod:`ccpo.traces.latency`); None: unknown
    round_latency: np.ndarray | None = None
    #: [N] estimated seconds of the ``always-<strongest>`` call
    strongest_latency: np.ndarray | None = None
    routes: RouteViews | None = None  # every start round's view (traces.routing); agree only
    family: str = ""  # the task's answer family (traces.answers.family_of); '' unknown
    #: every round is one model's call (traces.signals.is_solo): a round is a rung
    one_model: bool = False
    rungs: Rungs | None = None  # each distinct paid call and its cost (traces.rungs)
    #: the 0-based rounds that are verify steps (traces.verify), the same in every trace
    verify_rounds: tuple[int, ...] = ()
    #: what reports say of simulated verdicts (traces.verify.simulated_note); '' when real
    simulated: str = ""

    @property
    def n(self) -> int:
        return self.obs.shape[0]

    @property
    def horizon(self) -> int:
        return self.obs.shape[1]

    @property
    def solvable(self) -> np.ndarray:
        """[N] bool: some base or guide answer in some round is correct."""
        return self.correct.any(axis=(1, 2))

    @property
    def allowed(self) -> np.ndarray:
        """[T, 3] bool action mask: ``next`` is unavailable at round T."""
        return allowed_actions(self.horizon)

    def subset(self, idx: np.ndarray) -> Episodes:
        """The episodes at ``idx`` (a new object; arrays are copied by fancy indexing)."""
        idx = np.asarray(idx)
        return Episodes(
            ids=[self.ids[i] for i in idx],
            task=self.task,
            obs=self.obs[idx],
            correct=self.correct[idx],
            answer_id=self.answer_id[idx],
            round_cost=self.round_cost[idx],
            verdict_yes=self.verdict_yes[idx],
            uncertainty=self.uncertainty[idx],
            llm_actions={k: v[idx] for k, v in self.llm_actions.items()},
            llm_cost={k: v[idx] for k, v in self.llm_cost.items()},
            feature_spec=self.feature_spec,
            empty=None if self.empty is None else self.empty[idx],
            strongest=self.strongest,
            strongest_cost=None if self.strongest_cost is None else self.strongest_cost[idx],
            strongest_correct=None
            if self.strongest_correct is None
            else self.strongest_correct[idx],
            labels=self.labels,
            models=self.models,
            strongest_step=self.strongest_step,
            round_latency=None if self.round_latency is None else self.round_latency[idx],
            strongest_latency=None
            if self.strongest_latency is None
            else self.strongest_latency[idx],
            routes=None if self.routes is None else self.routes.subset(idx),
            family=self.family,
            one_model=self.one_model,
            rungs=None if self.rungs is None else self.rungs.subset(idx),
            verify_rounds=self.verify_rounds,
            simulated=self.simulated,
        )

    @property
    def answered(self) -> np.ndarray:
        """[N, T, 2] bool: the step gave a non-empty answer (all True for old pickles)."""
        if self.empty is None:
            return np.ones(self.correct.shape, dtype=bool)
        return ~self.empty


@functools.lru_cache(maxsize=64)
def allowed_actions(horizon: int) -> np.ndarray:
    """[T, 3] bool: every action allowed except ``next`` at the last round (read-only, made
    once per T: the live agent asks for it every round)."""
    m = np.ones((horizon, 3), dtype=bool)
    m[-1, NEXT] = False
    m.flags.writeable = False
    return m


def build_episodes(traces: Sequence[Trace], prices: PriceTable) -> Episodes:
    """Featurize and price a list of traces (all with the same number of rounds T).

    Raises :class:`CCPOError` for mixed T or a model without a price (naming both).
    """
    if not traces:
        raise CCPOError("no traces to build episodes from")
    T = traces[0].n_rounds
    for tr in traces:
        if tr.n_rounds != T:
            raise CCPOError(
                f"trace '{tr.id}' has {tr.n_rounds} rounds but '{traces[0].id}' has {T}; "
                "one trace set must use one number of rounds"
            )
    signals = tuple(traces[0].signals or ())
    for tr in traces:
        if tuple(tr.signals or ()) != signals:
            raise CCPOError(
                f"trace '{tr.id}' records the signals {list(tr.signals or [])} but "
                f"'{traces[0].id}' {list(signals)}; one trace set must use one ladder"
            )
    models = set().union(*(tr.models() for tr in traces))
    prices.check(models)
    N = len(traces)
    task = traces[0].task
    obs = np.stack([featurize_trace(tr) for tr in traces])
    correct = np.zeros((N, T, 2), dtype=bool)
    answer_id = np.zeros((N, T, 2), dtype=np.int64)
    empty = np.zeros((N, T, 2), dtype=bool)
    round_cost = np.zeros((N, T))
    round_latency = np.zeros((N, T))
    verdict = np.full((N, T), np.nan)
    unc = np.full((N, T), np.nan)
    policy_models = sorted({m for tr in traces for r in tr.rounds for m in (r.policy_llm or {})})
    llm_actions = {m: np.full((N, T), -1, dtype=np.int8) for m in policy_models}
    llm_cost = {m: np.zeros((N, T)) for m in policy_models}
    for i, tr in enumerate(traces):
        norm = normalizer_for(tr.task, tr.family)
        ids: dict[str, int] = {}
        for t, r in enumerate(tr.rounds):
            correct[i, t] = (r.base.correct, r.guide.correct)
            answer_id[i, t, 0] = ids.setdefault(norm(r.base.answer), len(ids))
            answer_id[i, t, 1] = ids.setdefault(norm(r.guide.answer), len(ids))
            empty[i, t] = (norm(r.base.answer) == "", norm(r.guide.answer) == "")
            round_cost[i, t] = prices.round_cost(r)
            round_latency[i, t] = round_seconds(r)
            if r.guide.verdict is not None:
                verdict[i, t] = float(r.guide.verdict == "yes")
            if r.guide.uncertainty is not None:
                unc[i, t] = r.guide.uncertainty
            for m, d in (r.policy_llm or {}).items():
                llm_actions[m][i, t] = ACTION_INDEX[d.action]
                llm_cost[m][i, t] = prices.usage_cost(m, d.usage)
    labels = labels_of(traces)
    ref = reference_model(labels)
    strongest = ref if ref and all(ref in tr.models() for tr in traces) else ""
    strongest = strongest or strongest_model(traces, prices)
    s_cost, s_correct = strongest_calls(traces, prices, strongest) if strongest else (None, None)
    return Episodes(
        ids=[tr.id for tr in traces],
        task=task,
        obs=obs,
        correct=correct,
        answer_id=answer_id,
        round_cost=round_cost,
        verdict_yes=verdict,
        uncertainty=unc,
        llm_actions=llm_actions,
        llm_cost=llm_cost,
        empty=empty,
        feature_spec=feature_spec(signals),
        strongest=strongest,
        strongest_cost=s_cost,
        strongest_correct=s_correct,
        labels=labels,
        models=tuple(sorted(models)),
        strongest_step=alone_step(traces, strongest) if strongest else None,
        round_latency=round_latency,
        strongest_latency=strongest_seconds(traces, strongest) if strongest else None,
        routes=route_views(traces, prices),
        family=family_of(task, traces[0].family),
        one_model=all(is_solo(r) for tr in traces for r in tr.rounds),
        rungs=ladder_rungs(traces, prices),
        verify_rounds=_verify_rounds(traces),
        simulated=simulated_note(simulated_of(traces)),
    )


def _verify_rounds(traces: Sequence[Trace]) -> tuple[int, ...]:
    """The 0-based rounds that are verify steps, the same in every trace (else refused)."""
    found = {tuple(t for t, r in enumerate(tr.rounds) if is_verify(r)) for tr in traces}
    if len(found) > 1:
        raise CCPOError("the traces place their verify steps in different rounds: one ladder")
    return found.pop()


def _steps(tr: Trace) -> list[Any]:
    """The base and guide steps of a trace that answer, in the order the ladder calls them (a
    verify step's verifier gives a verdict, not an answer)."""
    return [s for r in tr.rounds for s in ((r.base,) if is_verify(r) else (r.base, r.guide))]


def strongest_model(traces: Sequence[Trace], prices: PriceTable) -> str:
    """The ladder's strongest model: the most expensive base/guide model (input + output price
    per token), ties to the one called last (round T's guide on a base/guide ladder); '' when
    some trace never calls it (mixed ladders: no ``always-<model>`` row then)."""
    order: dict[str, int] = {}
    for tr in traces:
        for k, s in enumerate(_steps(tr)):
            order[s.model] = max(order.get(s.model, -1), k)

    def key(m: str) -> tuple[float, int]:
        p = prices.price(m)
        return (p.input_usd_per_mtok + p.output_usd_per_mtok, order[m])

    best = max(order, key=key)
    return best if all(best in tr.models() for tr in traces) else ""


def strongest_calls(
    traces: Sequence[Trace], prices: PriceTable, model: str
) -> tuple[np.ndarray, np.ndarray]:
    """Per question, the cost [N] (USD) and correctness [N] of calling only ``model``: its
    last call in the ladder that is not a reuse of an earlier one (a reused step repeats that
    call's answer at no cost, so the call itself is the one to pay)."""
    cost = np.zeros(len(traces))
    correct = np.zeros(len(traces), dtype=bool)
    for i, tr in enumerate(traces):
        step = [s for s in _steps(tr) if s.model == model and not s.reused][-1]
        cost[i] = prices.usage_cost(model, step.usage)
        correct[i] = step.correct
    return cost, correct


def strongest_seconds(traces: Sequence[Trace], model: str) -> np.ndarray:
    """[N] estimated seconds of calling only ``model`` (the call :func:`strongest_calls`
    prices)."""
    out = np.zeros(len(traces))
    for i, tr in enumerate(traces):
        step = [s for s in _steps(tr) if s.model == model and not s.reused][-1]
        out[i] = call_seconds(step.usage.output_tokens)
    return out


def alone_step(traces: Sequence[Trace], model: str) -> tuple[int, str] | None:
    """(round t, role) of ``model``'s call that :func:`strongest_calls` prices, when it is the
    same step of every trace and an ``agree`` step (the model answers the question alone, so
    calling it alone asks exactly that request); ``None`` otherwise (a ``judge`` guide reads
    the base's answer: it cannot be called alone)."""
    found: set[tuple[int, str]] = set()
    for tr in traces:
        last = [
            (r, ro)
            for r in tr.rounds
            for ro in ("base", "guide")
            if _alone(r, ro, model) and not (ro == "guide" and is_verify(r))
        ]
        if not last or last[-1][0].verdict_mode != "agree":
            return None
        found.add((last[-1][0].round, last[-1][1]))
        if len(found) > 1:
            return None
    return next(iter(found)) if found else None


def _alone(r: Any, role: str, model: str) -> bool:
    step = getattr(r, role)
    return step.model == model and not step.reused


@dataclass(frozen=True)
class Metrics:
    """Per-question outcomes; every array has the same shape (e.g. [N] or [K, n])."""

    cost: np.ndarray  # USD
    covered: np.ndarray  # bool
    length: np.ndarray  # rounds run
    set_size: np.ndarray  # distinct answers returned
    latency: np.ndarray | None = None  # estimated seconds (None: from rounds run)
    #: [..., T, 2] bool: the steps run (a step repeating an earlier call stands for that
    #: call); None where the row does not say (the oracle bound)
    called: np.ndarray | None = None
    #: [..., T, 2] bool: the steps whose reply is returned (a set's non-empty members)
    returned: np.ndarray | None = None


def round_steps(ran: np.ndarray) -> np.ndarray:
    """[..., T, 2] bool: both steps of every round marked in ``ran`` [..., T] (read-only)."""
    ran = np.asarray(ran, dtype=bool)
    return np.broadcast_to(ran[..., None], (*ran.shape, 2))


def one_step(round_: np.ndarray, role: Any, horizon: int) -> np.ndarray:
    """[..., T, 2] bool: step (``round_``, ``role``) alone (0-based round and role index,
    arrays [...] or scalars broadcasting against each other)."""
    round_, role = np.asarray(round_), np.asarray(role)
    at = (np.arange(horizon) == round_[..., None])[..., None]
    return at & (np.arange(2) == role[..., None, None])


def step_mask(step: tuple[int, str], shape: tuple[int, ...], horizon: int) -> np.ndarray:
    """[*shape, T, 2] bool: step (round t, 1-based; role) alone, for every question
    (read-only)."""
    t, role = step
    return np.broadcast_to(one_step(t - 1, ACTIONS.index(role), horizon), (*shape, horizon, 2))


def _gather(arr: np.ndarray, idx: np.ndarray | None) -> np.ndarray:
    return arr if idx is None else arr[idx]


def point_rollout(
    ep: Episodes,
    actions: np.ndarray,
    idx: np.ndarray | None = None,
    extra_cost: np.ndarray | None = None,
) -> Metrics:
    """Score a point policy: ``actions`` [..., T] of ints in {0, 1, 2}, aligned with ``idx``.

    ``idx`` selects questions (shape of ``actions`` without its last axis); ``None`` means all N.
    The episode ends at the first answer action; ``next`` at round T is an error.
    ``extra_cost`` [N, T] is added per round run (e.g. the policy LLM's own calls).
    """
    actions = np.asarray(actions)
    T = ep.horizon
    if actions.shape[-1] != T:
        raise ValueError(f"actions must end in T={T}, got shape {actions.shape}")
    if np.any(actions[..., -1] == NEXT):
        raise ValueError("'next' is not allowed at the last round")
    is_answer = actions != NEXT
    stop = np.argmax(is_answer, axis=-1)  # first answer round (0-based)
    chosen = np.take_along_axis(actions, stop[..., None], axis=-1)[..., 0]
    correct = _gather(ep.correct, idx)  # [..., T, 2]
    hit = np.take_along_axis(
        np.take_along_axis(correct, stop[..., None, None], axis=-2)[..., 0, :],
        chosen[..., None],
        axis=-1,
    )[..., 0]
    cost_rt = _gather(ep.round_cost, idx)
    if extra_cost is not None:
        cost_rt = cost_rt + _gather(extra_cost, idx)
    ran = np.arange(T) <= stop[..., None]
    return Metrics(
        cost=(cost_rt * ran).sum(-1),
        covered=hit | ~_gather(ep.solvable, idx),
        length=stop + 1,
        set_size=np.ones_like(stop),
        called=round_steps(ran),
        returned=one_step(stop, chosen, T),
    )


def effective_scores(probs: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """Membership scores e(a|o_t) such that C_κ(o_t) = {a : e(a|o_t) ≥ κ} *with* the fallback.

    e = π for allowed actions, +inf for the argmax allowed action (it is in C(o_t) for every κ:
    either π(a*) ≥ κ, or C is empty and falls back to {a*}), and -inf for masked actions.
    """
    probs = np.asarray(probs, dtype=np.float64)
    masked = np.where(allowed, probs, -np.inf)
    e = masked.copy()
    top = np.argmax(masked, axis=-1)
    np.put_along_axis(e, top[..., None], np.inf, axis=-1)
    return e


def covering_scores(ep: Episodes, probs: np.ndarray) -> np.ndarray:
    """Per question, the largest κ at which the set-valued rollout still covers ([N] floats).

    s(q) = max over rounds t and correct answers a of min(e(a|o_t), min_{t'<t} e(next|o_t'));
    +inf for unsolvable questions (always covered). Coverage at κ is exactly ``s(q) ≥ κ``,
    because C_κ only grows as κ falls. This is the conformal score of batch calibration.
    """
    e = effective_scores(probs, ep.allowed)  # [N, T, 3]
    prefix = _reach_scores(e)  # [N, T]
    ans = np.minimum(e[..., :2], prefix[..., None])  # [N, T, 2]
    s = np.where(ep.correct, ans, -np.inf).max(axis=(1, 2))
    return np.where(ep.solvable, s, np.inf)


def _reach_scores(e: np.ndarray) -> np.ndarray:
    """min_{t'<t} e(next|o_t'): round t is reached iff this is ≥ κ (+inf for round 1)."""
    nxt = e[..., NEXT]
    shifted = np.concatenate([np.full((*nxt.shape[:-1], 1), np.inf), nxt[..., :-1]], axis=-1)
    return np.minimum.accumulate(shifted, axis=-1)


def _membership(e: np.ndarray, reach_s: np.ndarray, k) -> tuple[np.ndarray, np.ndarray]:
    """Rounds reached [..., T] and answers returned [..., T, 2] at threshold(s) ``k``."""
    reach = reach_s >= k
    included = (e[..., :2] >= k[..., None]) & reach[..., None]
    return reach, included


def conformal_sets(ep: Episodes, probs: np.ndarray, kappa: float) -> tuple[np.ndarray, np.ndarray]:
    """The set-valued rollout itself at one κ: rounds run [N, T] and answer actions in C
    [N, T, 2] (base, guide), for callers that need the answers, not just the metrics (the
    answers returned are :func:`returned_answers` of these: empty ones add none)."""
    e = effective_scores(probs, ep.allowed)
    return _membership(e, _reach_scores(e), np.float64(kappa))


def returned_answers(ep: Episodes, included: np.ndarray, sel: Any = slice(None)) -> np.ndarray:
    """The answers a set actually returns: the included ones that are not empty (an empty
    answer is never a member of a set). ``included`` [..., T, 2] for the questions ``sel``."""
    return included & ep.answered[sel]


def _paired(threshold: Any, idx: np.ndarray | None, name: str, trailing: int) -> tuple[Any, Any]:
    """(question selector, threshold broadcastable against it): all questions with a scalar
    threshold, or ``idx`` [K, n] with one threshold per row (a scalar repeated), shaped
    [K, 1, …] with ``trailing`` axes after the question axis."""
    t = np.asarray(threshold, dtype=np.float64)
    if idx is None:
        if t.ndim:
            raise ValueError(f"a vector of {name} needs idx of shape [K, n]")
        return slice(None), t
    idx = np.asarray(idx)
    if t.ndim == 0:
        t = np.full(idx.shape[0], float(t))
    if t.shape != idx.shape[:1]:
        raise ValueError(f"{name} {t.shape} must match idx rows {idx.shape[:1]}")
    return idx, t.reshape(-1, *([1] * trailing))


def conformal_rollout(
    ep: Episodes,
    probs: np.ndarray,
    kappa: float | np.ndarray,
    idx: np.ndarray | None = None,
) -> Metrics:
    """Score the conformal policy C(o) = {a : π(a|o) ≥ κ} with the set-valued rollout.

    ``probs`` [N, T, 3]; ``kappa`` a scalar or [K]; ``idx`` None (all N) or [K, n] question
    indices (one row per evaluation split, paired with ``kappa[k]``). Returns metrics of shape
    [N] or [K, n].
    """
    e = effective_scores(probs, ep.allowed)
    reach_s = _reach_scores(e)
    sel, k = _paired(kappa, idx, "kappa", 2)
    reach, included = _membership(e[sel], reach_s[sel], k)
    covered = (included & ep.correct[sel]).any(axis=(-1, -2)) | ~ep.solvable[sel]
    included = returned_answers(ep, included, sel)
    bits = np.where(included, np.left_shift(np.uint64(1), ep.answer_id[sel].astype(np.uint64)), 0)
    mask = np.bitwise_or.reduce(bits.reshape(*bits.shape[:-2], -1).astype(np.uint64), axis=-1)
    lat = None if ep.round_latency is None else (ep.round_latency[sel] * reach).sum(-1)
    return Metrics(
        cost=(ep.round_cost[sel] * reach).sum(-1),
        covered=covered,
        length=reach.sum(-1),
        set_size=np.bitwise_count(mask).astype(np.int64),
        latency=lat,  # the rounds reached (a prefix, or a routed start's view)
        called=round_steps(reach),
        returned=included,
    )


# ----------------------------------------------------------------------------- one answer
def answer_actions(answered: np.ndarray) -> np.ndarray:
    """The one answer a single-answer episode returns when it stops at round t: ``guide``
    (the stronger model's answer; the base's when it agreed) unless the guide gave none and
    the base did, then ``base``. ``answered`` [..., T, 2] bool → [..., T] in {BASE, GUIDE}."""
    answered = np.asarray(answered, dtype=bool)
    return np.where(~answered[..., GUIDE] & answered[..., BASE], BASE, GUIDE)


def single_clears(scores: np.ndarray, lam: Any) -> np.ndarray:
    """The stopping rule of a single-answer policy: round t *clears* (the episode may stop
    there) iff its stopping score h_t ≥ λ, and round T always clears. ``scores`` [..., T];
    ``lam`` a scalar or an array broadcasting against ``scores[..., 0]``. The episode stops at
    the first clearing round; the live agent, which has run rounds 1..t without stopping,
    stops at t iff round t clears."""
    scores = np.asarray(scores, dtype=np.float64)
    lam = np.asarray(lam, dtype=np.float64)
    out = scores >= lam[..., None]
    out[..., -1] = True
    return out


def single_stops(scores: np.ndarray, lam: Any) -> np.ndarray:
    """The 0-based stop round of each episode: the first round that :func:`single_clears`."""
    return np.argmax(single_clears(scores, lam), axis=-1)


def single_rollout(
    ep: Episodes, scores: np.ndarray, lam: Any, idx: np.ndarray | None = None
) -> Metrics:
    """Score a single-answer policy: stopping scores ``scores`` [N, T], threshold ``lam`` a
    scalar or [K] (one per row of ``idx`` [K, n]). Returns metrics of shape [N] or [K, n];
    covered = the one answer is correct or the question is not solvable; set size 1."""
    sel, k = _paired(lam, idx, "thresholds", 1)
    stop = single_stops(np.asarray(scores)[sel], k)
    hit = _returned_correct(ep.answered[sel], ep.correct[sel], stop)
    ran = np.arange(ep.horizon) <= stop[..., None]
    return Metrics(
        cost=(ep.round_cost[sel] * ran).sum(-1),
        covered=hit | ~ep.solvable[sel],
        length=stop + 1,
        set_size=np.ones_like(stop),
        called=round_steps(ran),
        returned=one_step(stop, stop_actions(ep.answered[sel], stop), ep.horizon),
    )


def single_losses(ep: Episodes, scores: np.ndarray, lams: np.ndarray) -> np.ndarray:
    """L_i(λ) = 1[the returned answer is wrong and question i is solvable] for every question
    of ``ep`` and every threshold of ``lams`` [M]: shape [M, N] (for calibration)."""
    lams = np.asarray(lams, dtype=np.float64)
    stop = single_stops(np.asarray(scores)[None], lams[:, None])  # [M, N]
    return ~_returned_correct(ep.answered[None], ep.correct[None], stop) & ep.solvable[None]


def stop_actions(answered: np.ndarray, stop: np.ndarray) -> np.ndarray:
    """[...] the answer action (:func:`answer_actions`) of the stop round ``stop`` [...]
    (``answered`` [..., T, 2], broadcasting against ``stop``)."""
    return np.take_along_axis(answer_actions(answered), stop[..., None], -1)[..., 0]


def _returned_correct(answered: np.ndarray, correct: np.ndarray, stop: np.ndarray) -> np.ndarray:
    """Whether the one answer returned at round ``stop`` [...] is correct (``answered``,
    ``correct`` [..., T, 2], broadcasting against ``stop``)."""
    act = stop_actions(answered, stop)
    corr = np.take_along_axis(correct, stop[..., None, None], -2)[..., 0, :]
    return np.take_along_axis(corr, act[..., None], -1)[..., 0]
