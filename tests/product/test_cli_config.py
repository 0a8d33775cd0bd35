"""The config is the CLI: every field of the typed configs is an option of `ccpo train`, with
the help written beside the field, and its value reaches the config (SYNTHETIC data)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

from ccpo.cli import main
from ccpo.cli.config import config_help
from ccpo.learning.config import StopConfig, TrainConfig


def test_every_config_field_declares_its_help():
    helps = config_help(TrainConfig)
    assert set(helps) == {f.name for f in dataclasses.fields(TrainConfig)}
    assert helps["steps"].startswith("training steps")
    assert helps["lam"].startswith("λ, the price of one answer")  # comment lines above a field
    assert config_help(StopConfig)["max_leaf_nodes"] == "leaves per tree (hgb)"


def test_every_config_field_is_a_train_option():
    r = subprocess.run(
        [sys.executable, "-m", "ccpo", "train", "--help"],
        capture_output=True, text=True, timeout=60, env={"COLUMNS": "200", "PATH": ""},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    own = {"method", "alpha", "seed", "learner", "eta0", "xi", "batch_size"}
    for cls in (TrainConfig, StopConfig):
        for f in dataclasses.fields(cls):
            if cls is StopConfig and f.name in own:
                continue
            assert "--" + f.name.replace("_", "-") in r.stdout, f.name


def test_derived_options_reach_the_saved_config(sim_file, tmp_path):
    out = tmp_path / "ccpo"
    argv = ["train", "--traces", str(sim_file), "--method", "ccpo", "--steps", "3"]
    assert main([*argv, "--hidden", "16", "--rollouts", "sampled", "--out", str(out)]) == 0
    cfg = json.loads((out / "policy.json").read_text())["config"]
    assert (cfg["hidden"], cfg["rollouts"], cfg["steps"]) == (16, "sampled", 3)
    out2 = tmp_path / "cstop"
    argv = ["train", "--traces", str(sim_file), "--method", "cstop", "--max-iter", "7"]
    assert main([*argv, "--out", str(out2)]) == 0
    assert json.loads((out2 / "policy.json").read_text())["config"]["max_iter"] == 7


def test_a_value_the_config_refuses_names_the_option(sim_file, tmp_path, capsys):
    argv = ["train", "--traces", str(sim_file), "--out", str(tmp_path / "x")]
    assert main([*argv, "--delta", "0", "--exact-batch-size", "0"]) == 2
    err = capsys.readouterr().err
    assert "--exact-batch-size" in err and "Traceback" not in err


def _help(*command: str) -> str:
    r = subprocess.run(
        [sys.executable, "-m", "ccpo", *command, "--help"],
        capture_output=True, text=True, timeout=60, env={"COLUMNS": "250", "PATH": ""},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    return " ".join(r.stdout.split())


def test_collect_and_deploy_options_come_from_their_settings_models():
    from ccpo.llm.config import CollectConfig
    from ccpo.runtime.config import DeployConfig, ServerConfig
    from ccpo.traces.sim import SimConfig

    cases = [
        (("collect",), CollectConfig, ("base_model", "concurrency", "max_cost", "no_cache"), {}),
        (("collect-exit",), CollectConfig, ("base_url", "stop_at_exit"), {"base_url": "--url"}),
        (("ask",), DeployConfig, ("guide_key_env", "max_cost_per_request"),
         {"max_cost_per_request": "--max-cost"}),
        (("serve",), DeployConfig, ("base_model", "max_cost_total"), {}),
        (("serve",), ServerConfig, ("port", "kappa_band", "rate_limit_per_minute"),
         {"rate_limit_per_minute": "--rate-limit"}),
        (("sim",), None, ("n", "verdict_noise"), {}),
    ]  # fmt: skip
    for command, model, fields, flags in cases:
        text = _help(*command)
        for name in fields:
            flag = flags.get(name, "--" + name.replace("_", "-"))
            description = (
                config_help(SimConfig)[name]
                if model is None
                else model.model_fields[name].description
            )
            assert f"{flag} " in text and description in text, (command, name)
