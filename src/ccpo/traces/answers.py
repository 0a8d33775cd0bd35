"""One answer normaliser for scoring and for answer-set de-duplication.

``normalize_answer`` is SQuAD-style (lower case, drop punctuation and articles, fold white
space), the HotpotQA exact-match normaliser. Multiple-choice answers are normalised to their
option letter by :func:`normalize_choice`.
"""

from __future__ import annotations

import re
import string

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)
_CHOICE = re.compile(r"^\(?([A-Za-z])\)?(?:[.:)\s]|$)")
_ANSWER_PREFIX = re.compile(
    r"^(?:the\s+)?(?:correct\s+)?(?:answer|option)\s*(?:is)?\s*[:\-]?\s*", re.I
)


def normalize_answer(text: str) -> str:
    """SQuAD/HotpotQA normalisation: lower, remove punctuation, articles, extra white space."""
    s = text.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def normalize_choice(text: str) -> str:
    """A multiple-choice answer as its upper-case option letter ('(b) Paris' -> 'B').

    Text that does not start with an option letter is normalised like a free-form answer.
    """
    s = _ANSWER_PREFIX.sub("", text.strip())
    m = _CHOICE.match(s)
    if m:
        return m.group(1).upper()
    return normalize_answer(text)


def normalizer_for(task: str):
    """The answer normaliser a task uses (``mmlu`` → option letter, else SQuAD-style)."""
    return normalize_choice if task.lower().startswith("mmlu") else normalize_answer


def exact_match(prediction: str, golds: list[str], task: str = "hotpotqa") -> bool:
    """Normalised exact match of ``prediction`` against any gold answer."""
    norm = normalizer_for(task)
    p = norm(prediction)
    return bool(p) and any(p == norm(g) for g in golds)
