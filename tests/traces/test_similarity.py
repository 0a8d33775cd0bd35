"""The lexical maths of the signals: golden values, the conventions for empty replies,
symmetry and range on seeded random texts, and the refusal markers."""

from __future__ import annotations

import math
import random

import pytest

from ccpo.traces.similarity import (
    REFUSAL_WINDOW,
    char_ngram_cosine,
    char_ngrams,
    cosine,
    is_refusal,
    word_count,
    word_jaccard,
    words,
)


def test_golden_values():
    assert words("The cat, the HAT!") == ["the", "cat", "the", "hat"]
    assert word_count("Der Bär läuft — schnell.") == 4  # Unicode words
    assert word_jaccard("the cat sat", "the cat ran") == pytest.approx(2 / 4, abs=0)
    assert word_jaccard("a b", "c d") == 0.0
    # abc, bcd vs bcd, cde: one shared gram of two each
    assert char_ngram_cosine("abcd", "bcde") == pytest.approx(0.5, abs=1e-15)
    assert char_ngrams("ab") == {"ab": 1}  # shorter than n: one gram
    # counts matter: "aaaa" has aaa twice
    assert char_ngram_cosine("aaaa", "aaa") == pytest.approx(1.0)
    assert cosine([1.0, 0.0], [0.0, 1.0]) == 0.0
    assert cosine([1.0, 2.0], [2.0, 4.0]) == pytest.approx(1.0)
    assert cosine([1.0, 0.0], [-1.0, 0.0]) == -1.0
    assert cosine([0.0, 0.0], [1.0, 1.0]) is None and cosine([1.0], [1.0, 2.0]) is None


def test_case_and_spacing_do_not_matter_but_words_do():
    a = "Paris is the capital of France."
    assert char_ngram_cosine(a, "  PARIS   is the\ncapital of France.") == pytest.approx(1.0)
    assert word_jaccard(a, a.upper()) == 1.0
    assert char_ngram_cosine(a, "Lyon is a city in France.") < 0.6


def test_empty_replies():
    assert word_jaccard("", "") == 1.0 and char_ngram_cosine("", "  ") == 1.0
    assert word_jaccard("", "x") == 0.0 and char_ngram_cosine("text", "") == 0.0


def test_symmetric_and_in_range_on_random_texts():
    rng = random.Random(7)  # seed 7, 300 pairs
    alphabet = "ab cdé\nf"
    for _ in range(300):
        a = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        b = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        for f in (word_jaccard, char_ngram_cosine):
            x = f(a, b)
            assert x == f(b, a)  # exactly: fsum over sorted shared grams
            assert 0.0 <= x <= 1.0 and math.isfinite(x)
            assert f(a, a) == pytest.approx(1.0)


def test_refusal_markers():
    assert is_refusal("I'm sorry, but I can't help with that.")
    assert is_refusal("I\u2019m unable to share that.")  # a typographic apostrophe
    assert is_refusal("As an AI   language model, I cannot give medical advice.")
    assert not is_refusal("Sure. The capital of France is Paris.")
    assert not is_refusal("x" * REFUSAL_WINDOW + " I can't help")  # only near the start
