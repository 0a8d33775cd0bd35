"""``collect``: a collection run, in this process (:mod:`ccpo.llm.run`: append-only output,
resume, budget, progress) or spread over worker processes (:mod:`ccpo.llm.workers`), which
keep the same guarantees.
"""

from __future__ import annotations

import asyncio

from ccpo.llm.config import CollectConfig
from ccpo.llm.run import CollectSummary, collect_async
from ccpo.llm.workers import collect_with_workers

__all__ = ["CollectSummary", "collect", "collect_async"]


def collect(cfg: CollectConfig, kind: str = "base-guide", progress: bool = True) -> CollectSummary:
    """Run a collection: in this process, or with ``cfg.workers`` > 1 in that many worker
    processes sharing the output, the cache and the budget (:mod:`ccpo.llm.workers`)."""
    if cfg.workers > 1:
        return collect_with_workers(cfg, kind, progress)
    return asyncio.run(collect_async(cfg, kind, progress))
