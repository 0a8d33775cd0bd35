"""Where the money goes: per rung of the ladder, how often a policy pays for its call, how
often it returns its reply, what it spends there, and what it spends on replies it never
returns.

A rung is a distinct paid call (:mod:`ccpo.traces.rungs`: a pair cascade's round 1 base and
every round's guide; one rung per round of one-model steps). From a replay's
:class:`~ccpo.traces.episodes.Metrics` (its ``called`` and ``returned`` steps), a rung is
*paid* on a question when some step run belongs to it, and *returned* when some step whose
reply is returned does (for a set: the reply is a member of the returned set). Spend on a
rung is its call's recorded cost where paid; spend *never returned* is the spend on paid
rungs whose reply is not returned. ``total`` is the replay's own cost, so anything not paid
for a rung's call (an LLM-as-policy's decisions) shows as ``other``. A verify step's rung is
its verifier's call: paid where the step is run and never returned (a verdict is not a reply
handed back), so its spend counts as never returned; stopping there returns the verified
reply's rung (:attr:`~ccpo.traces.rungs.Rungs.reply_of_step`).

Main names: :class:`MoneyFlow`, :func:`money_flow`. Used by ``check``, ``compare`` and the
report (docs/design.md, "How evaluation works").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ccpo.traces.episodes import Episodes, Metrics
from ccpo.traces.rungs import rung_masks


@dataclass(frozen=True)
class MoneyFlow:
    """Per rung (ladder order) the share of questions paid and returned, and mean USD per
    question spent and spent on a reply not returned; the replay's mean cost per question."""

    models: tuple[str, ...]
    steps: tuple[tuple[int, str], ...]  # (round t, role) of each rung's call
    paid: np.ndarray  # [R] share of questions on which the rung's call is paid
    returned: np.ndarray  # [R] share of questions on which its reply is returned
    spend: np.ndarray  # [R] mean USD per question spent on it
    unreturned: np.ndarray  # [R] mean USD per question spent on it, its reply not returned
    total_usd: float  # the replay's mean cost per question
    questions: int  # question draws averaged (questions × evaluation splits)
    #: [R] the model whose reply each rung verifies ('' a rung that answers); () none does
    verifies: tuple[str, ...] = ()

    @property
    def unreturned_usd(self) -> float:
        """Mean USD per question spent on replies never returned."""
        return float(self.unreturned.sum())

    @property
    def unreturned_share(self) -> float:
        """That spend as a share of the replay's cost (0 when it costs nothing)."""
        return self.unreturned_usd / self.total_usd if self.total_usd > 0 else 0.0

    @property
    def verdict_usd(self) -> float:
        """Mean USD per question spent on verify steps' verdicts (part of the unreturned)."""
        if not self.verifies:
            return 0.0
        return float(sum(u for u, v in zip(self.unreturned, self.verifies, strict=True) if v))

    @property
    def other_usd(self) -> float:
        """Mean USD per question not paid for a rung's reply (policy-LLM decisions)."""
        return max(0.0, self.total_usd - float(self.spend.sum()))

    def to_json(self) -> dict[str, Any]:
        """The ``money`` object of ``check --json`` and of a ``results.json`` row."""
        rungs = zip(
            self.models, self.steps, self.paid, self.returned, self.spend, self.unreturned,
            self.verifies or ("",) * len(self.models), strict=True,
        )  # fmt: skip
        out: dict[str, Any] = {
            "rungs": [
                {
                    "model": m,
                    "step": f"round {t} {role}",
                    "paid": float(p),
                    "returned": float(r),
                    "usd_per_question": float(s),
                    "unreturned_usd_per_question": float(u),
                    **({"verifies": v} if v else {}),
                }
                for m, (t, role), p, r, s, u, v in rungs
            ],
            "usd_per_question": self.total_usd,
            "unreturned_usd_per_question": self.unreturned_usd,
            "unreturned_share": self.unreturned_share,
            "other_usd_per_question": self.other_usd,
        }
        if self.verifies:  # (absent without verify steps: the object as before)
            out["verdict_usd_per_question"] = self.verdict_usd
        return out


def money_flow(ep: Episodes, m: Metrics, idx: np.ndarray | None = None) -> MoneyFlow | None:
    """Where the money of the replay ``m`` of questions ``idx`` of ``ep`` goes (all N when
    None; [K, n] for K evaluation splits, averaged over all K × n); None when the replay does
    not say which steps it ran and returned, or ``ep`` has no rungs (old pickles)."""
    rungs = ep.rungs
    if rungs is None or m.called is None or m.returned is None:
        return None
    sel: Any = slice(None) if idx is None else np.asarray(idx)
    R = rungs.count
    of_step = rungs.of_step[sel]
    paid = rung_masks(of_step, m.called, R).reshape(-1, R)
    ret = rung_masks(rungs.replies[sel], m.returned, R).reshape(-1, R)
    spend = paid * rungs.cost[sel].reshape(-1, R)
    return MoneyFlow(
        models=rungs.models,
        steps=rungs.steps,
        paid=paid.mean(0),
        returned=ret.mean(0),
        spend=spend.mean(0),
        unreturned=(spend * ~ret).mean(0),
        total_usd=float(np.mean(m.cost)),
        questions=int(paid.shape[0]),
        verifies=rungs.verifies,
    )
