"""Live equals replay, on a ladder: a 4-model table imported as traces, policies trained on it
(``auto`` and ``ccpo``), served by ``ccpo serve`` against ``ccpo replay-server`` on the same file,
asked through the ``openai`` SDK and ``POST /v1/answer``. Every answer set, round count, model
sequence and cost must equal the policy's replay on the same questions; the same for a policy
trained on a bundled set. The servers run through the real entry points as subprocesses over
real HTTP on 127.0.0.1; the one-shot commands through the console script's function in this
process (``tests.helpers.cli.ccpo_ok``), and those whose exit code is checked as subprocesses."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from ccpo.api import ConformalPolicy
from ccpo.evaluation.reproduce import bundled_sets
from ccpo.testing import free_port
from ccpo.testing.ladder_table import write_ladder_table
from ccpo.traces.io import read_traces
from tests.helpers.cli import ccpo_ok, start_server, stop_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def imported(tmp_path_factory) -> dict[str, Path]:
    """The 4-model table imported as traces, and auto and ccpo trained on it."""
    d = tmp_path_factory.mktemp("ladder")
    table, prices = write_ladder_table(d, n=280, seed=0)
    traces = d / "medqa.jsonl"
    ccpo_ok("traces", "import", str(table), "--task", "medqa", "--family", "mcq",
         "--prices", str(prices), "--out", str(traces))  # fmt: skip
    out = {"traces": traces, "prices": prices}
    for method, extra in (("auto", ("--auto-ccpo-steps", "20")), ("ccpo", ("--steps", "100"))):
        out[method] = d / method
        ccpo_ok("train", "--traces", str(traces), "--method", method, "--alpha", "0.1",
             "--prices", str(prices), "--out", str(out[method]), *extra)  # fmt: skip
    return out


@pytest.fixture(scope="module")
def replay(imported) -> Iterator[str]:
    proc, url = start_server("replay-server", "--traces", str(imported["traces"]))
    yield url
    stop_server(proc)


def _paid_models(trace, rounds: int) -> list[list[str]]:
    """The models a replay pays for in the first ``rounds`` rounds of a trace: every step not
    stored as a repeat of an earlier call (read from the trace file, not from the agent)."""
    return [
        [s.model for s in (r.base, r.guide) if not getattr(s, "reused", False)]
        for r in trace.rounds[:rounds]
    ]


def _serve_and_compare(policy: Path, traces_file: Path, replay_url: str, tmp: Path,
                       n: int, prices: Path | None = None) -> dict[str, int]:  # fmt: skip
    """Serve ``policy`` against the replay endpoint and ask it ``n`` questions of the trace
    file (half through the openai SDK, half through POST /v1/answer); assert every served
    answer set equals the policy's replay. Returns how many questions ran 1, 2, ... rounds."""
    cfg = tmp / f"{policy.name}-deploy.yaml"
    values: dict = {"endpoints": {"*": {"url": replay_url + "/v1"}}}
    if prices is not None:
        values["prices"] = [str(prices)]
    cfg.write_text(yaml.safe_dump(values))  # a config of endpoints only: task, ladder: the policy's
    traces = read_traces(traces_file)
    step = max(1, len(traces) // n)
    chosen = traces[::step][:n]
    expected = {p.id: p for p in ConformalPolicy.load(policy).predict_set(chosen)}
    proc, url = start_server("serve", "--policy", str(policy), "--config", str(cfg))
    depth: dict[int, int] = {}
    try:
        sdk = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        for i, tr in enumerate(chosen):
            if i % 2 == 0:
                r = sdk.chat.completions.create(
                    model="ccpo",
                    messages=[{"role": "user", "content": tr.question}],
                    extra_body={"ccpo": {"id": tr.id}},
                )
                got = r.model_extra["ccpo"]
                assert r.choices[0].message.content == "\n".join(got["answers"])
            else:
                resp = httpx.post(url + "/v1/answer", json={"question": tr.question, "id": tr.id},
                                  timeout=60)  # fmt: skip
                assert resp.status_code == 200, resp.text
                got = resp.json()
            want = expected[tr.id]
            assert got["answers"] == want.answers, tr.id
            assert got["rounds"] == want.rounds, tr.id
            assert abs(got["cost_usd"] - want.cost_usd) < 1e-12, (tr.id, got["cost_usd"])
            assert [lg["models"] for lg in got["log"]] == _paid_models(tr, want.rounds), tr.id
            depth[want.rounds] = depth.get(want.rounds, 0) + 1
        health = httpx.get(replay_url + "/healthz").json()
        assert health["missing"] == 0  # every call found its recorded answer
    finally:
        stop_server(proc)
    return depth


@pytest.mark.parametrize("method", ["auto", "ccpo"])
def test_served_answers_equal_the_replay_on_an_imported_ladder(imported, replay, method,
                                                               tmp_path):  # fmt: skip
    prov = json.loads((imported[method] / "policy.json").read_text())["provenance"]
    ladder = prov["ladder"]
    assert [r["verdict"] for r in ladder["rounds"]] == ["agree"] * 4  # one model per step
    assert all(r["base"] == r["guide"] for r in ladder["rounds"])
    assert (ladder["task"], ladder["family"]) == ("medqa", "mcq")
    depth = _serve_and_compare(imported[method], imported["traces"], replay, tmp_path, 40)
    assert sum(depth.values()) == 40
    assert len(depth) >= 2, depth  # the policy stops at different rounds: a real ladder run
    # `ccpo ask` on the same policy and endpoints: the same answer set as its replay
    tr = read_traces(imported["traces"])[1]
    want = ConformalPolicy.load(imported[method]).predict_set([tr])[0]
    cfg = tmp_path / f"{imported[method].name}-deploy.yaml"
    got = json.loads(ccpo_ok("ask", tr.question, "--policy", str(imported[method]),
                          "--config", str(cfg), "--json").stdout)  # fmt: skip
    assert (got["answers"], got["rounds"]) == (want.answers, want.rounds)
    assert abs(got["cost_usd"] - want.cost_usd) < 1e-12


def test_the_replay_endpoint_refuses_what_it_has_not_recorded(imported, replay):
    sdk = openai.OpenAI(base_url=replay + "/v1", api_key="none", max_retries=0)
    with pytest.raises(openai.NotFoundError, match="this question is not in the recorded traces"):
        sdk.chat.completions.create(
            model="tiny-m", messages=[{"role": "user", "content": "Question: never asked?"}]
        )
    q = read_traces(imported["traces"])[0].question
    with pytest.raises(openai.NotFoundError, match="model 'gpt-4o' has no recorded answer"):
        sdk.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": q}])
    # without the round headers, a model's one recorded answer is found by the text alone
    r = sdk.chat.completions.create(model="big-m", messages=[{"role": "user", "content": q}])
    assert r.usage.prompt_tokens > 0 and r.choices[0].message.content.startswith("Answer: ")


def test_served_answers_equal_the_replay_on_a_bundled_ladder(tmp_path):
    data = bundled_sets()["mmlu-public"]
    policy = tmp_path / "mmlu-auto"
    ccpo_ok(
        "train",
        "--traces",
        str(data),
        "--alpha",
        "0.1",
        "--auto-ccpo-steps",
        "20",
        "--out",
        str(policy),
    )  # auto with every candidate; the pick need not be the best
    proc, url = start_server("replay-server", "--traces", str(data))
    try:
        depth = _serve_and_compare(policy, data, url, tmp_path, 30)
    finally:
        stop_server(proc)
    assert sum(depth.values()) == 30 and len(depth) >= 2, depth


def test_a_deployment_missing_a_model_or_another_task_is_refused_before_it_starts(
    imported, tmp_path
):
    """Every model of the policy's ladder needs an endpoint: one without is named before the
    server starts (exit 2); a config's task must agree with the policy's."""
    cfg = tmp_path / "partial.yaml"
    some = {m: {"url": "http://127.0.0.1:9/v1"} for m in ("tiny-m", "small-m", "big-m")}
    cfg.write_text(yaml.safe_dump({"endpoints": some}))
    args = [sys.executable, "-m", "ccpo", "serve", "--policy", str(imported["auto"]),
            "--config", str(cfg), "--port", str(free_port())]  # fmt: skip
    res = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr
    assert "model 'mid-m' has no endpoint" in res.stderr and "Traceback" not in res.stderr
    cfg.write_text(yaml.safe_dump({"task": "mmlu", "endpoints": {"*": {"url": "http://x/v1"}}}))
    res = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2
    assert "task = 'medqa'" in res.stderr and "task = 'mmlu'" in res.stderr


def test_dry_run_checks_a_policy_against_its_own_logs(imported, tmp_path):
    """`ccpo dry-run`: the policy answers the file's questions live against a replay
    endpoint of the file and every answer set is compared with its replay (exit 0: all
    equal). A deployment that differs from its traces is caught: here a policy folder whose
    recorded ladder was edited so that round 2's base is asked again instead of reused (exit 1,
    each difference listed)."""
    import re
    import shutil

    args = ["dry-run", "--policy", str(imported["ccpo"]), "--traces", str(imported["traces"]),
            "--prices", str(imported["prices"]), "--n", "60"]  # fmt: skip
    res = ccpo_ok(*args)
    assert "60/60 answer sets equal the policy's replay" in res.stdout
    live, replay = (float(x) for x in re.findall(r"\$([0-9.]+)", res.stdout))
    assert live == replay > 0
    # a κ from the deploy config is the replay's κ too: still equal
    cfg = tmp_path / "kappa.yaml"
    cfg.write_text(yaml.safe_dump({"kappa": 0.0}))  # κ = 0: every action, every round
    res = ccpo_ok(*args, "--config", str(cfg))
    assert "60/60" in res.stdout
    # break the deployment: round 2's base gets another prompt, so its guide (the same model
    # with the ladder's prompt) is no longer the same call: the model is asked twice
    broken = tmp_path / "broken"
    shutil.copytree(imported["ccpo"], broken)
    meta = json.loads((broken / "policy.json").read_text())
    meta["provenance"]["ladder"]["rounds"][1]["base"]["prompt"] = "another"
    (broken / "policy.json").write_text(json.dumps(meta))
    bad = subprocess.run(
        [sys.executable, "-m", "ccpo", "dry-run", "--policy", str(broken),
         *args[3:], "--config", str(cfg)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert bad.returncode == 1, bad.stderr
    assert "differs:" in bad.stderr and "models paid [['tiny-m'], ['small-m', 'small-m']" in (
        " ".join(bad.stderr.split())
    )
    n_equal = int(re.search(r"(\d+)/60 answer sets equal", bad.stdout).group(1))
    assert n_equal < 60


def test_a_collected_judge_ladder_answers_live_as_it_replays(tmp_path):
    """The paper's protocol as a ladder: traces collected by `ccpo collect` (one base/guide
    pair, judge verdicts, the base's context growing every round) record a judge ladder; a
    policy trained on them answers live against the replay endpoint exactly as it replays."""
    from ccpo.llm.collect import collect
    from ccpo.llm.config import build_config
    from ccpo.traces.ladder import ladder_of
    from ccpo.traces.prices import write_price_file
    from tests.helpers.world import make_world

    prices = tmp_path / "p.json"
    write_price_file(prices, {"base-m": (0.2, 0.8), "guide-m": (2.5, 10.0)}, "test")
    out = tmp_path / "judge.jsonl"
    with make_world() as w:
        cfg = build_config(None, dict(task="mmlu", n=240, rounds=3, base_model="base-m",
                                      base_url=w.url, guide_model="guide-m", guide_url=w.url,
                                      out=str(out), no_cache=True, prices=[str(prices)],
                                      concurrency=16))  # fmt: skip
        assert collect(cfg, progress=False).done == 240
    lad = ladder_of(read_traces(out))
    assert {(r.base.model, r.base.prompt, r.guide.prompt, r.verdict) for r in lad.rounds} == {
        ("base-m", "cot", "judge", "judge")
    }
    policy = tmp_path / "pol"
    ccpo_ok("train", "--traces", str(out), "--prices", str(prices), "--alpha", "0.1",
         "--auto-ccpo-steps", "20", "--out", str(policy))  # fmt: skip
    res = ccpo_ok("dry-run", "--policy", str(policy), "--traces", str(out), "--prices", str(prices))
    assert "240/240 answer sets equal the policy's replay" in res.stdout
