"""Policy folders saved by ccpo 0.1 (before the policy interface) load unchanged and answer
exactly as they did: the same answer sets, rounds and cost by replay, and the same live
decisions round by round.

``tests/data/policies-0.1`` was written by the code of commit 78b5045 (one folder per
technique: CCPO, CPO greedy and online, CStop, depth-k, agree-k, and the single-answer cstop
and depth-k), with ``expected.json`` holding what that code answered on the last 60 questions
of the bundled hotpotqa-public traces.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import sklearn

from ccpo.api import ConformalPolicy
from ccpo.policies import Policy, load_policy
from ccpo.runtime.decision import decide
from ccpo.traces.io import read_traces

HERE = Path(__file__).resolve().parents[1] / "data" / "policies-0.1"
EXPECTED = json.loads((HERE / "expected.json").read_text())
TRACES = Path(__file__).resolve().parents[2] / "src/ccpo/data/traces" / EXPECTED["traces"]
CLASSES = {
    "ccpo": "RLPolicy",
    "cpo": "RLPolicy",
    "cpo-online": "RLPolicy",
    "cstop": "StoppingPolicy",
    "depth-k": "RulePolicy",
    "agree-k": "RulePolicy",
    "cstop-single": "SingleAnswerPolicy",
    "depth-k-single": "SingleAnswerPolicy",
}


def _folder(name: str) -> Path:
    folder = HERE / name
    made = json.loads((folder / "policy.json").read_text()).get("sklearn_version")
    if name.startswith("cstop") and made != sklearn.__version__:
        pytest.skip(
            f"{name} pickles a scikit-learn {made} classifier; this is {sklearn.__version__}"
        )
    return folder


@pytest.fixture(scope="module")
def questions():
    lo, hi = EXPECTED["test"]
    return read_traces(TRACES)[lo:hi]


def test_every_technique_has_an_old_folder():
    assert set(EXPECTED["policies"]) == set(CLASSES)


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_an_old_folder_loads_as_its_technique(name):
    pol = load_policy(_folder(name))
    assert isinstance(pol, Policy)
    assert type(pol).__name__ == CLASSES[name]
    assert pol.is_calibrated
    assert (pol.answer == "single") == name.endswith("-single")


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_an_old_folder_replays_the_same_answers(name, questions):
    want = EXPECTED["policies"][name].get("predict_set")
    if want is None:
        pytest.skip(f"{name} has no calibrated κ̂ (greedy or online): not a predict_set policy")
    got = ConformalPolicy.load(_folder(name)).predict_set(questions)
    assert [[s.answers, s.rounds, s.cost_usd, s.covered] for s in got] == want


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_an_old_folder_decides_live_rounds_the_same(name, questions):
    pol = load_policy(_folder(name))
    horizon = pol.trained_horizon()
    assert horizon is not None
    got = []
    for tr in questions[:20]:
        for t in range(1, len(tr.rounds) + 1):
            d = decide(pol, tr.task, horizon, tr.rounds[:t], pol.threshold, tr.family)
            got.append([d.probs.tolist(), list(d.actions), d.fallback, d.go_on])
    want = EXPECTED["policies"][name]["decisions"]
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g[1:] == w[1:]
        # π goes through matrix products: BLAS kernels and CPUs sum in different orders, so
        # the last bit may differ from the machine that wrote expected.json (seen: one ulp,
        # 0.41386771685997586 vs 0.4138677168599759); the actions above are exact
        np.testing.assert_allclose(g[0], w[0], rtol=1e-12, atol=0)
