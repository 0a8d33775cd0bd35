"""``ccpo check``: does a trained policy's guarantee hold on another trace file, as it stands?

``evaluate`` re-calibrates κ on every split of the file it is given, so it answers "how good
could this π be here"; a deployed policy runs with the κ̂ it was calibrated with. ``check``
replays the file with the policy's **own** κ̂ (the episode engine every scorer uses,
:func:`ccpo.traces.episodes.conformal_rollout`; no recalibration, no LLM call) and reports:

- **coverage** of its answer sets on the file, with a two-sided 95% **Clopper-Pearson**
  interval (:func:`ccpo.learning.conformal.coverage_interval`: exact binomial, valid for any
  true rate; the questions are taken as draws from the traffic the file stands for);
- the **verdict**: it *holds* unless the whole interval lies below 1 − α ("shortfall beyond
  noise", exit 1), a one-sided exact binomial test of coverage ≥ 1 − α at level 2.5%;
- cost per question (USD), mean answer-set size and rounds run;
- ``kappa_to_restore``: the split-conformal κ̂ of this file (the ⌊α(n+1)⌋-th smallest
  covering score, :func:`ccpo.learning.replay.calibrate_kappa`): its coverage on the file is
  ≥ 1 − α, and on new questions exchangeable with the file's it is ≥ 1 − α in expectation; set
  it as ``kappa:`` in the deploy config (or retrain on such traffic), with its cost beside it.

The checked policy is any :class:`ccpo.policies.Policy` but a greedy one (no κ to check).
A **single-answer** policy (:mod:`ccpo.policies.single`) is replayed
with its own threshold λ̂ by :func:`ccpo.traces.episodes.single_rollout` (one answer per
question; covered = that answer is right, or no round could answer); the report names its
threshold λ̂, and its ``kappa_to_restore`` (the ``kappa:`` key of the deploy config overrides
λ̂ too) is Learn-then-Test on this file at the policy's own δ (its risk on traffic like the
file's is ≤ α with probability ≥ 1 − δ), or ``None`` when no threshold is certified here
(running every round is not a value ``serve`` takes: retrain or raise α). The interval,
verdict and report are the same. Beside it, ``always-<reference>`` on the same questions
(:mod:`ccpo.evaluation.yardstick`): what calling the reference alone costs, and the policy's
cost as a share of it; and its mean estimated latency (:mod:`ccpo.traces.latency`) against
the latency budget it was trained with, if any (:mod:`ccpo.policies.budget`; the verdict and
the exit code stay the coverage's); and where the money goes (:mod:`ccpo.evaluation.money`):
per rung, the share of questions paid and returned, and the spend on replies never returned.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ccpo.errors import CCPOError, failing_as
from ccpo.evaluation.money import money_flow
from ccpo.evaluation.yardstick import yardstick
from ccpo.learning.conformal import coverage_interval
from ccpo.policies.base import Policy
from ccpo.policies.budget import budget_line
from ccpo.traces.episodes import Episodes, Metrics
from ccpo.traces.latency import mean_latency

LEVEL = 0.95
"""Confidence level of the coverage interval (two-sided)."""
INTERVAL = "Clopper-Pearson 95%"


@dataclass(frozen=True)
class CheckReport:
    """What ``ccpo check`` measured (``--json`` prints :meth:`to_json`)."""

    policy: str
    traces: str
    questions: int
    alpha: float
    target: float  # 1 − α
    against: str  # "accuracy" or "agreement with <model>"
    kappa: float  # the policy's own κ̂, as used
    coverage: float
    coverage_ci: tuple[float, float]
    interval: str
    holds: bool
    short: bool  # coverage < 1 − α (within noise when ``holds``)
    cost_usd_per_question: float
    set_size: float
    rounds: float
    kappa_to_restore: float | None  # None: no threshold serve takes is certified here
    coverage_at_restore: float
    cost_usd_per_question_at_restore: float
    unsolvable: float  # share of questions no round answers correctly (always covered)
    threshold_name: str = "κ̂"  # "λ̂" for a single answer, "" when the policy has none
    reference: str | None = None  # always-<model> on the same questions
    reference_cost_usd_per_question: float | None = None
    cost_ratio_to_reference: float | None = None
    latency_s_per_question: float | None = None  # estimated (None: the traces give none)
    latency_budget_s: float | None = None  # the policy's --latency-budget, if trained with one
    #: where the money goes at its own threshold (evaluation.money.MoneyFlow.to_json)
    money: dict[str, Any] | None = None
    simulated: str = ""  # what the file's simulated verdicts are (traces.verify); '' real

    @property
    def verdict(self) -> str:
        if not self.holds:
            return "shortfall beyond noise"
        return "holds (below target within noise)" if self.short else "holds"

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["coverage_ci"] = list(self.coverage_ci)
        d["verdict"] = self.verdict
        return d


def _means(m: Metrics) -> tuple[int, float, float, float]:
    """Questions covered, mean cost (USD), mean set size, mean rounds."""
    return (
        int(m.covered.sum()),
        float(m.cost.mean()),
        float(m.set_size.mean()),
        float(m.length.mean()),
    )


def _rollout_and_restore(policy: Policy, ep: Episodes, alpha: float):
    """(the policy's replay at a threshold, the threshold that restores 1 − α on ``ep``):
    calibrated on all of ``ep`` as the policy calibrates (module docstring)."""
    scores = policy.episode_scores(ep)
    restore, refused = policy.restoring().split_thresholds(ep, scores, np.arange(ep.n)[None], alpha)
    # a routed policy's split threshold is (τ, λ): λ is restored, at its own τ̂
    lam = float(np.ravel(restore[0])[-1])
    return (lambda k: policy.rollout(ep, scores, k)), lam, bool(refused[0])


def check_policy(
    policy: Policy, ep: Episodes, *, name: str = "policy", traces: str = "", against: str = ""
) -> CheckReport:
    """Score ``policy`` with its own κ̂ on every question of ``ep`` (see the module docstring)."""
    if policy.greedy:
        raise CCPOError(
            f"{name} is a point policy ({policy.variant}): it returns one answer without a "
            "threshold κ, so there is no calibrated guarantee to check; check a set-valued "
            "policy (ccpo train --method auto, ccpo, cpo-batch, ...)"
        )
    if ep.n == 0:
        raise CCPOError(f"{traces or 'the trace file'} holds no questions to check on")
    alpha, kappa = float(policy.alpha), float(policy.threshold)
    rollout, restore, refused = _rollout_and_restore(policy, ep, alpha)
    own = rollout(kappa)
    covered, cost, size, rounds = _means(own)
    latency = mean_latency(ep.round_latency, None, own)
    cov = covered / ep.n
    lo, hi = coverage_interval(covered, ep.n, LEVEL)
    cov_r, cost_r, _, _ = _means(rollout(restore))
    y = yardstick(name, policy, ep, np.arange(ep.n), cost)
    flow = money_flow(ep, own)
    return CheckReport(
        policy=name,
        traces=traces,
        questions=ep.n,
        alpha=alpha,
        target=1.0 - alpha,
        against=against,
        kappa=kappa,
        coverage=cov,
        coverage_ci=(lo, hi),
        interval=INTERVAL,
        holds=not hi < 1.0 - alpha,
        short=cov < 1.0 - alpha,
        cost_usd_per_question=cost,
        set_size=size,
        rounds=rounds,
        kappa_to_restore=None if refused or restore > 1.0 else restore,
        coverage_at_restore=cov_r / ep.n,
        cost_usd_per_question_at_restore=cost_r,
        unsolvable=float((~ep.solvable).mean()),
        threshold_name=policy.threshold_name,
        reference=None if y is None else y.name,
        reference_cost_usd_per_question=None if y is None else y.reference_usd,
        cost_ratio_to_reference=None if y is None else y.ratio,
        latency_s_per_question=None if math.isnan(latency) else latency,
        latency_budget_s=policy.provenance.get("latency_budget_s"),
        money=None if flow is None else flow.to_json(),
        simulated=ep.simulated,
    )


def run_check(
    policy_dir: Path, traces: Path, price_files: Sequence[Path] = ()
) -> tuple[CheckReport, list[str]]:
    """Load the policy folder and the trace file (priced with the bundled table, the policy's
    own prices, the file's sidecar prices, then ``price_files``), refuse another task or
    number of rounds, and check. Returns the report and the provenance warnings."""
    from ccpo.evaluation.harness import sidecar_prices, trace_provenance
    from ccpo.policies import check_provenance, load_policy
    from ccpo.traces.episodes import build_episodes
    from ccpo.traces.io import read_traces
    from ccpo.traces.labels import against_text
    from ccpo.traces.prices import load_prices, prices_from_mapping

    pol = load_policy(policy_dir)
    rec = pol.provenance
    actual = trace_provenance(traces)  # what the file is, its labels included
    warnings = check_provenance(rec, actual, f"--policy {policy_dir}")
    own = None if pol.prices is None else prices_from_mapping(pol.prices, f"{policy_dir}/prices")
    prices = load_prices(own, sidecar_prices(traces), *price_files)
    labels = actual["against"]
    trained_against = rec.get("against")
    if trained_against and trained_against != labels:
        warnings.append(
            f"--policy {policy_dir}: calibrated for {against_text(trained_against)}, checked "
            f"against {against_text(labels)}"
        )
    ep = build_episodes(read_traces(traces), prices)
    with failing_as(f"the policy {policy_dir} on {traces}"):
        report = check_policy(
            pol, ep, name=Path(policy_dir).name, traces=traces.name, against=against_text(labels)
        )
    return report, warnings


def _verdicts(money: dict[str, Any]) -> str:
    """How much of the spend never returned bought verify steps' verdicts ('' without any)."""
    usd = money.get("verdict_usd_per_question")
    return "" if usd is None else f", ${usd:.6f} of it on verify steps' verdicts"


def report_lines(r: CheckReport) -> list[str]:
    """The human-readable report (one fact a line). The threshold is named as the policy
    names it (κ̂ for sets, λ̂ for a single answer); a value is proposed only where one is
    certified on the file, and it is one ``serve`` takes (``kappa:`` in [0, 1])."""
    lo, hi = r.coverage_ci
    th = r.threshold_name
    own = f"its own {th} = {r.kappa:.4g}" if th else "no threshold (one model alone)"
    lines = [
        f"{r.policy} on {r.traces}: {r.questions} questions, α = {r.alpha:g} "
        f"(target {r.against or 'coverage'} ≥ {r.target:.3f}), {own}",
        f"coverage {r.coverage:.3f}  [{lo:.3f}, {hi:.3f}] ({r.interval})",
        f"cost ${r.cost_usd_per_question:.6f} per question; {r.set_size:.2f} answers, "
        f"{r.rounds:.2f} rounds on average; {r.unsolvable:.1%} of questions unanswerable by "
        "any round (counted as covered)",
    ]
    if r.simulated:
        lines.append(f"note: {r.simulated}")
    if r.reference is not None and r.cost_ratio_to_reference is not None:
        lines.append(
            f"{r.policy} costs {r.cost_ratio_to_reference:.0%} of {r.reference} on this file "
            f"(${r.reference_cost_usd_per_question:.6f} per question)"
        )
    sym = th.removesuffix("\u0302")  # κ̂ → κ: the value to set, not the estimate
    if th and r.kappa_to_restore is None:
        lines.append(
            f"no {sym} restores 1 − α on this file: even running every round is not certified "
            f"(coverage {r.coverage_at_restore:.3f}); retrain on traces like these or raise α"
        )
    elif th:
        lines.append(
            f"{sym} to restore 1 − α on this file: {r.kappa_to_restore:.4g} (coverage "
            f"{r.coverage_at_restore:.3f}, ${r.cost_usd_per_question_at_restore:.6f} per question)"
        )
    if r.latency_budget_s is not None:
        lat = math.nan if r.latency_s_per_question is None else r.latency_s_per_question
        lines.append(budget_line(lat, r.latency_budget_s))
    if r.money is not None:
        usd = r.money["unreturned_usd_per_question"]
        lines.append(
            f"${usd:.6f} per question ({r.money['unreturned_share']:.1%} of its cost, "
            f"${usd * r.questions:.4f} over the file) paid for replies never returned"
            + _verdicts(r.money)
            + " (where the money goes, per rung: the table below)"
        )
    lines.append(f"verdict: {r.verdict}")
    if not r.holds:
        fix = (
            f", or set kappa: {r.kappa_to_restore:.4g} in the deploy config (it overrides {th})"
            if r.kappa_to_restore is not None
            else ""
        )
        online = ", or serve with adapt_kappa and honest feedback" if th == "κ̂" else ""
        lines.append(
            f"the guarantee does not hold on this traffic: retrain on traces like these{fix}"
            f"{online}"
        )
    return lines
