"""What a deployment runs and how it differs from what the policy was trained on: the ladder
(:func:`deployment_ladder`: the policy's own, or the config's base/guide pair for the paper's
one-pair protocol) and the provenance notes (:func:`deploy_provenance_notes`, warned as
:class:`PolicyProvenanceWarning`). Used by :class:`ccpo.runtime.agent.ConformalAgent`.
"""

from __future__ import annotations

import dataclasses

from ccpo.errors import CCPOError
from ccpo.policies.base import Policy
from ccpo.policies.provenance import check_provenance
from ccpo.runtime.config import DeployConfig
from ccpo.traces.ladder import Ladder
from ccpo.traces.verify import SIMULATED_KEY, simulated_note


class PolicyProvenanceWarning(UserWarning):
    """The policy was trained with other models than it is deployed with, or on synthetic
    traces (``warnings.simplefilter("error", PolicyProvenanceWarning)`` makes it refuse)."""


def deploy_provenance_notes(
    policy: Policy, task: str, horizon: int, ladder: Ladder, where: str
) -> list[str]:
    """The policy's recorded provenance against a live deployment of ``ladder`` (live
    endpoints: never synthetic): :class:`CCPOError` for another task or horizon, one note per
    other model or for a policy trained on synthetic traces (see
    :func:`ccpo.policies.provenance.check_provenance`)."""
    actual = {
        "task": task,
        "horizon": horizon,
        "base_models": sorted({r.base.model for r in ladder.rounds}),
        "guide_models": sorted({r.guide.model for r in ladder.rounds}),
        "synthetic": False,
    }
    notes = check_provenance(policy.provenance, actual, where)
    simulated = simulated_note(policy.provenance.get(SIMULATED_KEY))
    return [*notes, f"{where}: trained on traces whose {simulated}"] if simulated else notes


def _one_pair(ladder: Ladder) -> bool:
    first = ladder.rounds[0]
    return all(r == first and r.verdict == "judge" for r in ladder.rounds)


def deployment_ladder(policy: Policy, config: DeployConfig, horizon: int, where: str) -> Ladder:
    """The ladder a deployment runs: the policy's own (recorded by ``ccpo train``), or, for a
    policy trained on the paper's one-pair protocol or one without a recorded ladder, the
    config's ``base_model`` / ``guide_model`` pair in every round. The task is the policy's;
    ``task:`` in the config, where given, must agree (:func:`deploy_provenance_notes`)."""
    prov = policy.provenance
    recorded = prov.get("ladder")
    ladder = Ladder.from_dict(recorded, where) if recorded else None
    task = prov.get("task") or config.task
    if not task:
        raise CCPOError(
            f"{where}: the policy records no task; set task: in the config (or --task), the "
            "task it was trained on (it picks the prompts and the answer normaliser)"
        )
    if ladder is not None and horizon != ladder.T:
        raise CCPOError(f"{where}: its ladder has {ladder.T} rounds, the policy T = {horizon}")
    if ladder is None or (_one_pair(ladder) and (config.base_model or config.guide_model)):
        first = ladder.rounds[0] if ladder is not None else None
        base = config.base_model or (first.base.model if first else None)
        guide = config.guide_model or (first.guide.model if first else None)
        if not base:
            raise CCPOError("no base model: set base_model in the config (or --base-model)")
        if not guide:
            raise CCPOError("no guide model: set guide_model in the config (or --guide-model)")
        family = ladder.family if ladder is not None and ladder.task == task else None
        pair = Ladder.one_pair(task, base, guide, horizon, family)
        if ladder is None:
            return pair
        return dataclasses.replace(  # the policy's signals stay with the configured pair
            pair, signals=ladder.signals, embedding_model=ladder.embedding_model
        )
    return ladder
