"""Benchmark: routing by question embeddings against routing by text, and the fallback.

For trace files whose questions carry embeddings (``ccpo traces embed``: real ones from
all-MiniLM-L6-v2, served by ``benchmarks/embed_server.py``), each set is scored as it is and,
for sets with gold labels, label-free too (relabelled against its strongest model, as
``traces import --reference`` labels a table). For α in ``--alpha`` and seeds 0..4 (each
seed: its own training split, fits, ``--splits`` calibration/test splits of the held-out
questions, the sizes of ``ccpo compare``), rows:

- ``cstop-single``: no routing (the ablation);
- ``+route``: the text router (hashed n-grams; τ̂ chosen on the training split);
- ``+route-emb``: the router on text and embedding, with its text-only fallback; λ̂ is
  certified on the worse of the two per question (docs/theory.md), scored with every
  embedding there (``present``) and with none (``all fail``: every question falls back).

Printed: held-out acceptance (the guarantee: ≥ 1 − α with probability ≥ 1 − δ) and cost ÷
always-the-strongest, mean ± sd over seeds of the mean over splits.

    python benchmarks/bench_route_embeddings.py --data /tmp/embsets/arena-public.jsonl.gz \
        [--data …] [--seeds 5] [--splits 20] [--alpha 0.1 --alpha 0.2] [--out FILE]
"""

from __future__ import annotations

import time
from pathlib import Path

from _sweep import mean_sd, sweep_parser, write_results

from ccpo.errors import CCPOError
from ccpo.evaluation.harness import make_splits, prices_for, split_sizes
from ccpo.policies.registry import fit_policy
from ccpo.policies.routing.single import routed_outcomes
from ccpo.testing.relabel import relabel_against_strongest
from ccpo.traces.episodes import build_episodes
from ccpo.traces.io import read_traces

ROWS = ("cstop-single", "+route", "+route-emb present", "+route-emb all fail")


def _sets(paths: list[str]):
    for path in paths:
        prices = prices_for(path)
        traces = read_traces(path)
        name = Path(path).name.split(".")[0]
        labels = traces[0].meta.get("labels", "gold")
        if labels in (None, "gold"):
            yield f"{name} (gold)", build_episodes(traces, prices)
            free, ref = relabel_against_strongest(traces, prices)
            yield f"{name} (label-free, vs {ref})", build_episodes(free, prices)
        else:
            yield name, build_episodes(traces, prices)


def _score(ep, pol, sp, alpha, fallback=False):
    scores = pol.episode_scores(ep)
    th, refused = pol.split_thresholds(ep, scores, sp.cal, alpha)
    if hasattr(scores, "router"):
        m = routed_outcomes(ep, scores, th[:, :1], th[:, 1:], sp.test, fallback)[2]
    else:
        m = pol.rollout(ep, scores, th, sp.test)
    always = ep.strongest_cost[sp.test].sum(-1)
    return float(m.covered.mean()), float((m.cost.sum(-1) / always).mean()), float(refused.mean())


def run_seed(ep, alphas, seed: int, splits: int) -> dict:
    sp = make_splits(ep.n, split_sizes(ep.n), splits, seed)
    out = {}
    for alpha in alphas:
        got = {}
        for row, kw in (("cstop-single", {}), ("+route", {"routed": True}),
                        ("+route-emb", {"routed": True, "route_embeddings": True})):  # fmt: skip
            try:
                pol = fit_policy("cstop", ep, sp.train, alpha, seed, single=True, **kw)
            except CCPOError as e:
                print(f"  {row}: {e}")
                continue
            if row == "+route-emb":
                got["+route-emb present"] = _score(ep, pol, sp, alpha)
                got["+route-emb all fail"] = _score(ep, pol, sp, alpha, fallback=True)
            else:
                got[row] = _score(ep, pol, sp, alpha)
        out[alpha] = got
    return out


def main() -> None:
    ap = sweep_parser(__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("runs/bench_route_embeddings.json"))
    args = ap.parse_args()
    alphas = tuple(args.alpha or (0.1, 0.2))
    results = {}
    t0 = time.perf_counter()
    for label, ep in _sets(args.data or []):
        per = [run_seed(ep, alphas, s, args.splits) for s in range(args.seeds)]
        print(f"done {label} ({time.perf_counter() - t0:.0f} s)", flush=True)
        results[label] = {str(a): {r: [p[a][r] for p in per if r in p[a]] for r in ROWS}
                          for a in alphas}  # fmt: skip
        for a in alphas:
            print(f"\n{label}, α = {a}: {args.seeds} seeds × {args.splits} splits")
            print("| row | acceptance | cost ÷ always | refused |\n|---|---|---|---|")
            for r in ROWS:
                xs = results[label][str(a)][r]
                if xs:
                    acc, cost, ref = (mean_sd([x[k] for x in xs]) for k in range(3))
                    print(f"| {r} | {acc} | {cost} | {ref} |")
    write_results(args.out, results, f" ({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
