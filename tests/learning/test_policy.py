"""The policy artifact (learning/policy.py): what loading and using one imports."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from ccpo.errors import CCPOError
from ccpo.learning.config import TrainConfig
from ccpo.learning.mlp import NumpyMLP
from ccpo.learning.nets import NEXT, PolicyNet, masked_probs
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
    """A PolicyNet with every parameter drawn N(0, 1) (not the near-uniform init) and a
    TrainedPolicy holding its numpy copy, with a non-trivial observation normalisation."""
    torch.manual_seed(seed)
    net = PolicyNet(obs_dim, hidden=hidden, layers=layers)
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randn_like(p))
    rng = np.random.default_rng(seed)
    pol = TrainedPolicy(
        NumpyMLP(net.body),
        "ccpo",
        rng.normal(size=obs_dim),
        rng.uniform(0.5, 2.0, size=obs_dim),
        TrainConfig(hidden=hidden, layers=layers),
        kappa_online=0.2,
    )
    return net, pol


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_numpy_inference_equals_the_torch_network(tmp_path, seed):
    """The policy read back from weights.pt (written by torch.save of the network's
    state_dict, as every ccpo writes it) scores observations exactly as the torch network:
    logits and masked π equal torch's float64 forward of the same float32 weights to
    rtol 1e-12 / atol 1e-14 (only the summation order differs)."""
    net, pol = _random_policy(seed)
    folder = pol.save(tmp_path / "pol")
    torch.save(net.state_dict(), folder / "weights.pt")  # the torch writer itself
    back = TrainedPolicy.load(folder)
    obs = np.random.default_rng(10 + seed).normal(size=(5, 4, 6)) * 3
    x = (obs - pol.obs_mean) / pol.obs_std
    with torch.no_grad():
        logits = net.double()(torch.as_tensor(x))
        allowed = torch.ones(4, 3, dtype=torch.bool)
        allowed[-1, NEXT] = False
        want = masked_probs(logits, allowed).numpy()
    np.testing.assert_allclose(back.net(x), logits.numpy(), rtol=1e-12, atol=1e-14)
    got = back.probs(obs)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)
    assert np.all(got[:, -1, NEXT] == 0.0)
    assert np.ptp(got) > 0.5  # the random weights give far-from-uniform π: a real comparison


def test_a_broken_or_mismatched_weights_file_is_one_clear_error(tmp_path):
    _, pol = _random_policy(0)
    folder = pol.save(tmp_path / "pol")
    (folder / "weights.pt").write_bytes(b"garbage")
    with pytest.raises(CCPOError, match=r"weights\.pt: cannot load the network"):
        TrainedPolicy.load(folder)
    _, wider = _random_policy(0, hidden=8)
    wider.save(tmp_path / "wider")
    (folder / "weights.pt").write_bytes((tmp_path / "wider" / "weights.pt").read_bytes())
    with pytest.raises(CCPOError, match="3 hidden layers of 16"):
        TrainedPolicy.load(folder)
    (folder / "weights.pt").unlink()
    with pytest.raises(CCPOError, match=r"weights\.pt: cannot load the network"):
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
