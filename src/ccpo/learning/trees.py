"""CStop's gradient-boosted trees as plain numpy arrays, evaluated without scikit-learn.

A live agent scores a handful of rows once per round, and scikit-learn's ``predict_proba``
spends far more on input validation, its OpenMP thread pool and per-tree Python dispatch than
on the arithmetic (figures: docs/decisions.md, "CStop's trees compiled to numpy").
:func:`compile_hgb` reads a fitted binary ``HistGradientBoostingClassifier`` once into flat
arrays (cached per model object) and :class:`CompiledTrees` walks them with a few numpy
operations per tree level.

**Same numbers as scikit-learn.** The raw score is summed tree by tree in scikit-learn's order
in float64, so every row's probability is the same float as scikit-learn's, alone or in a batch
(the batch invariance :func:`ccpo.policies.classifier.fixable_probability` promises). A model
this cannot reproduce exactly (categorical splits, more than one tree per iteration) is not
compiled: :func:`compile_hgb` returns None and the caller keeps scikit-learn. The fitted model
stays in the policy folder (provenance, compatibility); the compiled form is derived from it.
"""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class CompiledTrees:
    """K trees in one flat node table; a leaf's two children are itself, so a row that reached
    its leaf stays there while :meth:`raw` walks the deeper trees.

    scikit-learn computes, per row x (``_raw_predict`` then the binomial loss's
    ``predict_proba``), raw(x) = ((b + v_1(x)) + v_2(x)) + … + v_K(x) and
    P(y = 1 | x) = expit(raw(x)), with b the baseline (``_baseline_prediction``, the log-odds of
    the training labels) and v_k(x) the value of the leaf row x reaches in tree k
    (``_predictors[k][0].nodes``): at a split node a NaN goes to the side
    ``missing_go_to_left`` names, otherwise ``x[feature_idx] <= num_threshold`` goes left
    (``_predictor.pyx``, ``_predict_one_from_raw_data``). This class repeats it in that order."""

    feature: np.ndarray  # [nodes] int: the feature a split node reads (0 at leaves)
    threshold: np.ndarray  # [nodes] float64: go left iff x <= threshold (split nodes)
    missing_left: np.ndarray  # [nodes] bool: where a NaN goes
    left: np.ndarray  # [nodes] int: global index of the left child (self at a leaf)
    right: np.ndarray  # [nodes] int: global index of the right child (self at a leaf)
    value: np.ndarray  # [nodes] float64: a leaf's value (0 at split nodes)
    roots: np.ndarray  # [K] int: tree k's root, in the order scikit-learn adds the trees
    depth: int  # the deepest leaf's depth: the walk's number of steps
    baseline: float  # b, the raw prediction before any tree
    n_features: int

    def leaves(self, x: np.ndarray) -> np.ndarray:
        """[n, K] the leaf each row of ``x`` [n, F] reaches in each tree."""
        rows = np.arange(x.shape[0])[:, None]
        node = np.broadcast_to(self.roots, (x.shape[0], self.roots.size))
        for _ in range(self.depth):
            v = x[rows, self.feature[node]]
            go_left = (v <= self.threshold[node]) | (np.isnan(v) & self.missing_left[node])
            node = np.where(go_left, self.left[node], self.right[node])
        return node

    def raw(self, x: np.ndarray) -> np.ndarray:
        """[n] raw predictions b + Σ_k v_k(x), summed tree by tree in scikit-learn's order."""
        x = np.asarray(x, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != self.n_features:
            raise ValueError(f"rows must have shape [n, {self.n_features}], got {x.shape}")
        terms = np.empty((x.shape[0], self.roots.size + 1))
        terms[:, 0] = self.baseline
        terms[:, 1:] = self.value[self.leaves(x)]
        # a running sum is strictly sequential (out[k] = out[k-1] + term[k]), as _raw_predict
        # accumulates, unlike sum()'s pairwise summation
        return np.add.accumulate(terms, axis=1)[:, -1]

    def predict_proba(self, x: np.ndarray) -> np.ndarray:
        """[n] P(y = 1 | x) = expit(raw(x)) (scikit-learn's binomial link)."""
        from scipy.special import expit

        return expit(self.raw(x))


def _compile(model: Any) -> CompiledTrees | None:
    from sklearn.ensemble import HistGradientBoostingClassifier

    if not isinstance(model, HistGradientBoostingClassifier):
        return None
    if getattr(model, "n_trees_per_iteration_", None) != 1 or len(model.classes_) != 2:
        return None  # multi-class: one tree per class and a softmax
    if getattr(model, "is_categorical_", None) is not None and np.any(model.is_categorical_):
        return None  # categorical splits: bitsets, kept to scikit-learn
    predictors = [it[0] for it in model._predictors]
    feature, threshold, missing_left, left, right, value, roots = [], [], [], [], [], [], []
    offset, depth = 0, 0
    for p in predictors:
        nodes = p.nodes
        if np.any(nodes["is_categorical"]):
            return None
        n = nodes.shape[0]
        leaf = nodes["is_leaf"].astype(bool)
        own = np.arange(n) + offset
        feature.append(np.where(leaf, 0, nodes["feature_idx"]).astype(np.intp))
        threshold.append(nodes["num_threshold"].astype(np.float64))
        missing_left.append(nodes["missing_go_to_left"].astype(bool))
        left.append(np.where(leaf, own, nodes["left"].astype(np.intp) + offset))
        right.append(np.where(leaf, own, nodes["right"].astype(np.intp) + offset))
        value.append(np.where(leaf, nodes["value"], 0.0).astype(np.float64))
        roots.append(offset)
        depth = max(depth, int(nodes["depth"].max()))
        offset += n
    baseline = np.asarray(model._baseline_prediction, dtype=np.float64).reshape(-1)
    if baseline.size != 1:
        return None
    return CompiledTrees(
        feature=np.concatenate(feature),
        threshold=np.concatenate(threshold),
        missing_left=np.concatenate(missing_left),
        left=np.concatenate(left),
        right=np.concatenate(right),
        value=np.concatenate(value),
        roots=np.asarray(roots, dtype=np.intp),
        depth=depth,
        baseline=float(baseline[0]),
        n_features=int(model.n_features_in_),
    )


_CACHE: weakref.WeakKeyDictionary[Any, CompiledTrees | None] = weakref.WeakKeyDictionary()


def compile_hgb(model: Any) -> CompiledTrees | None:
    """The compiled form of a fitted binary ``HistGradientBoostingClassifier`` (cached per
    model object), or None for any other model or one with categorical splits."""
    try:
        return _CACHE[model]
    except (KeyError, TypeError):
        pass
    compiled = _compile(model)
    with contextlib.suppress(TypeError):  # not weak-referenceable: compiled again next time
        _CACHE[model] = compiled
    return compiled
