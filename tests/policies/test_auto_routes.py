"""``auto`` of one answer with ``--auto-route`` compares a router before any call, a cascade,
the two together and calling the strongest model alone, on validation data from the training
split only (without it, the default, the cascades and the reference alone).

The ladder is written by the test (seeded, illustrative, not LLM output): two models, the
strong one always right and 40× dearer per token. Half the prompts ask for a proof (the cheap
model is always wrong there), half for a greeting (always right); the cheap model's replies
look alike either way, so only the prompt tells them apart. A cascade has to pay both models on
every proof; a router sends proofs straight to the strong model.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ccpo.evaluation.harness import load_episodes
from ccpo.learning.config import StopConfig
from ccpo.policies.pipeline import train_policy
from ccpo.policies.routing.single import RoutedPolicy, routed_fit, routed_validation
from ccpo.policies.single import fit_single
from ccpo.policies.spec import parse_spec
from tests.helpers.cli import ccpo_ok

CHEAP, STRONG = "gpt-4.1-nano", "gpt-4o"
ALPHA, N = 0.2, 400


def prompt_ladder(folder: Path, n: int = N, seed: int = 11) -> Path:
    """Import the two-model table (module docstring) one model per step; the trace path."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        proof = bool(rng.random() < 0.5)
        topic = rng.choice(["primes", "graphs", "limits", "groups"])
        question = (
            f"Prove the lemma about {topic} number {i} rigorously, step by step."
            if proof
            else f"Say hello to my friend from {topic} club number {i}."
        )
        for model, right in ((CHEAP, not proof), (STRONG, True)):
            rows.append({"question_id": f"q{i:03d}", "question": question, "model": model,
                         "answer": f"reply {i} by {model}", "correct": right,
                         "input_tokens": 60, "output_tokens": 40})  # fmt: skip
    table = folder / "table.jsonl"
    table.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    traces = folder / "ladder.jsonl"
    ccpo_ok("traces", "import", str(table), "--task", "notes", "--family", "exact",
            "--out", str(traces))  # fmt: skip
    return traces


@pytest.fixture(scope="module")
def ladder(tmp_path_factory):
    ep, _ = load_episodes(prompt_ladder(tmp_path_factory.mktemp("auto_routes")))
    order = np.random.default_rng(0).permutation(ep.n)
    return ep, order[:120], order[120:]


def held_out(pol, ep, rest: np.ndarray, splits: int = 30):
    """(refused share, test metrics [K, n]) of ``pol`` calibrated on random halves of
    ``rest`` (seed 1), scored on the other halves."""
    rng = np.random.default_rng(1)
    perms = np.stack([rng.permutation(rest) for _ in range(splits)])
    cal, test = perms[:, : rest.size // 2], perms[:, rest.size // 2 :]
    scores = pol.episode_scores(ep)
    th, refused = pol.split_thresholds(ep, scores, cal, ALPHA)
    return refused.mean(), pol.rollout(ep, scores, th, test)


def test_auto_picks_a_routed_candidate_when_the_prompt_tells(ladder) -> None:
    ep, train, rest = ladder
    routes = parse_spec("auto", answer="single", settings={"auto_route": True})
    got = train_policy(routes, ep, train, ALPHA, 0)
    pol = got.policy
    figures = pol.info["auto"]["validation"]
    assert {"router", f"always-{STRONG}"} <= set(figures)
    assert any(k.endswith("+route") for k in figures)
    assert isinstance(pol, RoutedPolicy), pol.info["auto"]["picked"]
    cascade = train_policy(
        parse_spec("auto", answer="single"),
        ep,
        train,
        ALPHA,
        0,  # the default: no routes
    ).policy
    assert not isinstance(cascade, RoutedPolicy)
    named = cascade.info["auto"]["validation"]
    assert not any(k == "router" or k.endswith("+route") for k in named)
    refused, m = held_out(pol, ep, rest)
    refused_c, m_c = held_out(cascade, ep, rest)
    assert refused == 0 and refused_c == 0
    # the guarantee on held-out splits (LTT, δ = 0.1): mean acceptance ≥ 1 − α
    assert m.covered.mean() >= 1 - ALPHA
    # the router sends proofs straight to the strong model: the cascade pays both there
    always = ep.strongest_cost[rest].mean()
    routed_cost, cascade_cost = m.cost.mean() / always, m_c.cost.mean() / always
    assert routed_cost < 0.8 * cascade_cost, (routed_cost, cascade_cost)


def test_routed_validation_uses_training_questions_and_refuses_like_ltt(ladder) -> None:
    ep, train, _ = ladder
    cfg = StopConfig(alpha=ALPHA, seed=0)
    inner = fit_single(ep, train, cfg, "depth-k")
    pol, sub, sc = routed_fit(inner, ep, train, grid=1)
    assert sub.n == train.size  # the training questions only, in a permuted order
    assert pol.sequence is not None and set(pol.sequence[1:, 1]) <= {0.0, 1.0}
    cost, coverage, _ = routed_validation(sub, sc, pol.sequence, ALPHA, 0.1)
    assert np.isfinite(cost) and coverage >= 1 - ALPHA
    # α so small that 60 questions cannot certify even θ_0 (which misses nothing here, but
    # LTT needs n ≥ log δ / log(1 − α) ≈ 230 questions at α = 0.01): refused, +∞
    cost, coverage, _ = routed_validation(sub, sc, pol.sequence, 0.01, 0.1)
    assert cost == float("inf") and np.isnan(coverage)


def test_train_prints_the_candidates_and_serves_the_pick(ladder, tmp_path: Path) -> None:
    traces = prompt_ladder(tmp_path, n=200)
    out = tmp_path / "policy"
    res = ccpo_ok("train", "--traces", str(traces), "--answer", "single", "--alpha", "0.2",
                  "--auto-route", "--out", str(out))  # fmt: skip
    assert "router" in res.stdout and "+route" in res.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["auto"]["picked"] in summary["auto"]["validation"]
    dry = ccpo_ok("dry-run", "--policy", str(out), "--traces", str(traces))
    assert "200/200 answer sets equal the policy's replay" in " ".join(dry.stdout.split())
