"""The Python API: live rollouts over real HTTP against the scripted LLM server."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from ccpo.errors import CCPOError, UnknownModelPriceError
from ccpo.llm.client import BudgetExceeded
from ccpo.llm.collect import collect
from ccpo.llm.config import build_config
from ccpo.policies.rl import TrainedPolicy
from ccpo.runtime import AnswerSet, ConformalAgent, RequestBudgetExceeded
from ccpo.runtime.agent import policy_horizon
from ccpo.testing.scripted_server import prompt_text
from ccpo.traces.answers import normalizer_for
from ccpo.traces.episodes import NEXT, build_episodes, conformal_rollout, conformal_sets
from ccpo.traces.io import read_traces
from tests.helpers.policies import make_policy
from tests.helpers.serve import deploy_values

MMLU_Q = "Which is a prime number?\nA. 4\nB. 6\nC. 7\nD. 9"


def test_live_rollout_equals_replay_of_the_same_run(world, any_policy_dir, prices_path, tmp_path):
    """Collect full traces, replay them with conformal_sets/conformal_rollout, then ask the
    live agent the same questions: same rounds run, same answer set, same cost."""
    cfg = build_config(
        None,
        dict(
            task="mmlu",
            n=10,
            rounds=4,
            base_model="base-m",
            base_url=world.url,
            guide_model="guide-m",
            guide_url=world.url,
            out=str(tmp_path / "t.jsonl"),
            no_cache=True,
            prices=[str(prices_path)],
            concurrency=4,
            timeout=5.0,
            backoff_base=0.005,
        ),
    )
    assert collect(cfg, progress=False).complete
    traces = read_traces(tmp_path / "t.jsonl")
    agent = ConformalAgent.from_artifact(any_policy_dir, deploy_values(world, prices_path))
    ep = build_episodes(traces, agent.prices)
    probs = agent.policy.probs(ep.obs)
    norm = normalizer_for("mmlu")
    nxt = probs[:, :-1, NEXT].ravel()
    kappas = [0.0, *np.quantile(nxt, [0.2, 0.5, 0.8]).tolist(), agent.kappa, 1.0]
    lengths = set()
    with agent:
        for kappa in kappas:
            reach, included = conformal_sets(ep, probs, kappa)
            m = conformal_rollout(ep, probs, kappa)
            for i, tr in enumerate(traces):
                world.reset_counters()
                s = agent.answer(tr.question, kappa=kappa)
                assert s.rounds == int(m.length[i]) == int(reach[i].sum())
                assert world.n_requests == 2 * s.rounds  # no call after `next` left C(o_t)
                assert s.cost_usd == pytest.approx(float(m.cost[i]), rel=1e-9, abs=1e-15)
                expected: list[str] = []
                for t, r in enumerate(tr.rounds):
                    for a, step in ((0, r.base), (1, r.guide)):
                        if included[i, t, a] and norm(step.answer) not in expected:
                            expected.append(norm(step.answer))
                assert [norm(a) for a in s.answers] == expected
                assert len(s.answers) == int(m.set_size[i])
                for t, log in enumerate(s.log):  # the log is the trace's rounds
                    assert log.base_answer == tr.rounds[t].base.answer
                    assert log.guide_verdict == tr.rounds[t].guide.verdict
                    np.testing.assert_allclose(
                        [log.pi[a] for a in ("base", "guide", "next")], probs[i, t], atol=1e-6
                    )
                lengths.add(s.rounds)
    assert len(lengths) >= 2, "the κ grid should exercise early stops and longer runs"


def test_answer_set_fields_and_async_twin(world, policy_dir, prices_path):
    agent = ConformalAgent.from_artifact(policy_dir, deploy_values(world, prices_path))
    s = agent.answer(MMLU_Q, id="q1")
    assert isinstance(s, AnswerSet) and s.id == "q1" and s.format == "ccpo.answer/v1"
    assert s.alpha == pytest.approx(0.1) and s.kappa == pytest.approx(0.3)
    assert s.horizon == 4 and 1 <= s.rounds <= 4 and len(s.log) == s.rounds
    assert set(s.cost_by_model) == {"base-m", "guide-m"}
    assert sum(s.cost_by_model.values()) == pytest.approx(s.cost_usd)
    assert s.cost_usd == pytest.approx(sum(r.cost_usd for r in s.log))
    for r in s.log[:-1]:
        assert "next" in r.actions
    assert "next" not in s.log[-1].actions
    assert s.log[-1].pi["next"] == 0.0 or s.rounds < 4
    agent.close()

    async def main():
        ag = ConformalAgent.from_artifact(policy_dir, deploy_values(world, prices_path))
        out = await asyncio.gather(*(ag.aanswer(MMLU_Q + f" ({k})") for k in range(4)))
        await ag.aclose()
        return out

    outs = asyncio.run(main())
    assert len({o.id for o in outs}) == 4


def test_point_policy_acts_greedily(world, prices_path, tmp_path):
    folder = make_policy(tmp_path / "cpo", method="cpo", steps=5)
    agent = ConformalAgent.from_artifact(folder, deploy_values(world, prices_path))
    assert agent.kappa is None
    s = agent.answer(MMLU_Q)
    assert s.kappa is None and len(s.answers) == 1
    for r in s.log:
        assert len(r.actions) == 1
    agent.close()
    with pytest.raises(CCPOError, match="point policy"):
        ConformalAgent.from_artifact(folder, deploy_values(world, prices_path, kappa=0.2))


def test_budgets(world, policy_dir, prices_path):
    # per request: κ = 0 always wants another round; 60% of what all 4 rounds cost stops the
    # question part-way (before a round, or before a call whose worst case would not fit)
    values = deploy_values(world, prices_path, kappa=0.0, max_tokens=16)
    with ConformalAgent.from_artifact(policy_dir, values) as agent:
        full = agent.answer(MMLU_Q)
    assert full.rounds == 4
    agent = ConformalAgent.from_artifact(
        policy_dir, {**values, "max_cost_per_request": 0.6 * full.cost_usd}
    )
    world.reset_counters()
    with pytest.raises(RequestBudgetExceeded, match="budget"):
        agent.answer(MMLU_Q)
    assert 0 < world.n_requests < 8 and agent.spent_usd <= 0.6 * full.cost_usd
    # round 1 is checked too: a budget below a call's worst case sends nothing
    world.reset_counters()
    with pytest.raises(RequestBudgetExceeded, match="question 'q1': the next call could cost"):
        agent.answer(MMLU_Q, id="q1", max_cost=1e-300)
    assert world.n_requests == 0
    agent.close()
    # total: questions run until the next one's worst case (its ladder's, at T x the
    # largest worst case of a round; short max_tokens keep it near what questions pay)
    # could pass the cap; never past it
    cap = 0.01
    agent = ConformalAgent.from_artifact(
        policy_dir, deploy_values(world, prices_path, max_cost_total=cap, max_tokens=16)
    )
    costs = []
    with pytest.raises(BudgetExceeded, match="budget"):
        for i in range(100):
            costs.append(agent.answer(f"{MMLU_Q} #{i}").cost_usd)
    assert len(costs) >= 2 and agent.spent_usd <= cap
    assert agent.spent_usd == pytest.approx(sum(costs))  # no money went to a cut question
    world.reset_counters()
    with pytest.raises(BudgetExceeded, match="budget"):
        agent.answer(MMLU_Q + "?")
    assert world.n_requests == 0
    agent.close()


def test_under_a_total_budget_questions_are_admitted_on_a_whole_questions_cost(
    world, policy_dir, prices_path
):
    """A question's wallet is T x the costliest round of the questions *over* so far (plus a
    call's worst case): one arriving while the first question is in its second round waits
    for it to end, rather than being admitted on its first round, the cheapest (its prompts
    grow), with a wallet too small for its last calls."""
    world.latency = 0.02
    values = deploy_values(world, prices_path, kappa=0.0, max_cost_total=1.0)
    agent = ConformalAgent.from_artifact(policy_dir, values)

    async def go() -> tuple[AnswerSet, AnswerSet]:
        first = asyncio.ensure_future(agent.aanswer(f"{MMLU_Q} #first"))
        while world.n_requests < 3:  # round 2 sent: round 1 paid for
            await asyncio.sleep(0.002)
        second = await agent.aanswer(f"{MMLU_Q} #second")
        return await first, second

    with agent:
        a, b = asyncio.run(go())
    assert a.rounds == b.rounds == 4  # κ = 0: every round
    texts = [prompt_text(r) for r in world.requests]
    firsts = [i for i, t in enumerate(texts) if "#first" in t]
    seconds = [i for i, t in enumerate(texts) if "#second" in t]
    assert len(firsts) == len(seconds) == 8
    assert max(firsts) < min(seconds), (firsts, seconds)


def test_config_errors(world, policy_dir, prices_path, tmp_path):
    with pytest.raises(CCPOError, match="no task"):
        ConformalAgent.from_artifact(policy_dir, deploy_values(world, prices_path, task=None))
    with pytest.raises(CCPOError, match="trained on T = 4"):
        ConformalAgent.from_artifact(policy_dir, deploy_values(world, prices_path, rounds=3))
    with pytest.raises(UnknownModelPriceError):
        ConformalAgent.from_artifact(
            policy_dir, deploy_values(world, prices_path, guide_model="nobody-m")
        )
    cfg = tmp_path / "deploy.yaml"
    cfg.write_text(f"task: mmlu\nbase_model: base-m\nbase_url: {world.url}\nbogus: 1\n")
    with pytest.raises(CCPOError, match="bogus"):
        ConformalAgent.from_artifact(policy_dir, cfg)
    assert policy_horizon(TrainedPolicy.load(policy_dir)) == 4


def test_yaml_config_and_overrides(world, policy_dir, prices_path, tmp_path):
    cfg = tmp_path / "deploy.yaml"
    cfg.write_text(
        f"task: mmlu\nbase-model: base-m\nbase_url: {world.url}\nguide_model: guide-m\n"
        f"guide_url: {world.url}\nprices: {prices_path}\ntimeout: 5\n"
    )
    with ConformalAgent.from_artifact(policy_dir, cfg, kappa=0.0) as agent:
        s = agent.answer(MMLU_Q)
    assert s.kappa == 0.0 and s.rounds == 4
    assert Path(cfg).exists()


def _with_provenance(src: Path, dst: Path, **prov) -> Path:
    """A copy of the policy folder ``src`` whose policy.json records ``prov`` as provenance."""
    import json
    import shutil

    shutil.copytree(src, dst)
    meta = json.loads((dst / "policy.json").read_text())
    meta["provenance"] = prov
    (dst / "policy.json").write_text(json.dumps(meta))
    return dst


def test_the_constructor_checks_provenance(world, policy_dir, prices_path, tmp_path):
    """Code using ConformalAgent directly gets the same check as `ccpo ask`/`serve`: another
    task or horizon refuses; other models or synthetic training traces warn (catchable as
    errors with warnings.simplefilter); a matching provenance says nothing."""
    import warnings

    from ccpo.policies.registry import load_policy
    from ccpo.runtime.agent import PolicyProvenanceWarning
    from ccpo.runtime.config import load_deploy_config

    cfg = load_deploy_config(None, deploy_values(world, prices_path))  # mmlu, base-m, guide-m
    same = dict(task="mmlu", horizon=4, base_models=["base-m"], guide_models=["guide-m"])
    for bad, needle in (({"task": "sim-qa"}, "task = 'sim-qa'"), ({"horizon": 3}, "horizon = 3")):
        pol = load_policy(_with_provenance(policy_dir, tmp_path / needle[:4], **{**same, **bad}))
        with pytest.raises(CCPOError, match=needle):
            ConformalAgent(pol, cfg)
    other = _with_provenance(
        policy_dir, tmp_path / "other", **{**same, "base_models": ["sim-base"], "synthetic": True}
    )
    with pytest.warns(PolicyProvenanceWarning) as got:
        agent = ConformalAgent(load_policy(other), cfg)
    notes = [str(w.message) for w in got if w.category is PolicyProvenanceWarning]
    assert notes == agent.provenance_warnings and len(notes) == 2
    assert "base model(s) sim-base, used with base-m" in notes[0] and "SYNTHETIC" in notes[1]
    with warnings.catch_warnings():
        warnings.simplefilter("error", PolicyProvenanceWarning)
        with pytest.raises(PolicyProvenanceWarning, match=f"policy {other}: "):
            ConformalAgent.from_artifact(other, cfg)
        ok = _with_provenance(policy_dir, tmp_path / "ok", **same, synthetic=False)
        assert ConformalAgent.from_artifact(ok, cfg).provenance_warnings == []


def test_a_bad_keyword_argument_is_blamed_on_the_argument(world, policy_dir, prices_path, tmp_path):
    """A bad value passed to from_artifact is named as the argument, not the YAML file."""
    import yaml

    cfg = tmp_path / "d.yaml"
    cfg.write_text(yaml.safe_dump(deploy_values(world, prices_path)))
    with pytest.raises(CCPOError, match=r"^argument kappa: .*less than or equal to 1") as e:
        ConformalAgent.from_artifact(policy_dir, cfg, kappa=2.0)
    assert "d.yaml" not in str(e.value)


def test_a_question_cut_off_in_a_round_sent_ahead_leaves_nothing_behind(
    world, policy_dir, prices_path
):
    """κ = 0: every round goes on, and round t + 1's first call is sent before round t's log
    is written. Cut off (as the server's shutdown does) while round 2's base call is in
    flight: no task is left running, the call is counted at its worst case, and nothing stays
    reserved."""
    values = deploy_values(world, prices_path, kappa=0.0, max_cost_total=1.0)

    async def main():
        ag = ConformalAgent.from_artifact(policy_dir, values)
        first = await ag.aanswer(MMLU_Q + " (first)")  # it runs alone and prices a question
        client = ag._runner().client
        world.latency = 0.5
        n0 = world.n_requests
        task = asyncio.ensure_future(ag.aanswer(MMLU_Q))
        while world.n_requests < n0 + 3:  # round 1's two calls, then round 2's base call
            await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        out = (first.cost_usd, ag.spent_usd, client.ledger.reserved, left)
        world.latency = 0.0
        await ag.aclose()
        return out

    first_cost, spent, reserved, left = asyncio.run(main())
    assert left == []
    assert reserved == 0.0
    assert spent > first_cost  # round 1 and the cut-off call (at its worst case) are counted
