"""Policy provenance (task, trace sha256, models, T, α) recorded by `ccpo train` and checked by
`evaluate`, `ask`; `train --out` never replaces a policy silently; degenerate policies flagged.
All through the console-script function ``main``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from ccpo.cli import main
from ccpo.evaluation.harness import file_sha256, full_set_rate
from ccpo.traces.io import write_traces
from ccpo.traces.sim import SimConfig, generate
from tests.helpers.serve import deploy_values, write_prices
from tests.helpers.world import make_world

Q = "Which is a prime number?\nA. 4\nB. 6\nC. 7\nD. 9"


@pytest.fixture(scope="module")
def trained(tmp_path_factory, sim_file):
    out = tmp_path_factory.mktemp("prov") / "pol"
    argv = ["train", "--traces", str(sim_file), "--method", "ccpo", "--steps", "5"]
    assert main([*argv, "--out", str(out)]) == 0
    return out


def _err_of(capsys, argv, code):
    got = main(argv)
    err = capsys.readouterr().err
    assert got == code, err
    assert "Traceback" not in err
    return " ".join(err.split())


def test_train_records_provenance(trained, sim_file):
    prov = json.loads((trained / "policy.json").read_text())["provenance"]
    assert prov["task"] == "sim-qa" and prov["horizon"] == 4 and prov["alpha"] == 0.1
    assert prov["traces"] == sim_file.name and prov["traces_sha256"] == file_sha256(sim_file)
    assert prov["base_models"] == ["sim-base"] and prov["guide_models"] == ["sim-guide"]
    assert prov["synthetic"] is True and prov["questions"] == 300


def test_auto_records_provenance_too(sim_file, tmp_path):
    """The default method (auto: a stopping policy) records the same provenance."""
    argv = ["train", "--traces", str(sim_file), "--auto-ccpo-steps", "10"]
    assert main([*argv, "--out", str(tmp_path / "a")]) == 0
    meta = json.loads((tmp_path / "a" / "policy.json").read_text())
    assert meta["method"] != "ccpo"
    assert meta["provenance"]["traces_sha256"] == file_sha256(sim_file)
    assert meta["provenance"]["task"] == "sim-qa" and meta["provenance"]["horizon"] == 4


def test_train_refuses_to_replace_a_policy(trained, sim_file, capsys, tmp_path):
    argv = ["train", "--traces", str(sim_file), "--steps", "2", "--auto-ccpo-steps", "10",
            "--out", str(trained)]  # fmt: skip
    before = {f.name: f.read_bytes() for f in trained.iterdir()}
    err = _err_of(capsys, argv, 2)
    assert "already holds policy.json" in err and "--force" in err
    assert {f.name: f.read_bytes() for f in trained.iterdir()} == before
    afile = tmp_path / "a-file"
    afile.write_text("keep me")
    err = _err_of(capsys, [*argv[:-1], str(afile)], 2)
    assert "is a file, not a folder" in err and afile.read_text() == "keep me"
    copy = tmp_path / "copy"
    assert main([*argv[:-1], str(copy)]) == 0
    assert main([*argv[:-1], str(copy), "--force"]) == 0


def _variant(tmp_path, name: str, **kw) -> str:
    path = tmp_path / name
    write_traces(path, generate(SimConfig(n=300, **kw)))
    return str(path)


def test_evaluate_checks_provenance(trained, capsys, tmp_path, sim_file):
    ev = ["evaluate", "--policy", str(trained), "--splits", "2", "--out", str(tmp_path / "o")]
    assert "warning" not in _err_of(capsys, [*ev, "--traces", str(sim_file)], 0)
    other_t = _variant(tmp_path, "t3.jsonl", rounds=3, seed=7)
    err = _err_of(capsys, [*ev, "--traces", other_t], 2)
    assert "horizon = 4" in err and "horizon = 3" in err
    other_task = tmp_path / "task.jsonl"
    other_task.write_text(
        Path(_variant(tmp_path, "x.jsonl", seed=7)).read_text().replace('"sim-qa"', '"mmlu"')
    )
    err = _err_of(capsys, [*ev, "--traces", str(other_task)], 2)
    assert "task = 'sim-qa'" in err and "task = 'mmlu'" in err
    other_file = _variant(tmp_path, "seed1.jsonl", seed=1)
    err = _err_of(capsys, [*ev, "--traces", other_file, "--alpha", "0.2"], 0)
    assert "warning:" in err and "sha256" in err
    assert "trained for α = 0.1, re-calibrated and scored at α = 0.2" in err


def test_deploy_checks_provenance(trained, capsys, tmp_path):
    prices = write_prices(tmp_path / "p.json")
    with make_world() as world:
        cfg = tmp_path / "d.yaml"
        cfg.write_text(yaml.safe_dump(deploy_values(world, prices)))
        ask = ["ask", Q, "--policy", str(trained), "--config", str(cfg), "--json"]
        err = _err_of(capsys, ask, 2)  # a synthetic sim-qa policy against MMLU endpoints
        assert "task = 'sim-qa'" in err and "task = 'mmlu'" in err
        meta = json.loads((trained / "policy.json").read_text())
        mmlu = tmp_path / "mmlu-pol"
        mmlu.mkdir()
        for f in trained.iterdir():
            (mmlu / f.name).write_bytes(f.read_bytes())
        meta["provenance"]["task"] = "mmlu"
        (mmlu / "policy.json").write_text(json.dumps(meta))
        err = _err_of(capsys, [*ask[:3], str(mmlu), *ask[4:]], 0)
    assert "base model(s) sim-base, used with base-m" in err
    assert "SYNTHETIC" in err


def test_full_set_rate():
    """1.0 when κ = 0 (every action is in C(o) everywhere), 0.0 when κ is above every π."""
    from ccpo.traces.episodes import build_episodes
    from ccpo.traces.prices import load_prices

    ep = build_episodes(generate(SimConfig(n=40, seed=3)), load_prices())
    rng = np.random.default_rng(0)
    p = rng.dirichlet([1, 1, 1], size=(ep.n, ep.horizon))
    p[:, -1, 2] = 0
    p[:, -1] /= p[:, -1].sum(-1, keepdims=True)
    assert full_set_rate(ep, p, 0.0) == 1.0
    assert full_set_rate(ep, p, 1.01) == 0.0
    assert 0.0 < full_set_rate(ep, p, 0.05) < 1.0


def test_train_flags_degenerate_policy(sim_file, tmp_path, capsys):
    """α = 0.01 with 42 calibration questions: ⌊α(n+1)⌋ = 0, so κ̂ = 0 by definition and C(o)
    holds every action at every round; train must say so."""
    argv = ["train", "--traces", str(sim_file), "--method", "ccpo", "--steps", "5"]
    argv += ["--alpha", "0.01"]
    assert main([*argv, "--out", str(tmp_path / "d")]) == 0
    cap = capsys.readouterr()
    summary = json.loads((tmp_path / "d" / "summary.json").read_text())
    assert summary["kappa"] == 0.0 and summary["calibration_full_set_rate"] == 1.0
    assert "degenerate policy: on 100% of the calibration questions" in " ".join(cap.err.split())
    assert "κ = 0 (online" in cap.out


def test_small_kappa_is_not_printed_as_zero(sim_file, tmp_path, capsys):
    from ccpo.policies.rl import TrainedPolicy

    argv = ["train", "--traces", str(sim_file), "--method", "ccpo", "--steps", "5"]
    argv += ["--out", str(tmp_path / "k")]
    assert main(argv) == 0
    out = " ".join(capsys.readouterr().out.split())
    kappa = TrainedPolicy.load(tmp_path / "k").kappa
    assert f"κ = {kappa:.4g}" in out
