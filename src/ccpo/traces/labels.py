"""What a trace set's ``correct`` fields are measured against: gold labels or a reference model.

Without gold labels, ``correct`` means "equals the reference model's answer on this question
under the task family's normaliser" (docs/design.md, "Labels from a reference"; derivation:
docs/theory.md, "Label-free agreement"): the reference's own answer is correct and every
question is solvable. Everything downstream is unchanged; what changes is the claim, which
traces, policies, reports and served answers must state.

Contract (trace files): a trace whose labels come from a reference model carries
``meta.labels = "reference:<model>"``; a trace without ``meta.labels`` (or with ``"gold"``) is
labelled by gold answers; scores with an acceptance rule (``traces import --accept``) carry
``"scored:{json}"`` and an LLM judge's verdicts (``traces judge``) ``"judged:{json}"``
(:func:`scored_labels`, :func:`judged_labels`; docs/design.md, "Labels from scores or a
judge"). A policy records the same string as ``against`` in its provenance.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from ccpo.errors import CCPOError
from ccpo.traces.accept import parse_rule

GOLD = "gold"
REFERENCE_PREFIX = "reference:"
SCORED_PREFIX = "scored:"
JUDGED_PREFIX = "judged:"


def reference_labels(model: str) -> str:
    """The ``meta.labels`` / ``against`` string of labels made by agreement with ``model``."""
    return f"{REFERENCE_PREFIX}{model}"


def reference_model(labels: str) -> str | None:
    """The reference model named by ``labels`` (``None`` for gold labels)."""
    return labels[len(REFERENCE_PREFIX) :] if labels.startswith(REFERENCE_PREFIX) else None


def trace_labels(trace: Any) -> str:
    """``"gold"`` or ``"reference:<model>"`` for one trace (read from ``meta.labels``)."""
    meta = getattr(trace, "meta", None) or {}
    labels = meta.get("labels", GOLD) if isinstance(meta, dict) else GOLD
    ok = isinstance(labels, str) and (
        labels == GOLD or bool(reference_model(labels)) or rule_labels(labels) is not None
    )
    if not ok:
        raise CCPOError(
            f'trace {getattr(trace, "id", "?")!r}: meta.labels must be "gold", '
            f'"reference:<model>", "scored:{{...}}" or "judged:{{...}}", got {labels!r}'
        )
    return labels


def labels_of(traces: Iterable[Any]) -> str:
    """The labels of a whole trace set; a set mixing gold and reference labels is refused."""
    return one_label({trace_labels(t) for t in traces})


def one_label(seen: set[str], where: str = "the trace set") -> str:
    """The one label source among ``seen`` (``"gold"`` when empty); several are refused."""
    if len(seen) > 1:
        raise CCPOError(
            f"{where} mixes labels {sorted(seen)}: a guarantee must be against one thing"
        )
    return next(iter(seen)) if seen else GOLD


def against_text(labels: str) -> str:
    """How a report or a served answer names what coverage is measured against.

    ``"accuracy"`` for gold labels, ``"agreement with gpt-4o"`` for reference labels,
    ``"acceptance (scores ≥ 8)"`` for scores or a judge's verdicts.
    """
    model = reference_model(labels)
    if model is not None:
        return f"agreement with {model}"
    rule = rule_labels(labels)
    return "accuracy" if rule is None else f"acceptance ({accepted_words(rule)})"


def _canonical(prefix: str, fields: dict[str, Any]) -> str:
    body = {k: v for k, v in fields.items() if v is not None}
    return prefix + json.dumps(body, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def scored_labels(rule: str, reference: str | None = None) -> str:
    """``meta.labels`` of rows labelled by their own ``score`` and an acceptance ``rule``
    (canonical text, :class:`ccpo.traces.accept.AcceptRule`); ``reference``: the model whose
    score a relative rule compares with."""
    return _canonical(SCORED_PREFIX, {"rule": rule, "reference": reference})


def judged_labels(judge: str, reference: str, mode: str, rule: str | None, prompt: str) -> str:
    """``meta.labels`` of replies labelled by an LLM ``judge`` against ``reference``'s reply
    (``mode``: rating, pairwise or both; ``rule`` on the ratings; ``prompt``: the judge
    prompts' version)."""
    return _canonical(
        JUDGED_PREFIX,
        {"judge": judge, "reference": reference, "mode": mode, "rule": rule, "prompt": prompt},
    )


def rule_labels(labels: str) -> dict[str, Any] | None:
    """The fields of scored or judged labels, with ``kind`` (``"scored"`` or ``"judged"``);
    None for any other labels or a malformed body."""
    for prefix, need in ((SCORED_PREFIX, ("rule",)), (JUDGED_PREFIX, ("judge", "reference"))):
        if labels.startswith(prefix):
            try:
                body = json.loads(labels[len(prefix) :])
            except ValueError:
                return None
            if not isinstance(body, dict) or not all(isinstance(body.get(k), str) for k in need):
                return None
            if body.get("rule") is not None:  # a rule that does not parse is no rule
                try:
                    parse_rule(str(body["rule"]))
                except CCPOError:
                    return None
            return {**body, "kind": prefix[:-1]}
    return None


def accepted_words(rule: dict[str, Any]) -> str:
    """What an accepted reply is, in words, for :func:`rule_labels`' fields: "scores ≥ 8",
    "judged by gpt-4o at least as good as gpt-4-turbo's reply"."""
    if rule["kind"] == "scored":
        return parse_rule(rule["rule"]).words(rule.get("reference"))
    judge, ref, mode = rule["judge"], rule["reference"], rule.get("mode", "rating")
    parts = []
    if mode in ("pairwise", "both"):
        parts.append(f"judged by {judge} at least as good as {ref}'s reply")
    if mode in ("rating", "both") and rule.get("rule"):
        rated = parse_rule(rule["rule"]).words(scale=" of 10").replace("scores", "rated", 1)
        parts.append(f"{rated} by {judge} against {ref}'s reply")
    return " and ".join(parts)


def every_question_solvable(labels: str) -> bool:
    """Whether every question has a correct reply by construction: the reference's own
    answer (agreement, a judge, or a relative rule the reference's score always meets)."""
    if reference_model(labels) is not None:
        return True
    rule = rule_labels(labels)
    if rule is None:
        return False
    if rule["kind"] == "judged":
        return True
    return parse_rule(rule["rule"]).reference_accepted


def claim(labels: str, single: bool) -> str:
    """What a policy trained on ``labels`` promises, before "with probability ≥ 1 − α":
    "the answer is correct", "the answer set contains gpt-4o's answer", "the answer is judged
    by gpt-4o at least as good as gpt-4-turbo's reply", ..."""
    ref = reference_model(labels)
    rule = rule_labels(labels)
    if ref is not None:
        return f"the answer equals {ref}'s" if single else f"the answer set contains {ref}'s answer"
    if rule is not None:
        words = accepted_words(rule)
        if rule["kind"] == "scored":
            words += " (the table's scores)"
        else:
            words = "is " + words
        return f"the answer {words}" if single else f"the answer set holds an answer that {words}"
    return "the answer is correct" if single else "the answer set contains a correct answer"
