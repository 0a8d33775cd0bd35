"""A distribution shift on bundled data, served live with feedback.

    python benchmarks/bench_shift.py [--feedbacks 1300] [--alpha 0.1] [--seed 0] [--streams 10]

``mmlu-public``'s 57 subjects are split by round-1 base accuracy
(:func:`ccpo.testing.shift.subject_shift`): a policy is trained (``ccpo train``, default
method) on the easier half and served (``ccpo serve``) on the harder half, every model of its
ladder answered by ``ccpo replay-server`` from the harder half's recorded outputs (zero API
cost, real HTTP on 127.0.0.1). A stationary stream of ``--feedbacks`` questions drawn with
replacement from the harder half (seeded) is asked one at a time, each followed by honest
feedback: ``unanswerable`` when no round of its trace answers correctly, else its gold
answer. The first ``--served`` feedbacks of every setting go through ``ccpo serve`` over
HTTP; the whole stream is then run in process with the same code (the replayed answer set at
the κ in force, :func:`ccpo.runtime.feedback.apply_feedback`), and the two must agree on
every κ, covered flag and cost of the served prefix (a live run of 1,000 feedbacks × 6
settings takes hours on 2 busy cores). Per setting of the online κ (``server:`` keys of the
deploy config) it reports κ after 100 / 500 / 1,000 feedbacks, the coverage that κ gives on
*all* harder-half questions (replayed: the truth), the coverage served in each window, and
the cost per question.

The tracker moves the level of the policy's calibration quantile (κ = Q(u), policies keep
their calibration scores; :mod:`ccpo.learning.conformal`); the rows marked "κ tracker" run the
same settings with κ moving itself (a policy without calibration scores), for comparison.
Besides the table of one stream, it reports the coverage over the second half of
``--streams`` seeded streams (mean and lowest), the team's check ("≥ 0.885 over the second
half of 1,300 shifted questions at ``kappa_eta0: 0.5``"), and the same for a stream *without*
shift (the harder half split in two by id: calibrated on one part, served on the other).

Settings: ``fixed κ̂`` (no adaptation), the defaults, ``kappa_eta0: 0.5`` (the live
case), the same with the band opened to 1 (what an operator does when ``ccpo check`` says the
traffic needs a κ outside κ̂ ± 0.1), the widest allowed (every bound off: band 1, max_delta 1,
no warm-up, η never decays) and the slowest (η_0 0.005, max_delta 0.001, warm-up 200, η
decays for ever); and the defaults with unanswerable questions reported as ``none_of_them``
(what honest feedback had to say before ``unanswerable`` existed).
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

from ccpo.evaluation.harness import sidecar_prices
from ccpo.policies.registry import load_policy
from ccpo.runtime.config import ServerConfig
from ccpo.runtime.feedback import Counters, apply_feedback, online_kappa
from ccpo.testing.shift import subject_shift
from ccpo.traces.episodes import build_episodes, conformal_rollout, covering_scores
from ccpo.traces.io import read_traces
from ccpo.traces.prices import load_prices, prices_from_mapping

SETTINGS: dict[str, dict] = {
    "fixed κ̂": {"adapt_kappa": False},
    "defaults": {"adapt_kappa": True},
    "kappa_eta0 0.5": {"adapt_kappa": True, "kappa_eta0": 0.5},
    "kappa_eta0 0.5, band 1": {"adapt_kappa": True, "kappa_eta0": 0.5, "kappa_band": 1.0},
    "widest": {"adapt_kappa": True, "kappa_eta0": 0.5, "kappa_band": 1.0,
               "kappa_max_delta": 1.0, "kappa_min_feedback": 0, "kappa_max_step": 1},
    "slowest": {"adapt_kappa": True, "kappa_eta0": 0.005, "kappa_max_delta": 0.001,
                "kappa_min_feedback": 200, "kappa_max_step": None},
    "defaults, unanswerable as a miss": {"adapt_kappa": True},
    "κ tracker, defaults": {"adapt_kappa": True},
    "κ tracker, kappa_eta0 0.5": {"adapt_kappa": True, "kappa_eta0": 0.5},
    "κ tracker, kappa_eta0 0.5, band 1": {"adapt_kappa": True, "kappa_eta0": 0.5,
                                         "kappa_band": 1.0},
}  # fmt: skip
MARKS = (100, 500, 1000, 1300)


def stream(policy: Path, hard: Path, replay: str, work: Path, name: str, order, traces):
    """Serve ``order`` (indices into ``traces``) through a fresh ``ccpo serve`` with the
    setting ``name``; returns per feedback (κ in force after it, covered) and the costs."""
    work.mkdir(parents=True, exist_ok=True)
    cfg = work / "deploy.yaml"
    server = {**SETTINGS[name], "feedback_per_minute": 1e9, "state": str(cfg) + ".sqlite"}
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


def simulate(pol, ep, probs, order, name: str):
    """The same stream in process: per feedback, the replayed answer set at the κ in force
    (covered iff its covering score ≥ κ, :func:`ccpo.traces.episodes.covering_scores`) and the
    server's own feedback step (:func:`ccpo.runtime.feedback.online_kappa`,
    :func:`~ccpo.runtime.feedback.apply_feedback`: the code ``serve`` runs)."""
    cfg = ServerConfig(**{**SETTINGS[name], "state": None})
    tracker, bounds = online_kappa(
        pol.kappa,
        pol.alpha,
        pol.config.eta0 / pol.config.batch_size,
        pol.config.xi,
        cfg,
        None if name.startswith("κ tracker") else pol.calibration,
    )
    scores, solvable = covering_scores(ep, probs), ep.solvable
    miss_unanswerable = name.endswith("as a miss")
    c, kappas, covered, costs = Counters(), [], [], []
    for i in order:
        kappa = tracker.kappa
        costs.append(float(conformal_rollout(ep, probs, [kappa], np.array([[i]])).cost[0, 0]))
        hit = bool(scores[i] >= kappa) and (solvable[i] or not miss_unanswerable)
        apply_feedback(tracker, c, hit, cfg.adapt_kappa, cfg.kappa_max_step, bounds)
        kappas.append(tracker.kappa)
        covered.append(hit)
    return np.array(kappas), np.array(covered), np.array(costs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--feedbacks", type=int, default=1300)
    ap.add_argument("--streams", type=int, default=10, help="seeded streams for the summary")
    ap.add_argument(
        "--served",
        type=int,
        default=60,
        help="feedbacks served over HTTP per "
        "setting, to check that the in-process stream is what serve does",
    )
    ap.add_argument("--alpha", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ccpo-bench-shift-"))
    easy, hard = subject_shift(work)
    policy = work / "policy"
    cli("train", "--traces", str(easy), "--alpha", str(args.alpha), "--seed", str(args.seed),
        "--out", str(policy))  # fmt: skip
    pol = load_policy(policy)
    bare = load_policy(policy)  # the same policy without its calibration scores
    bare.calibration = None
    bare_folder = bare.save(work / "policy-without-calibration-scores")
    prices = load_prices(prices_from_mapping(pol.prices), sidecar_prices(hard))
    traces = read_traces(hard)
    ep = build_episodes(traces, prices)
    probs = pol.probs(ep.obs)

    def true_coverage(kappa: float) -> float:
        return float(conformal_rollout(ep, probs, kappa).covered.mean())

    order = np.random.default_rng([args.seed, 31]).integers(0, len(traces), args.feedbacks)
    # served over HTTP (replay-server + serve), one process per setting, all at once
    rs, replay = start("replay-server", "--traces", str(hard))
    try:
        with ThreadPoolExecutor(len(SETTINGS)) as pool:
            runs = {
                name: pool.submit(stream,
                                  bare_folder if name.startswith("κ tracker") else policy,
                                  hard, replay, work / name, name, order[: args.served], traces)
                for name in SETTINGS
            }  # fmt: skip
        served = {name: run.result() for name, run in runs.items()}
    finally:
        rs.terminate()
        rs.communicate(timeout=30)
    sims = {name: simulate(pol, ep, probs, order, name) for name in SETTINGS}
    for name in SETTINGS:
        (k_http, c_http, cost_http), (k_sim, c_sim, cost_sim) = served[name], sims[name]
        n = args.served
        same = (np.allclose(k_http, k_sim[:n], atol=1e-12) and (c_http == c_sim[:n]).all()
                and np.allclose(cost_http, cost_sim[:n], rtol=1e-9))  # fmt: skip
        print(f"{name}: first {n} feedbacks served over HTTP == in process: {same}")
        if not same:
            raise SystemExit(f"{name}: the in-process stream differs from serve")
    marks = [m for m in MARKS if m <= args.feedbacks]
    print(f"policy {pol.variant} trained on {easy.name} ({len(read_traces(easy))} questions), "
          f"κ̂ = {pol.kappa:.4f}; served on {hard.name} ({len(traces)} questions), "
          f"α = {args.alpha:g}; its κ̂ covers {true_coverage(pol.kappa):.3f} of them")  # fmt: skip
    head = " | ".join(f"κ / true cov. after {m}" for m in marks)
    wins = " | ".join(f"served {a + 1}–{b}" for a, b in zip([0, *marks], marks, strict=False))
    print(f"| setting | {head} | {wins} | cost ¢/question |")
    print("|---" * (2 + 2 * len(marks)) + "|")
    for name, (kappas, cov, cost) in sims.items():
        after = " | ".join(
            f"{kappas[m - 1]:.3f} / {true_coverage(kappas[m - 1]):.3f}" for m in marks
        )
        wins = " | ".join(
            f"{cov[a:b].mean():.3f}" for a, b in zip([0, *marks], marks, strict=False)
        )
        print(f"| {name} | {after} | {wins} | {cost.mean() * 100:.4f} |", flush=True)
    half = args.feedbacks // 2
    print(f"\ncoverage over feedbacks {half + 1}–{args.feedbacks}, {args.streams} seeded "
          f"streams (seeds {args.seed}…{args.seed + args.streams - 1}):")  # fmt: skip
    print("| setting | shifted: mean (lowest) | cost ¢ | no shift: mean (lowest) | cost ¢ |")
    print("|---|---|---|---|---|")
    shifted = {name: [] for name in SETTINGS}
    same = {name: [] for name in SETTINGS}
    for k in range(args.seed, args.seed + args.streams):
        o = np.random.default_rng([k, 31]).integers(0, len(traces), args.feedbacks)
        for name in SETTINGS:
            _, cov, cost = simulate(pol, ep, probs, o, name)
            shifted[name].append((cov[half:].mean(), cost[half:].mean()))
        # no shift: the harder half split in two by id, κ̂ and its scores from one part
        cal_idx, serve_idx = _halves(traces, k)
        local = _recalibrated(pol, ep, probs, cal_idx)
        o = np.random.default_rng([k, 32]).choice(serve_idx, args.feedbacks)
        for name in SETTINGS:
            _, cov, cost = simulate(local, ep, probs, o, name)
            same[name].append((cov[half:].mean(), cost[half:].mean()))
    for name in SETTINGS:
        a, b = np.array(shifted[name]), np.array(same[name])
        print(f"| {name} | {a[:, 0].mean():.3f} ({a[:, 0].min():.3f}) | "
              f"{a[:, 1].mean() * 100:.4f} | {b[:, 0].mean():.3f} ({b[:, 0].min():.3f}) | "
              f"{b[:, 1].mean() * 100:.4f} |", flush=True)  # fmt: skip


def _halves(traces, seed: int):
    """The questions split in two by a seeded hash of their id (order-free)."""
    from ccpo.evaluation.harness import id_order

    order = id_order([t.id for t in traces], seed)
    return np.sort(order[: len(order) // 2]), np.sort(order[len(order) // 2 :])


def _recalibrated(pol, ep, probs, cal):
    """A copy of ``pol`` whose κ̂ and calibration scores come from the questions ``cal``."""
    import copy

    from ccpo.learning.replay import calibrate_policy

    local = copy.copy(pol)
    calibrate_policy(local, ep, probs, pol.alpha, cal)
    return local


if __name__ == "__main__":
    main()
