"""The words for detection's typed facts: parameters, stop reasons, where an Inf was written."""
from __future__ import annotations

import pytest

from nandoctor.detect.result import BatchOrigin, Location, ParameterRef, Site, SiteFacts, StopReason
from nandoctor.diagnose import words


def test_a_parameter_is_named_by_name_then_position_then_shape():
    assert words.parameter(ParameterRef("encoder.0.weight", (4, 3))) == "encoder.0.weight"
    assert words.parameter(ParameterRef(None, (3,), group=0, index=2)) == "param_groups[0].params[2] (3,)"
    assert words.parameter(ParameterRef(None, (3,))) == "a parameter of shape (3,)"
    assert words.parameter_phrase(ParameterRef("w", (3,))) == "parameter `w`"
    assert words.parameter_phrase(ParameterRef(None, (3,))) == "a parameter of shape (3,)"


@pytest.mark.parametrize("reason", list(StopReason))
def test_every_stop_reason_has_words(reason):
    facts = SiteFacts(batch=BatchOrigin(7, "batch"), optimizer="SGD", parameter=ParameterRef("fc.bias", (2,)))
    text = words.stop_reason(reason, Site("", "data", None, facts=facts))
    assert text and "None" not in text


def test_a_gradient_stop_names_the_parameter_only_when_it_has_a_name():
    named = Site("", "backward", None, facts=SiteFacts(parameter=ParameterRef("fc.bias", (2,))))
    assert words.stop_reason(StopReason.GRADIENT_AFTER_BACKWARD, named) == \
        "the gradient of `fc.bias` is non-finite after backward()"
    assert words.stop_reason(StopReason.GRADIENT_AFTER_BACKWARD, Site("", "backward", None)) == \
        "a gradient is non-finite after backward()"


def test_an_intended_inf_is_placed_at_its_line_or_named_by_its_op():
    at = SiteFacts(inf_written_at=Location("model.py", 3, "f", "s.masked_fill_(m, -inf)"))
    assert words.inf_source(at) == "model.py:3 (`s.masked_fill_(m, -inf)`)"
    assert words.inf_source(SiteFacts(inf_written_by="aten.full.default")) == "aten.full.default"
    assert words.inf_source(SiteFacts()) is None
