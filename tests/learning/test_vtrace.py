"""Golden tests for ccpo.learning.vtrace (Espeholt et al. 2018, Eq. 1)."""

from __future__ import annotations

import numpy as np
import pytest

from ccpo.learning import vtrace as vtrace_module
from ccpo.learning.vtrace import vtrace_targets


def _assert_identical(actual: np.ndarray, desired: np.ndarray) -> None:
    """Bitwise-equal float64 arrays of the same shape, with no NaN (NaN never equals NaN)."""
    np.testing.assert_array_equal(actual, desired, strict=True)
    assert not np.isnan(actual).any()


def _literal_vtrace(
    values: np.ndarray,
    boot: np.ndarray,
    rewards: np.ndarray,
    discounts: np.ndarray,
    rhos: np.ndarray,
    lengths: np.ndarray,
    clip_rho: float | None,
    clip_c: float | None,
    clip_pg_rho: float | None,
) -> tuple[np.ndarray, np.ndarray]:
    """The O(T²) definition: v_s = V_s + Σ_{t≥s} (Π_{s≤i<t} γ_i c_i) δ_t V."""

    def clip(x: float, c: float | None) -> float:
        return x if c is None else min(c, x)

    vs = values.copy()
    adv = np.zeros_like(values)
    for b in range(values.shape[0]):
        n = int(lengths[b])
        v_ext = [*values[b, :n].tolist(), float(boot[b])]  # V(x_0..x_{L-1}), V(x_L)
        for s in range(n):
            total = v_ext[s]
            for t in range(s, n):
                coef = 1.0
                for i in range(s, t):
                    coef *= discounts[b, i] * clip(rhos[b, i], clip_c)
                delta = clip(rhos[b, t], clip_rho) * (
                    rewards[b, t] + discounts[b, t] * v_ext[t + 1] - v_ext[t]
                )
                total += coef * delta
            vs[b, s] = total
        for s in range(n):
            v_next = vs[b, s + 1] if s + 1 < n else boot[b]
            adv[b, s] = clip(rhos[b, s], clip_pg_rho) * (
                rewards[b, s] + discounts[b, s] * v_next - values[b, s]
            )
    return vs, adv


