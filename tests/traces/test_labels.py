import pytest

from ccpo.errors import CCPOError
from ccpo.traces.labels import (
    against_text,
    labels_of,
    reference_labels,
    reference_model,
    trace_labels,
)


class T:
    def __init__(self, meta, id_="q"):
        self.meta = meta
        self.id = id_


def test_gold_is_the_default_and_reference_round_trips():
    assert trace_labels(T({})) == "gold"
    lab = reference_labels("gpt-4o")
    assert reference_model(lab) == "gpt-4o"
    assert reference_model("gold") is None
    assert labels_of([T({"labels": lab}), T({"labels": lab})]) == lab
    assert against_text(lab) == "agreement with gpt-4o"
    assert against_text("gold") == "accuracy"


def test_mixed_or_malformed_labels_are_refused():
    with pytest.raises(CCPOError, match="mixes labels"):
        labels_of([T({}), T({"labels": reference_labels("m")})])
    with pytest.raises(CCPOError, match=r"meta\.labels"):
        trace_labels(T({"labels": "silver"}))
