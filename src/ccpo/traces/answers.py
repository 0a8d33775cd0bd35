"""One answer normaliser for scoring and for answer-set de-duplication, per task **family**.

A task is a name (``mmlu``, ``hotpotqa``, ``jsonl``, or any name of yours, e.g. ``medqa``) plus
a family that fixes the prompt and the answer normaliser:

- ``mcq``: multiple choice; answers are normalised to their option letter
  (:func:`normalize_choice`: ``"(b) Paris"`` → ``"B"``);
- ``short``: short free text, SQuAD/HotpotQA-style (:func:`normalize_answer`: lower case, drop
  punctuation and articles, fold white space);
- ``exact``: string equality after trimming white space (:func:`normalize_exact`);
- ``chat``: a conversation's free-text reply, compared verbatim (:func:`normalize_verbatim`:
  exact string equality, nothing trimmed), so that two replies agree only when identical;
- ``number``: a numeric answer, e.g. a maths word problem's (:func:`normalize_number`: the last
  number in the text, thousands separators dropped, in canonical decimal form), so that
  ``"The answer is $1,200.00."`` and ``"1200"`` agree.

The built-in names have fixed families (``mmlu`` → mcq, ``hotpotqa`` and ``jsonl`` → short,
``chat`` → chat); a name starting with ``mmlu`` is mcq, and any other name without a family is
``short``.
"""

from __future__ import annotations

import re
import string
from decimal import Decimal

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


def normalize_exact(text: str) -> str:
    """The ``exact`` family's normaliser: the text with surrounding white space trimmed."""
    return text.strip()


#: a number: an optional minus sign not glued to a word ("5-6" is 5 and 6), then digits with
#: optional thousands separators and decimals, or a bare decimal (".5")
_NUMBER = re.compile(
    r"(?:(?<![\w.])-)?(?:(?<![\d.,])(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|(?<![\d,])\.\d+)"
)


def normalize_number(text: str) -> str:
    """The ``number`` family's normaliser: the last number in ``text`` in canonical decimal
    form (``"$1,200.50"`` → ``"1200.5"``, ``"18.00"`` → ``"18"``, ``"-0"`` → ``"0"``); ``""``
    when the text holds no number (never equal to an answer)."""
    found = _NUMBER.findall(text)
    if not found:
        return ""
    d = Decimal(found[-1].replace(",", "")).normalize()  # the pattern matches numbers only
    if d == 0:
        return "0"
    return format(d, "f")


def normalize_verbatim(text: str) -> str:
    """The ``chat`` family's "normaliser": the reply itself (exact string equality)."""
    return text


FAMILIES: tuple[str, ...] = ("mcq", "short", "exact", "chat", "number")
BUILTIN_TASKS: dict[str, str] = {
    "mmlu": "mcq",
    "hotpotqa": "short",
    "jsonl": "short",
    "chat": "chat",
}
_NORMALIZERS = {
    "mcq": normalize_choice,
    "short": normalize_answer,
    "exact": normalize_exact,
    "chat": normalize_verbatim,
    "number": normalize_number,
}


def family_of(task: str, family: str | None = None) -> str:
    """The family of ``task``: ``family`` when given (it must be one of :data:`FAMILIES` and
    agree with a built-in name's), else the built-in name's, else ``short`` (``mcq`` for names
    starting with ``mmlu``)."""
    t = task.lower()
    builtin = BUILTIN_TASKS.get(t)
    if family is not None:
        if family not in FAMILIES:
            raise ValueError(
                f"unknown task family '{family}'; expected one of {', '.join(FAMILIES)}"
            )
        if builtin is not None and family != builtin:
            raise ValueError(f"task '{task}' is built in with family '{builtin}', not '{family}'")
        return family
    if builtin is not None:
        return builtin
    return "mcq" if t.startswith("mmlu") else "short"


def normalizer_for(task: str, family: str | None = None):
    """The answer normaliser of a task (see the module docstring): its family's."""
    return _NORMALIZERS[family_of(task, family)]


def exact_match(
    prediction: str, golds: list[str], task: str = "hotpotqa", family: str | None = None
) -> bool:
    """Normalised exact match of ``prediction`` against any gold answer."""
    norm = normalizer_for(task, family)
    p = norm(prediction)
    return bool(p) and any(p == norm(g) for g in golds)
