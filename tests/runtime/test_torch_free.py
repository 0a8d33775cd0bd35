"""The live agent decides without torch: importing ccpo.runtime, loading a policy artifact
and scoring an observation never import it (weights are read as numpy arrays)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np

from ccpo.learning.policy import load_policy
from ccpo.traces.featurize import FEATURE_NAMES

SCRIPT = """
import json, sys
import ccpo.runtime
import numpy as np
from ccpo.learning.policy import load_policy
pol = load_policy(sys.argv[1])
obs = np.asarray(json.loads(sys.argv[2]))
print(json.dumps({"scores": pol.probs(obs).tolist(), "torch": "torch" in sys.modules}))
"""


def test_runtime_loads_and_scores_a_policy_without_torch(any_policy_dir):
    """Both artifact kinds (CCPO network, CStop classifier), in a fresh interpreter: the
    scores of one question's observations [T = 4, F] are those this process (torch loaded)
    computes, and torch was never imported there."""
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
