"""The policy artifact (learning/policy.py): what loading and using one imports."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from ccpo.errors import CCPOError
from ccpo.learning.config import TrainConfig
from ccpo.learning.nets import NEXT, policy_net
from ccpo.learning.training import train
from ccpo.policies.rl import TrainedPolicy, horizon_from_obs_mean


def _modules_after(code: str) -> set[str]:
    """The names in sys.modules after running ``code`` in a fresh interpreter."""
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys\nprint('\\n'.join(sys.modules))"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return set(out.stdout.split())


def test_the_artifact_does_not_import_the_trainer():
    """ccpo.policies reads a folder with the config class and the numpy heads, not the
    training loop (arrows point inward: the trainer imports the policies' pieces)."""
    mods = _modules_after("import ccpo.policies")
    assert "ccpo.policies.rl" in mods and "ccpo.policies.registry" in mods
    assert "ccpo.learning.trainers" not in mods
    assert "ccpo.learning.training" not in mods


def _random_policy(seed: int, obs_dim: int = 6, hidden: int = 16, layers: int = 3):
    """A TrainedPolicy whose network has every parameter drawn N(0, 1) (not the near-uniform
    init), with a non-trivial observation normalisation."""
    rng = np.random.default_rng(seed)
    net = policy_net(obs_dim, rng, hidden=hidden, layers=layers)
    net.theta[:] = rng.normal(size=net.size)
    return TrainedPolicy(
        net,
        "ccpo",
        rng.normal(size=obs_dim),
        rng.uniform(0.5, 2.0, size=obs_dim),
        TrainConfig(hidden=hidden, layers=layers),
        kappa_online=0.2,
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_saved_policy_reads_back_exactly_and_scores_as_its_network(tmp_path, seed):
    """The folder holds weights.npz (float64), read back bit for bit; π of the loaded policy
    is the masked softmax of the network written out layer by layer (tanh, linear head) on
    the normalised observations, to rtol 1e-12 (only the summation order may differ)."""
    pol = _random_policy(seed)
    folder = pol.save(tmp_path / "pol")
    assert (folder / "weights.npz").is_file() and not (folder / "weights.pt").exists()
    back = TrainedPolicy.load(folder)
    np.testing.assert_array_equal(back.net.theta, pol.net.theta)
    obs = np.random.default_rng(10 + seed).normal(size=(5, 4, 6)) * 3
    h = (obs - pol.obs_mean) / pol.obs_std
    for w, b, act in pol.net.layers:
        h = h @ w + b
        h = np.tanh(h) if act == "tanh" else h
    allowed = np.ones((4, 3), dtype=bool)
    allowed[-1, NEXT] = False
    e = np.where(allowed, np.exp(h - h.max(-1, keepdims=True)), 0.0)
    got = back.probs(obs)
    np.testing.assert_allclose(got, e / e.sum(-1, keepdims=True), rtol=1e-12, atol=1e-14)
    np.testing.assert_array_equal(got, pol.probs(obs))
    assert np.all(got[:, -1, NEXT] == 0.0)
    assert np.ptp(got) > 0.5  # the random weights give far-from-uniform π: a real comparison


def test_a_broken_or_mismatched_weights_file_is_one_clear_error(tmp_path):
    pol = _random_policy(0)
    folder = pol.save(tmp_path / "pol")
    (folder / "weights.npz").write_bytes(b"garbage")
    with pytest.raises(CCPOError, match=r"weights\.npz: cannot load the network"):
        TrainedPolicy.load(folder)
    wider = _random_policy(0, hidden=8)
    wider.save(tmp_path / "wider")
    (folder / "weights.npz").write_bytes((tmp_path / "wider" / "weights.npz").read_bytes())
    with pytest.raises(CCPOError, match="3 hidden layers of 16"):
        TrainedPolicy.load(folder)
    (folder / "weights.npz").unlink()
    with pytest.raises(CCPOError, match=r"weights\.npz: cannot load the network"):
        TrainedPolicy.load(folder)


def test_the_artifact_stores_its_horizon_and_reads_old_folders_without_it(tmp_path, sim_episodes):
    """T is written to policy.json and read back; a folder saved before T was stored gets it
    from its recorded provenance, else from the observation normalisation (1/T)."""
    T = sim_episodes.horizon
    res = train(sim_episodes, np.arange(100), TrainConfig(steps=2, val_every=0))
    pol = TrainedPolicy.from_result(res, "ccpo")
    assert pol.horizon == T  # from the run's normalisation, where it is exact
    assert TrainedPolicy.from_result(res, "ccpo", horizon=T + 3).horizon == T + 3
    folder = pol.save(tmp_path / "pol")
    meta = json.loads((folder / "policy.json").read_text())
    assert meta["horizon"] == T and TrainedPolicy.load(folder).horizon == T
    del meta["horizon"]  # an older folder
    meta["provenance"] = {"horizon": T + 1}
    (folder / "policy.json").write_text(json.dumps(meta))
    assert TrainedPolicy.load(folder).horizon == T + 1
    meta["provenance"] = {}
    (folder / "policy.json").write_text(json.dumps(meta))
    assert TrainedPolicy.load(folder).horizon == T
    assert horizon_from_obs_mean(np.full(res.obs_mean.shape, 0.3)) is None
