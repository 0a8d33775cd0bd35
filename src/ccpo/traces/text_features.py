"""Features of a question's text alone, for a decision made before any model is called.

Hashed n-grams need no vocabulary and no download: each lower-cased word unigram and bigram
and each character 3-gram is hashed (CRC-32, stable across processes and versions of Python)
into one of :data:`DIM` signed buckets; the bucket vector is scaled to unit length, and two
columns are added: log(1 + characters) / 10 and log(1 + words) / 10. The spec
(:data:`TEXT_FEATURE_SPEC`) is versioned and saved with the router that reads it.

Main names: :func:`text_features` (one text → [D]), :func:`text_matrix` (texts → [N, D]).
Used by :mod:`ccpo.policies.routing.router`; derivation of the routed guarantee: docs/theory.md,
"Routing before the first call".
"""

from __future__ import annotations

import itertools
import math
import re
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

TEXT_FEATURE_VERSION = "ccpo.text-features/v1"
DIM = 1024
"""Hash buckets (the vector has DIM + 2 columns: the buckets, then the two lengths)."""

TEXT_FEATURE_SPEC: dict[str, Any] = {"version": TEXT_FEATURE_VERSION, "dim": DIM}

_WORD = re.compile(r"\w+", re.UNICODE)


def _grams(text: str) -> list[str]:
    words = _WORD.findall(text.lower())
    grams = [f"w:{w}" for w in words]
    grams += [f"b:{a} {b}" for a, b in itertools.pairwise(words)]
    squeezed = " ".join(words)
    grams += [f"c:{squeezed[i : i + 3]}" for i in range(max(0, len(squeezed) - 2))]
    return grams


def text_features(text: str, dim: int = DIM) -> np.ndarray:
    """The feature vector of one text, shape [dim + 2] (float64; module docstring)."""
    out = np.zeros(dim + 2)
    for g in _grams(text):
        h = zlib.crc32(g.encode("utf-8"))
        out[h % dim] += 1.0 if (h >> 31) & 1 else -1.0
    norm = math.sqrt(float((out[:dim] ** 2).sum()))
    if norm > 0:
        out[:dim] /= norm
    out[dim] = math.log1p(len(text)) / 10.0
    out[dim + 1] = math.log1p(len(_WORD.findall(text))) / 10.0
    return out


def text_matrix(texts: Sequence[str], dim: int = DIM) -> np.ndarray:
    """:func:`text_features` of every text, shape [N, dim + 2]."""
    return np.stack([text_features(t, dim) for t in texts]) if texts else np.zeros((0, dim + 2))
