"""Resolve policy names (and trained policy folders) into :class:`~ccpo.learning.baselines.Policy`."""

from __future__ import annotations

from collections.abc import Sequence

from ccpo.errors import CCPOError
from ccpo.learning.baselines import BASELINES, Policy, make_baseline
from ccpo.traces.episodes import Episodes


def available_baselines(ep: Episodes) -> list[str]:
    """Every baseline these traces allow (LLM-as-policy rows only where decisions are stored)."""
    return [*BASELINES, *(f"llm-policy:{m}" for m in sorted(ep.llm_actions))]


def resolve_policies(names: Sequence[str], ep: Episodes) -> list[Policy]:
    """``all`` expands to :func:`available_baselines`; duplicates are dropped, order kept."""
    out: list[str] = []
    for n in names:
        for part in n.split(","):
            part = part.strip()
            if not part:
                continue
            out.extend(available_baselines(ep) if part == "all" else [part])
    if not out:
        raise CCPOError("no policy given; pass --policy NAME")
    seen: dict[str, Policy] = {}
    for n in out:
        if n not in seen:
            seen[n] = make_baseline(n)
    return list(seen.values())