def _random_batch(seed: int, bsz: int = 7, horizon: int = 5) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, horizon + 1, size=bsz)
    lengths[0] = horizon  # at least one full-length episode
    mask = np.arange(horizon)[None, :] < lengths[:, None]
    gamma = 0.9
    discounts = np.full((bsz, horizon), gamma)
    # Half the episodes terminate (discount 0 at the last step), the others are truncated.
    terminal = rng.random(bsz) < 0.5
    for b in range(bsz):
        if terminal[b]:
            discounts[b, lengths[b] - 1] = 0.0
    data = {
        "values": rng.normal(size=(bsz, horizon)),
        "boot": rng.normal(size=bsz),
        "rewards": rng.normal(size=(bsz, horizon)),
        "discounts": discounts,
        "rhos": rng.exponential(size=(bsz, horizon)),  # ratios on both sides of 1
        "lengths": lengths,
        "mask": mask,
    }
    # Padded entries hold garbage; they must not leak into valid steps.
    for key in ("values", "rewards", "discounts", "rhos"):
        data[key] = np.where(mask, data[key], np.nan)
    return data


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize(
    ("clip_rho", "clip_c", "clip_pg_rho"), [(1.0, 1.0, 1.0), (None, None, None), (2.0, 0.5, 1.5)]
)
def test_matches_literal_definition(
    seed: int, clip_rho: float | None, clip_c: float | None, clip_pg_rho: float | None
) -> None:
    d = _random_batch(seed)
    vs, adv = vtrace_targets(
        d["values"],
        d["boot"],
        d["rewards"],
        d["discounts"],
        d["rhos"],
        clip_rho=clip_rho,
        clip_c=clip_c,
        mask=d["mask"],
        clip_pg_rho=clip_pg_rho,
    )
    want_vs, want_adv = _literal_vtrace(
        d["values"], d["boot"], d["rewards"], d["discounts"], d["rhos"], d["lengths"],
        clip_rho, clip_c, clip_pg_rho,
    )  # fmt: skip
    m = d["mask"]
    assert vs.dtype == np.float64 and adv.dtype == np.float64
    assert vs.shape == adv.shape == m.shape
    np.testing.assert_allclose(vs[m], want_vs[m], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(adv[m], want_adv[m], rtol=1e-12, atol=1e-12)
    # Padded steps: vs = values (NaN garbage here), advantages exactly 0.
    assert np.all(adv[~m] == 0.0)
    assert np.all(np.isnan(vs[~m]))
    # A 0/1 mask (any numeric dtype) means the same as the boolean one.
    vs01, adv01 = vtrace_targets(
        d["values"], d["boot"], d["rewards"], d["discounts"], d["rhos"],
        clip_rho=clip_rho, clip_c=clip_c, mask=m.astype(np.float32), clip_pg_rho=clip_pg_rho,
    )  # fmt: skip
    np.testing.assert_array_equal(vs01, vs, strict=True)
    np.testing.assert_array_equal(adv01, adv, strict=True)


def test_on_policy_equals_monte_carlo_return() -> None:
    rng = np.random.default_rng(10)
    bsz, horizon, gamma = 6, 4, 0.95
    lengths = np.array([4, 3, 1, 2, 4, 3])
    terminal = np.array([True, True, True, False, False, True])
    mask = np.arange(horizon)[None, :] < lengths[:, None]
    rewards = rng.normal(size=(bsz, horizon))
    values = rng.normal(size=(bsz, horizon))
    boot = rng.normal(size=bsz)
    discounts = np.full((bsz, horizon), gamma)
    for b in range(bsz):
        if terminal[b]:
            discounts[b, lengths[b] - 1] = 0.0
    vs, adv = vtrace_targets(values, boot, rewards, discounts, np.ones((bsz, horizon)), mask=mask)
    for b in range(bsz):
        n = lengths[b]
        for s in range(n):
            ret = sum(gamma ** (t - s) * rewards[b, t] for t in range(s, n))
            if not terminal[b]:
                ret += gamma ** (n - s) * boot[b]
            assert vs[b, s].item() == pytest.approx(ret, abs=1e-12)
            # On-policy advantage = r_s + γ v_{s+1} − V(x_s) = G_s − V(x_s).
            assert adv[b, s].item() == pytest.approx(ret - values[b, s], abs=1e-12)


def test_bootstrap_only_on_truncation() -> None:
    rng = np.random.default_rng(11)
    values, rewards = rng.normal(size=(2, 3)), rng.normal(size=(2, 3))
    rhos = rng.exponential(size=(2, 3))
    discounts = np.array([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])  # terminal, truncated
    a = vtrace_targets(values, np.array([0.0, 0.0]), rewards, discounts, rhos)
    b = vtrace_targets(values, np.array([123.0, 123.0]), rewards, discounts, rhos)
    _assert_identical(a.vs[0], b.vs[0])
    _assert_identical(a.pg_advantages[0], b.pg_advantages[0])
    assert not np.allclose(a.vs[1], b.vs[1])
    # A terminal episode ignores even a NaN or infinite bootstrap value.
    for bad in (np.nan, np.inf, -np.inf):
        c = vtrace_targets(values, np.array([bad, 0.0]), rewards, discounts, rhos)
        _assert_identical(c.vs[0], a.vs[0])
        _assert_identical(c.pg_advantages[0], a.pg_advantages[0])


def test_clipping_clips_large_ratios_only() -> None:
    rng = np.random.default_rng(12)
    values, rewards = rng.normal(size=(3, 4)), rng.normal(size=(3, 4))
    boot, discounts = rng.normal(size=3), np.full((3, 4), 0.9)
    big = np.full((3, 4), 5.0)
    one = np.ones((3, 4))
    clipped = vtrace_targets(values, boot, rewards, discounts, big, clip_rho=1.0, clip_c=1.0)
    on_policy = vtrace_targets(values, boot, rewards, discounts, one)
    np.testing.assert_allclose(
        clipped.vs, on_policy.vs, rtol=0, atol=1e-12, equal_nan=False, strict=True
    )
    np.testing.assert_allclose(
        clipped.pg_advantages, on_policy.pg_advantages, rtol=0, atol=1e-12, equal_nan=False,
        strict=True,
    )  # fmt: skip
    unclipped = vtrace_targets(values, boot, rewards, discounts, big, clip_rho=None, clip_c=None)
    assert not np.allclose(unclipped.vs, on_policy.vs)
    # ρ̄ = 1 clips large weights but not small ones.
    small = vtrace_targets(values, boot, rewards, discounts, np.full((3, 4), 0.3))
    assert not np.allclose(small.vs, on_policy.vs)
    # Each threshold acts on its own term.
    only_c = vtrace_targets(values, boot, rewards, discounts, big, clip_rho=None, clip_c=1.0)
    only_rho = vtrace_targets(values, boot, rewards, discounts, big, clip_rho=1.0, clip_c=None)
    for out in (only_c, only_rho):
        assert not np.allclose(out.vs, clipped.vs)
        assert not np.allclose(out.vs, unclipped.vs)
    no_pg_clip = vtrace_targets(values, boot, rewards, discounts, big, clip_pg_rho=None)
    np.testing.assert_allclose(no_pg_clip.vs, clipped.vs, rtol=1e-7, equal_nan=False, strict=True)
    np.testing.assert_allclose(
        no_pg_clip.pg_advantages, 5.0 * clipped.pg_advantages, rtol=1e-7, equal_nan=False,
        strict=True,
    )  # fmt: skip


def test_unweighted_advantage_is_papers_a_hat() -> None:
    rng = np.random.default_rng(13)
    values, rewards = rng.normal(size=(2, 3)), rng.normal(size=(2, 3))
    boot, rhos = rng.normal(size=2), rng.uniform(0.1, 0.9, size=(2, 3))
    discounts = np.array([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    vs, adv = vtrace_targets(values, boot, rewards, discounts, rhos, pg_rho_weighted=False)
    vs_next = np.concatenate([vs[:, 1:], boot[:, None]], axis=1)
    want = rewards + discounts * vs_next - values
    np.testing.assert_allclose(adv, want, rtol=1e-12, atol=1e-12, equal_nan=False, strict=True)
    _, weighted = vtrace_targets(values, boot, rewards, discounts, rhos)
    np.testing.assert_allclose(
        weighted, rhos * want, rtol=1e-12, atol=1e-12, equal_nan=False, strict=True
    )


@pytest.mark.parametrize("mask", [None, "full", "prefix"])
@pytest.mark.parametrize("in_dtype", [np.float64, np.float32])
def test_outputs_are_fresh_float64_arrays(mask: str | None, in_dtype: type) -> None:
    """Outputs are new float64 arrays: no aliasing of, and no writes to, the inputs."""
    rng = np.random.default_rng(14)
    inputs = {
        "values": rng.normal(size=(3, 4)).astype(in_dtype),
        "bootstrap_value": rng.normal(size=3).astype(in_dtype),
        "rewards": rng.normal(size=(3, 4)).astype(in_dtype),
        "discounts": np.full((3, 4), 0.9, dtype=in_dtype),
        "rhos": rng.exponential(size=(3, 4)).astype(in_dtype),
    }
    if mask == "full":
        inputs["mask"] = np.ones((3, 4), dtype=bool)
    elif mask == "prefix":
        inputs["mask"] = np.array([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]])
    before = {k: a.copy() for k, a in inputs.items()}
    vs, adv = vtrace_targets(**inputs)
    for out in (vs, adv):
        assert isinstance(out, np.ndarray) and out.dtype == np.float64 and out.shape == (3, 4)
        assert out.flags.owndata and out.flags.writeable
        for a in inputs.values():
            assert not np.shares_memory(out, a)
    assert not np.shares_memory(vs, adv)
    for k, a in inputs.items():
        np.testing.assert_array_equal(a, before[k], strict=True)
    # Writing to the outputs leaves the inputs alone.
    vs[...] = 7.0
    adv[...] = 7.0
    for k, a in inputs.items():
        np.testing.assert_array_equal(a, before[k], strict=True)


def test_accepts_nested_lists_and_does_not_import_torch() -> None:
    # Integer lists are fine too; terminal at t = 1, so the NaN bootstrap value is unused.
    out = vtrace_targets(
        [[1.0, 2.0, 5.0]], [np.nan], [[1, 3, 9]], [[1.0, 0.0, 1.0]], [[1, 1, 1]],
        mask=[[True, True, False]],
    )  # fmt: skip
    # On-policy, γ = 1: v_1 = r_1 = 3, v_0 = r_0 + v_1 = 4; A_s = v_s − V(x_s); v_2 = V(x_2).
    np.testing.assert_array_equal(out.vs, [[4.0, 3.0, 5.0]], strict=False)
    np.testing.assert_array_equal(out.pg_advantages, [[3.0, 1.0, 0.0]], strict=False)
    assert out.vs.dtype == out.pg_advantages.dtype == np.float64
    assert "torch" not in vars(vtrace_module)


def test_fixed_point_is_value_of_min_pi_s_remark_1() -> None:
    """Espeholt et al. Remark 1: with ρ̄ = 1 the fixed point is V of ∝ min(μ, π), not of π."""
    mu = np.array([0.6, 0.3, 0.1])  # behaviour: the score policy π
    target = np.array([0.2, 0.4, 0.4])  # target: S
    reward = np.array([1.0, 0.0, 3.0])  # one-step episodes, one per action

    def expected_correction(v: float) -> float:
        vs, _ = vtrace_targets(
            np.full((3, 1), v),
            np.zeros(3),
            reward[:, None],
            np.zeros((3, 1)),
            (target / mu)[:, None],
        )
        return float(np.sum(mu * (vs[:, 0] - v)))

    mix = np.minimum(mu, target) / np.minimum(mu, target).sum()
    v_fixed = float(mix @ reward)
    v_target = float(target @ reward)
    assert expected_correction(v_fixed) == pytest.approx(0.0, abs=1e-12)
    assert abs(expected_correction(v_target)) > 0.05


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"values": np.zeros(4)}, "values must be"),
        ({"bootstrap_value": np.zeros(3)}, "bootstrap_value"),
        ({"bootstrap_value": np.zeros((2, 1))}, "bootstrap_value"),
        ({"rewards": np.zeros((2, 3))}, "rewards"),
        ({"discounts": np.zeros((4, 2))}, "discounts"),
        ({"rhos": np.ones((2, 5))}, "rhos"),
        ({"rhos": -np.ones((2, 4))}, "ratios"),
        ({"mask": np.ones((2, 3))}, "mask must have"),
        ({"mask": np.array([[1, 0, 1, 0], [1, 1, 1, 1]])}, "prefix"),
        ({"mask": np.full((2, 4), 2)}, "0/1"),
        ({"clip_rho": 0.0}, "clip_rho"),
    ],
)
def test_bad_inputs_raise(kwargs: dict, match: str) -> None:
    args = {
        "values": np.zeros((2, 4)),
        "bootstrap_value": np.zeros(2),
        "rewards": np.zeros((2, 4)),
        "discounts": np.ones((2, 4)),
        "rhos": np.ones((2, 4)),
    }
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        vtrace_targets(**args)
