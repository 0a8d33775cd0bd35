"""ccpo without torch: training CCPO and CPO, loading a policy artifact and scoring an
observation never import it (weights are drawn, trained and read as numpy arrays); ``ccpo
serve`` runs in the slim install (``pip install 'ccpo[serve]'``: no matplotlib or
OpenTelemetry), its feedback path never imports scipy (an import on the event loop stalls
every request), and a command that needs the train extra says which pip install brings it.
No extra of ccpo requires torch (tests/test_dependencies.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import numpy as np
import pytest

from ccpo.policies.registry import load_policy
from ccpo.testing import free_port
from ccpo.traces.featurize import FEATURE_NAMES
from tests.helpers.cli import without

SCRIPT = """
import json, sys
import ccpo.runtime
import numpy as np
from ccpo.policies.registry import load_policy
pol = load_policy(sys.argv[1])
obs = np.asarray(json.loads(sys.argv[2]))
print(json.dumps({"scores": pol.probs(obs).tolist(), "torch": "torch" in sys.modules}))
"""


def test_runtime_loads_and_scores_a_policy_without_torch(any_policy_dir):
    """Both artifact kinds (CCPO network, CStop classifier), in a fresh interpreter: the
    scores of one question's observations [T = 4, F] are those this process computes, and
    torch was never imported there."""
    obs = np.random.default_rng(0).normal(size=(1, 4, len(FEATURE_NAMES)))
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(any_policy_dir), json.dumps(obs.tolist())],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["torch"] is False
    np.testing.assert_array_equal(res["scores"], load_policy(any_policy_dir).probs(obs))


# ----------------------------------------------------------------------------- the slim install
#: what `pip install 'ccpo[serve]'` leaves out: the train extra (matplotlib; torch is in no
#: extra, and blocked here so that nothing can fall back on one installed) and the otel
#: extra (OpenTelemetry's SDK and exporter, imported only when OTEL_EXPORTER_OTLP_ENDPOINT is
#: set; its API comes with recent FastAPI)
NOT_IN_SERVE = ("torch", "matplotlib", "opentelemetry.sdk", "opentelemetry.exporter")


def test_serve_answers_without_the_train_and_otel_extras(
    world, any_policy_dir, prices_path, tmp_path
):
    """``ccpo serve`` (the real entry point) where torch, matplotlib and OpenTelemetry cannot be
    imported, as in the slim install: both kinds of policy load and answer over HTTP, so
    serving never imports any of them."""
    from tests.helpers.cli import start_serve, write_deploy_config
    from tests.helpers.serve import Q

    env = without(tmp_path, *NOT_IN_SERVE)
    cfg = write_deploy_config(tmp_path, world, prices_path)
    state = str(tmp_path / "state.sqlite")
    proc, url = start_serve(any_policy_dir, cfg, free_port(), "--state", state, env=env)
    try:
        r = httpx.post(url + "/v1/answer", json={"question": Q}, timeout=30)
        chat = httpx.post(
            url + "/v1/chat/completions",
            json={"model": "ccpo", "messages": [{"role": "user", "content": Q}]},
            timeout=30,
        )
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=20)
    assert r.status_code == 200, r.text
    assert r.json()["answers"] and r.json()["cost_usd"] > 0
    assert chat.status_code == 200, chat.text
    assert "Traceback" not in err and "ModuleNotFoundError" not in err


def _cli(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ccpo", *args],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.mark.parametrize(
    "args",
    [
        ["train", "--method", "ccpo"],
        ["train", "--method", "cpo"],
        ["train", "--method", "ccpo-lam0.5"],
        ["compare"],
        ["evaluate"],
        ["reproduce", "--quick"],
    ],
)
def test_a_command_that_needs_the_train_extra_names_it(sim_file, tmp_path, args):
    """Without the train extra (matplotlib: the curves and plots), training CCPO / CPO,
    compare, evaluate and reproduce stop before any work with one line naming what is missing
    and the pip install that brings it (exit 2)."""
    missing = "matplotlib"
    out = tmp_path / "out"
    io = (
        ["--out", str(out)]
        if args[0] == "reproduce"
        else ["--traces", str(sim_file), "--out", str(out)]
    )
    r = _cli(without(tmp_path, missing), *args, *io)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr
    assert f"needs {missing}, which is not installed: pip install 'ccpo[train]'" in lines[0]
    assert f"ccpo {args[0]}" in lines[0]
    assert not out.exists()


@pytest.mark.parametrize(
    "method, steps",
    [("ccpo", "20"), ("cpo", "20")],  # exact rollouts; sampled ones with the V-trace critics
)
def test_ccpo_and_cpo_train_where_torch_cannot_be_imported(sim_file, tmp_path, method, steps):
    """``ccpo train`` of the network methods in an interpreter where any ``import torch``
    fails (a finder first on sys.meta_path refuses it, whether installed or not): the folder
    holds weights.npz, and the policy read here scores as the process that trained it
    reported (κ̂ in summary.json)."""
    out = tmp_path / "pol"
    args = ["train", "--traces", str(sim_file), "--out", str(out), "--method", method]
    r = _cli(without(tmp_path, "torch"), *args, "--steps", steps)
    assert r.returncode == 0, r.stderr
    assert "torch" not in r.stderr
    assert (out / "weights.npz").is_file() and not (out / "weights.pt").exists()
    pol = load_policy(out)
    assert pol.net.size > 1000 and np.ptp(pol.net.theta) > 0  # a real network, trained
    obs = np.random.default_rng(2).normal(size=(3, 4, len(FEATURE_NAMES)))
    p = pol.probs(obs)
    assert p.shape == (3, 4, 3) and np.allclose(p.sum(-1), 1.0)
    summary = json.loads((out / "summary.json").read_text())
    # κ̂ as calibrated in the training process (CPO's default variant is greedy: none)
    assert summary["kappa"] == (pytest.approx(pol.threshold, rel=1e-12) if pol.calibrates else None)


@pytest.mark.parametrize("method", ["cstop"])
def test_score_methods_train_without_the_train_extra(sim_file, tmp_path, method):
    """CStop (and auto, which chooses among the score methods) fits and calibrates in the slim
    install: the policy folder is written, and it scores as the same folder read here."""
    out = tmp_path / "pol"
    args = ["train", "--traces", str(sim_file), "--out", str(out), "--method", method]
    r = _cli(without(tmp_path, *NOT_IN_SERVE), *args)
    assert r.returncode == 0, r.stderr
    meta = json.loads((out / "policy.json").read_text())
    assert meta["method"] in ("cstop", "cstop-lr", "depth-k") and meta["kappa_batch"] is not None
    obs = np.random.default_rng(1).normal(size=(2, 4, len(FEATURE_NAMES)))
    assert load_policy(out).probs(obs).shape == (2, 4, 3)


def test_the_drift_check_on_feedback_never_imports_scipy(world, policy_dir, prices_path, tmp_path):
    """The coverage drift check runs on the event loop from the 50th feedback on; it took
    scipy's import (seconds on a busy machine), and every question and feedback in flight
    waited past the state deadline: 503 ``state_unavailable`` with no fault at all. ``ccpo
    serve`` where scipy cannot be imported answers 60 questions and their 60 misses, and
    reports the shortfall."""
    from tests.helpers.cli import start_serve, stop_server, write_deploy_config
    from tests.helpers.serve import Q

    env = without(tmp_path, "scipy", *NOT_IN_SERVE)
    cfg = write_deploy_config(tmp_path, world, prices_path)
    proc, url = start_serve(policy_dir, cfg, free_port(), "--feedback-per-minute", "1e9",
                            "--feedback-burst", "1000", env=env)  # fmt: skip
    try:
        with httpx.Client(base_url=url, timeout=30) as http:
            for i in range(60):
                assert http.post("/v1/answer", json={"question": Q, "id": f"q{i}"}).is_success
                r = http.post("/v1/feedback", json={"id": f"q{i}", "none_of_them": True})
                assert r.status_code == 200, (i, r.text)
            m = http.get("/metrics.json").json()
    finally:
        err = stop_server(proc)
    assert m["feedback"] == 60 and m["coverage_short"] is True
    assert "ModuleNotFoundError" not in err
