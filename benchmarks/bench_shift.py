"""A distribution shift on bundled data, served live with feedback (issue 31, item 7).

    python benchmarks/bench_shift.py [--feedbacks 1000] [--alpha 0.1] [--seed 0]

``mmlu-public``'s 57 subjects are split by round-1 base accuracy
(:func:`ccpo.testing.shift.subject_shift`): a policy is trained (``ccpo train``, default
method) on the easier half and served (``ccpo serve``) on the harder half, every model of its
ladder answered by ``ccpo replay-server`` from the harder half's recorded outputs (zero API
cost, real HTTP on 127.0.0.1). A stationary stream of ``--feedbacks`` questions drawn with
replacement from the harder half (seeded) is asked one at a time, each followed by honest
feedback: ``unanswerable`` when no round of its trace answers correctly, else its gold
answer. Per setting of the online κ (``server:`` keys of the deploy config) it reports κ after
100 / 500 / 1,000 feedbacks, the coverage that κ gives on *all* harder-half questions
(replayed: the truth), the coverage served in each window, and the cost per question.

Settings: ``fixed κ̂`` (no adaptation), the defaults, ``kappa_eta0: 0.5`` (the issue's live
case), the widest allowed (every bound off: band 1, max_delta 1, no warm-up, η never
decays) and the slowest (η_0 0.005, max_delta 0.001, warm-up 200, η decays for ever); and the
defaults with unanswerable questions reported as ``none_of_them`` (what honest feedback had to
say before ``unanswerable`` existed).
"""

from __future__ import annotations

import argparse
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import yaml
from bench_ladder_serve import cli, start

from ccpo.learning.policy import load_policy
from ccpo.product.evaluate import sidecar_prices
from ccpo.testing.shift import subject_shift
from ccpo.traces.episodes import build_episodes, conformal_rollout
from ccpo.traces.io import read_traces
from ccpo.traces.prices import load_prices, prices_from_mapping

SETTINGS: dict[str, dict] = {
    "fixed κ̂": {"adapt_kappa": False},
    "defaults": {"adapt_kappa": True},
    "kappa_eta0 0.5": {"adapt_kappa": True, "kappa_eta0": 0.5},
    "widest": {"adapt_kappa": True, "kappa_eta0": 0.5, "kappa_band": 1.0,
               "kappa_max_delta": 1.0, "kappa_min_feedback": 0, "kappa_max_step": 1},
    "slowest": {"adapt_kappa": True, "kappa_eta0": 0.005, "kappa_max_delta": 0.001,
                "kappa_min_feedback": 200, "kappa_max_step": None},
    "defaults, unanswerable as a miss": {"adapt_kappa": True},
}  # fmt: skip
MARKS = (100, 500, 1000)


def stream(policy: Path, hard: Path, replay: str, work: Path, name: str, order, traces):
    """Serve ``order`` (indices into ``traces``) through a fresh ``ccpo serve`` with the
    setting ``name``; returns per feedback (κ in force after it, covered) and the costs."""
    work.mkdir(parents=True, exist_ok=True)
    cfg = work / "deploy.yaml"
    server = {**SETTINGS[name], "feedback_per_minute": None, "state": str(cfg) + ".sqlite"}
    cfg.write_text(yaml.safe_dump({"endpoints": {"*": {"url": replay + "/v1"}},
                                   "server": server}))  # fmt: skip
    sv, url = start("serve", "--policy", str(policy), "--config", str(cfg))
    miss_unanswerable = name.endswith("as a miss")
    kappas, covered, costs = [], [], []
    try:
        with httpx.Client(base_url=url, timeout=120) as http:
            for k, i in enumerate(order):
                tr = traces[i]
                a = http.post("/v1/answer", json={"question": tr.question, "id": f"f{k}"})
                a.raise_for_status()
                costs.append(a.json()["cost_usd"])
                solvable = any(s.correct for r in tr.rounds for s in (r.base, r.guide))
                if solvable:
                    fb = {"correct_answer": tr.gold[0]}
                else:
                    fb = {"none_of_them": True} if miss_unanswerable else {"unanswerable": True}
                f = http.post("/v1/feedback", json={"id": f"f{k}", **fb})
                f.raise_for_status()
                covered.append(f.json()["covered"])
                kappas.append(f.json()["kappa"])
    finally:
        sv.terminate()
        sv.communicate(timeout=30)
    return np.array(kappas), np.array(covered), np.array(costs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--feedbacks", type=int, default=1000)
    ap.add_argument("--alpha", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ccpo-bench-shift-"))
    easy, hard = subject_shift(work)
    policy = work / "policy"
    cli("train", "--traces", str(easy), "--alpha", str(args.alpha), "--seed", str(args.seed),
        "--out", str(policy))  # fmt: skip
    pol = load_policy(policy)
    prices = load_prices(prices_from_mapping(pol.prices), sidecar_prices(hard))
    traces = read_traces(hard)
    ep = build_episodes(traces, prices)
    probs = pol.probs(ep.obs)

    def true_coverage(kappa: float) -> float:
        return float(conformal_rollout(ep, probs, kappa).covered.mean())

    order = np.random.default_rng([args.seed, 31]).integers(0, len(traces), args.feedbacks)
    marks = [m for m in MARKS if m <= args.feedbacks]
    print(f"policy {pol.variant} trained on {easy.name} ({len(read_traces(easy))} questions), "
          f"κ̂ = {pol.kappa:.4f}; served on {hard.name} ({len(traces)} questions), "
          f"α = {args.alpha:g}; its κ̂ covers {true_coverage(pol.kappa):.3f} of them; the κ "
          "meeting 1 − α there (split-conformal on all of them) is in `ccpo check`")  # fmt: skip
    head = " | ".join(f"κ / true cov. after {m}" for m in marks)
    wins = " | ".join(f"served {a + 1}–{b}" for a, b in zip([0, *marks], marks, strict=False))
    print(f"| setting | {head} | {wins} | cost ¢/question |")
    print("|---" * (2 + 2 * len(marks)) + "|")
    rs, replay = start("replay-server", "--traces", str(hard))
    try:
        # one serve process per setting, all at once (each stream is sequential: κ's path
        # depends on the order of its feedback)
        with ThreadPoolExecutor(len(SETTINGS)) as pool:
            runs = {
                name: pool.submit(stream, policy, hard, replay, work / name, name, order, traces)
                for name in SETTINGS
            }
        for name, run in runs.items():
            kappas, cov, cost = run.result()
            after = " | ".join(
                f"{kappas[m - 1]:.3f} / {true_coverage(kappas[m - 1]):.3f}" for m in marks
            )
            served = " | ".join(
                f"{cov[a:b].mean():.3f}" for a, b in zip([0, *marks], marks, strict=False)
            )
            print(f"| {name} | {after} | {served} | {cost.mean() * 100:.4f} |", flush=True)
    finally:
        rs.terminate()
        rs.communicate(timeout=30)


if __name__ == "__main__":
    main()
