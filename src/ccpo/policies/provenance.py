"""What a policy's recorded provenance must share with what it is used on.

A policy folder records where it came from (task, horizon T, trace file and its sha256,
base/guide models, whether the traces were synthetic). :func:`check_provenance` compares that
record with the traces or endpoints a policy is used on: a different task, T or set of ladder
signals is refused, the rest is a warning. Folders without provenance load as before and are
not checked.
"""

from __future__ import annotations

from typing import Any

from ccpo.errors import CCPOError

PROVENANCE_MUST_MATCH = ("task", "horizon")
"""Provenance fields whose mismatch makes a policy meaningless (refused)."""
PROVENANCE_SHOULD_MATCH = ("traces_sha256", "base_models", "guide_models", "synthetic")
"""Provenance fields whose mismatch is allowed but worth a warning."""


def check_provenance(recorded: dict[str, Any], actual: dict[str, Any], where: str) -> list[str]:
    """Compare a policy's recorded provenance with what it is used on (``where`` names both
    in messages). Raises :class:`CCPOError` when a field of :data:`PROVENANCE_MUST_MATCH`
    differs; returns one warning line per differing field of :data:`PROVENANCE_SHOULD_MATCH`.
    Fields absent on either side are not compared."""

    def differs(key: str) -> bool:
        return key in recorded and key in actual and recorded[key] != actual[key]

    for key in PROVENANCE_MUST_MATCH:
        if differs(key):
            raise CCPOError(
                f"{where}: the policy was trained with {key} = {recorded[key]!r} but is used "
                f"with {key} = {actual[key]!r}; train a policy for these traces/endpoints"
            )
    signals = [_signals(d) for d in (recorded, actual)]
    if None not in signals and signals[0] != signals[1]:
        raise CCPOError(
            f"{where}: the policy sees the ladder signals {signals[0] or 'none'} but the traces "
            f"record {signals[1] or 'none'}; train a policy on traces with the same signals"
        )
    notes = {
        "traces_sha256": lambda: (
            f"trained on {recorded.get('traces', 'another file')} (sha256 "
            f"{str(recorded['traces_sha256'])[:12]}), used on a file with sha256 "
            f"{str(actual['traces_sha256'])[:12]}"
        ),
        "base_models": lambda: (
            f"trained with base model(s) {', '.join(recorded['base_models'])}, used with "
            f"{', '.join(actual['base_models'])}"
        ),
        "guide_models": lambda: (
            f"trained with guide model(s) {', '.join(recorded['guide_models'])}, used with "
            f"{', '.join(actual['guide_models'])}"
        ),
        "synthetic": lambda: (
            "trained on SYNTHETIC traces (ccpo sim), used on real ones"
            if recorded["synthetic"]
            else "trained on real traces, used on synthetic ones"
        ),
    }
    return [f"{where}: {notes[k]()}" for k in PROVENANCE_SHOULD_MATCH if differs(k)]


def _signals(prov: dict[str, Any]) -> list[str] | None:
    """The signals of a provenance's ladder (None: no ladder recorded, not compared)."""
    ladder = prov.get("ladder")
    return None if not isinstance(ladder, dict) else list(ladder.get("signals") or [])
