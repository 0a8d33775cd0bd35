"""Pure text signals of free-text replies: lexical similarity, length and refusal markers.

No model, no download, no network: each function maps strings to a number by a fixed rule,
so the collector, the importer, the replay and the live agent compute the same value bit for
bit. Reusable wherever text needs a cheap feature (e.g. routing on the question).

- :func:`words`: the word tokens (lower case, Unicode ``\\w+`` runs).
- :func:`word_jaccard`: |A ∩ B| / |A ∪ B| of the two replies' word sets.
- :func:`char_ngram_cosine`: cosine of the replies' character n-gram counts (n = 3 over the
  lower-cased, space-collapsed text), summed exactly (``math.fsum``, shared grams in sorted
  order) so that it is symmetric and independent of dict order.
- :func:`word_count`, :func:`is_refusal` (:data:`REFUSAL_MARKERS`, looked for near the start).

Two empty replies are identical (1.0); an empty and a non-empty reply share nothing (0.0).
The features built on these: docs/design.md, section "Signals"; words: docs/glossary.md.
"""

from __future__ import annotations

import math
import re
from collections import Counter

_WORD = re.compile(r"\w+", re.UNICODE)
_SPACE = re.compile(r"\s+")

#: lower-case phrases that mark a refusal or a non-answer (apostrophes normalised to ')
REFUSAL_MARKERS: tuple[str, ...] = (
    "i can't help",
    "i cannot help",
    "i can't assist",
    "i cannot assist",
    "i can't provide",
    "i cannot provide",
    "i can't do that",
    "i won't be able to",
    "i'm unable to",
    "i am unable to",
    "i'm not able to",
    "i am not able to",
    "i must decline",
    "i'm sorry, but",
    "i am sorry, but",
    "as an ai",
    "as a language model",
    "cannot comply",
    "can't comply",
)

#: refusal markers count only within this many characters of the start of a reply
REFUSAL_WINDOW = 400


def words(text: str) -> list[str]:
    """The word tokens of ``text``: maximal ``\\w`` runs, lower-cased."""
    return _WORD.findall(text.lower())


def word_count(text: str) -> int:
    """How many word tokens ``text`` holds (:func:`words`)."""
    return len(words(text))


def word_jaccard(a: str, b: str) -> float:
    """Jaccard similarity of the word sets of ``a`` and ``b``, in [0, 1]."""
    sa, sb = set(words(a)), set(words(b))
    if not sa and not sb:
        return 1.0
    return len(sa & sb) / len(sa | sb)


def char_ngrams(text: str, n: int = 3) -> Counter[str]:
    """Counts of the character n-grams of ``text`` (lower case, runs of white space as one
    space, stripped); a text shorter than ``n`` is its own single gram."""
    s = _SPACE.sub(" ", text.lower()).strip()
    if not s:
        return Counter()
    if len(s) < n:
        return Counter([s])
    return Counter(s[i : i + n] for i in range(len(s) - n + 1))


def char_ngram_cosine(a: str, b: str, n: int = 3) -> float:
    """Cosine similarity of the character n-gram counts of ``a`` and ``b``, in [0, 1]."""
    ca, cb = char_ngrams(a, n), char_ngrams(b, n)
    if not ca and not cb:
        return 1.0
    if not ca or not cb:
        return 0.0
    dot = math.fsum(ca[g] * cb[g] for g in sorted(ca.keys() & cb.keys()))
    na = math.sqrt(math.fsum(v * v for v in ca.values()))
    nb = math.sqrt(math.fsum(v * v for v in cb.values()))
    return min(1.0, dot / (na * nb))


def is_refusal(text: str) -> bool:
    """Whether ``text`` opens with a refusal marker (:data:`REFUSAL_MARKERS`, within the first
    :data:`REFUSAL_WINDOW` characters, case and apostrophe style ignored)."""
    head = text[:REFUSAL_WINDOW].lower().replace("\u2019", "'")
    head = _SPACE.sub(" ", head)
    return any(m in head for m in REFUSAL_MARKERS)


def cosine(u: list[float], v: list[float]) -> float | None:
    """Cosine similarity of two vectors (embeddings), in [−1, 1]; None when either is zero
    or they differ in length."""
    if len(u) != len(v) or not u:
        return None
    nu = math.sqrt(math.fsum(x * x for x in u))
    nv = math.sqrt(math.fsum(x * x for x in v))
    if nu == 0.0 or nv == 0.0:
        return None
    return max(-1.0, min(1.0, math.fsum(x * y for x, y in zip(u, v, strict=True)) / (nu * nv)))
