"""A policy's cost against calling the reference alone (``always-<reference>``), in words.

``train`` prints it for the calibration questions, ``check`` for the new traffic: "costs 74%
of always-gpt-4o" (never "saving: 74% of"), and a warning when the policy is not cheaper than
calling the reference (or, with gold labels, the strongest model) alone, the one policy that
needs no learning. ``auto`` then falls back to that policy (:mod:`ccpo.policies.reference`).

Main names: :class:`Yardstick`, :func:`yardstick`. Contract: docs/design.md, "The policy
interface"; the choice and its figures: docs/decisions.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ccpo.policies.base import Policy
from ccpo.policies.reference import METHOD as REFERENCE
from ccpo.policies.reference import reference_name
from ccpo.traces.episodes import Episodes


@dataclass(frozen=True)
class Yardstick:
    """A policy's mean cost per question beside ``always-<model>``'s on the same questions."""

    policy: str
    model: str
    cost_usd: float  # the policy's mean cost per question
    reference_usd: float  # calling ``model`` alone, mean per question
    is_reference: bool  # the policy is that very call
    fallback: bool = True  # auto can fall back to it (the model answers alone in the ladder)
    by_auto: bool = False  # auto picked the policy (on its training folds)

    @property
    def name(self) -> str:
        return reference_name(self.model)

    @property
    def ratio(self) -> float:
        return self.cost_usd / self.reference_usd if self.reference_usd > 0 else float("inf")

    def line(self) -> str:
        """ "pol costs 74% of always-gpt-4o (0.0123¢ vs 0.0166¢ per question)"."""
        if self.is_reference:
            return (
                f"{self.policy} calls {self.model} alone: {100 * self.cost_usd:.4g}¢ per question"
            )
        return (
            f"{self.policy} costs {self.ratio:.0%} of {self.name} ({100 * self.cost_usd:.4g}¢ vs "
            f"{100 * self.reference_usd:.4g}¢ per question)"
        )

    def warning(self) -> str | None:
        """Said when the policy is not cheaper than calling the reference alone."""
        if self.is_reference or self.cost_usd < self.reference_usd:
            return None
        if self.by_auto:  # it was cheaper on the training folds, not once calibrated
            what = (
                "auto chose it on its training folds, where it was cheaper; its calibrated "
                "threshold is dearer: more calibration questions or a larger --alpha may help"
            )
        elif self.fallback:
            what = (
                f"train with --method auto, which keeps {self.name} when no learned policy is "
                "cheaper"
            )
        else:
            what = "call it alone, or try a larger --alpha"
        return (
            f"{self.policy} is not cheaper than calling {self.model} alone: it costs "
            f"{self.ratio:.0%} of {self.name}; {what}"
        )


def yardstick(
    name: str,
    policy: Policy,
    ep: Episodes,
    idx: np.ndarray,
    cost_usd: float,
    by_auto: bool = False,
) -> Yardstick | None:
    """The comparison of ``policy`` (shown as ``name``; ``by_auto``: auto's pick) on the
    questions ``idx`` of ``ep`` (``cost_usd``: its mean there); ``None`` when the traces have
    no one model to call alone. ``always-<reference>`` is that very call."""
    if not ep.strongest or ep.strongest_cost is None or len(idx) == 0:
        return None
    ref = float(ep.strongest_cost[np.asarray(idx)].mean())
    fallback = ep.strongest_step is not None
    is_reference = policy.method == REFERENCE
    return Yardstick(name, ep.strongest, float(cost_usd), ref, is_reference, fallback, by_auto)
