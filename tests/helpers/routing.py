"""A routed single-answer policy on the synthetic 4-model import (label-free), with its
router threshold set by hand so that routing is in play (a fixed τ keeps the guarantee: it is
chosen before calibration), or calibrated as ``train --route`` does (Pareto testing)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ccpo.evaluation.harness import load_episodes, trace_provenance
from ccpo.policies.registry import fit_policy
from ccpo.testing.ladder_table import write_ladder_table
from tests.helpers.cli import ccpo_ok


def imported_ladder(
    folder: Path, n: int = 300, seed: int = 0, steps: str = "pair", *extra: str
) -> tuple[Path, Path]:
    """(traces, prices) of the 4-model table imported without labels (agreement with big-m),
    as paired rounds (T = 3: what the routing tests were written for) or one model per step
    (``steps="one"``, T = 4); ``extra``: more ``traces import`` options (e.g. a verifier's)."""
    table, prices = write_ladder_table(folder, n=n, seed=seed, labels=False)
    traces = folder / "ladder.jsonl"
    ccpo_ok("traces", "import", str(table), "--task", "medqa", "--family", "mcq",
            "--prices", str(prices), "--out", str(traces), "--steps", steps, *extra)  # fmt: skip
    return traces, prices


def routed_policy(
    folder: Path, traces: Path, prices: Path, tau: float, alpha=0.2, embeddings: bool = False
) -> Path:
    """A ``cstop-lr-single+route`` policy fitted on the first half of ``traces``, calibrated
    at τ = ``tau`` (λ̂ by Learn-then-Test) on the other half, saved in ``folder``; with
    ``embeddings``, its router reads the traces' question embeddings (a text fallback)."""
    ep, table = load_episodes(traces, [str(prices)])
    order = np.arange(ep.n)
    pol = fit_policy("cstop-lr", ep, order[::2], alpha, 0, single=True, routed=True,
                     route_embeddings=embeddings, settings=PAC)  # fmt: skip
    fix_tau(pol, tau)
    pol.calibrate(ep, order[1::2])
    pol.provenance = {**trace_provenance(traces), "alpha": alpha}
    pol.prices = table.to_price_file()
    pol.save(folder)
    return folder


EMBED_MODEL = "emb-m"
#: Learn-then-Test at δ: what the routing guarantee tests were written for
PAC = {"guarantee": "pac"}


def difficulty_embedder(traces: Path, noise: float = 0.15, seed: int = 0):
    """A text → vector function for a scripted ``/embeddings`` endpoint that knows each
    question's difficulty: its first number is the share of the cheaper models that agree
    with big-m on it (plus Gaussian noise), the rest is noise. An embedding that carries what
    the text does not (the synthetic questions' texts differ only in their numbers)."""
    from ccpo.traces.io import read_traces

    rng = np.random.default_rng(seed)
    vec = {}
    for tr in read_traces(traces):
        share = np.mean([r.base.correct for r in tr.rounds])
        vec[tr.question] = [float(share + rng.normal(0, noise)), 1.0,
                            *rng.normal(0, 0.3, 6).round(6).tolist()]  # fmt: skip
    return lambda text: vec.get(text, [0.0] * 8)


def fix_tau(pol, tau: float) -> None:
    """Calibrate ``pol`` at the router threshold ``tau`` alone (λ by Learn-then-Test there),
    rather than along its Pareto sequence."""
    pol.taus, pol.sequence = (tau,), None


def routed_on_held_out(
    traces: Path, prices: Path, n_train: int, alpha: float, delta: float, tau: float | None,
    splits: int, embeddings: bool = False, settings: dict | None = None,
):  # fmt: skip
    """(episodes, a ``cstop-lr`` routed policy fitted on ``n_train`` questions (seed 0) with τ
    fixed at ``tau`` before calibration (None: τ and λ by Pareto testing), certified by
    Learn-then-Test at δ unless ``settings`` say otherwise (``{"guarantee": "marginal"}``),
    calibration
    halves [splits, n], test halves) of the other questions, drawn with seed 1: the setting
    of the held-out guarantee tests."""
    ep, _ = load_episodes(traces, [str(prices)])
    settings = PAC if settings is None else settings
    order = np.random.default_rng(0).permutation(ep.n)
    pol = fit_policy("cstop-lr", ep, order[:n_train], alpha, 0, single=True, delta=delta,
                     routed=True, route_embeddings=embeddings, settings=settings)  # fmt: skip
    if tau is not None:
        fix_tau(pol, tau)
    rest = order[n_train:]
    rng = np.random.default_rng(1)
    perms = np.stack([rng.permutation(rest) for _ in range(splits)])
    half = rest.size // 2
    return ep, pol, perms[:, :half], perms[:, half:]


def over_share(miss: np.ndarray, alpha: float) -> float:
    """The share of splits (rows of ``miss`` [K, n]) whose miss rate passes α + 2 SE."""
    n = miss.shape[1]
    return float((miss.mean(1) > alpha + 2 * np.sqrt(alpha * (1 - alpha) / n)).mean())


def held_out_splits(setting, alpha: float):
    """(refused [K], the share of test questions started after round 1, test metrics [K, n])
    of a :func:`routed_on_held_out` setting: (τ̂, λ̂) calibrated on each calibration split,
    scored on its test split."""
    ep, pol, cal, test = setting
    scores = pol.episode_scores(ep)
    th, refused = pol.split_thresholds(ep, scores, cal, alpha)
    later = float((pol.router.start(scores.probs[test], th[:, :1]) > 0).mean())
    return refused, later, pol.rollout(ep, scores, th, test)
