"""The words for detection's typed facts: parameters, stop reasons, where an Inf was written."""
from __future__ import annotations

import io

import pytest
from rich.console import Console

from nandoctor.detect.result import BatchOrigin, Discarded, Location, ParameterRef, Site, SiteFacts, StopReason
from nandoctor.diagnose import words


def test_a_parameter_is_named_by_name_then_position_then_shape():
    assert words.parameter(ParameterRef("encoder.0.weight", (4, 3))) == "encoder.0.weight"
    assert words.parameter(ParameterRef(None, (3,), group=0, index=2)) == "param_groups[0].params[2] (3,)"
    assert words.parameter(ParameterRef(None, (3,))) == "a parameter of shape (3,)"
    assert words.parameter_phrase(ParameterRef("w", (3,))) == "parameter `w`"
    assert words.parameter_phrase(ParameterRef(None, (3,))) == "a parameter of shape (3,)"


def test_a_parameter_nothing_trains_is_not_called_a_weight():
    # Keras keeps its loss tracker's total as an nn.Parameter with requires_grad=False.
    tracker = ParameterRef(None, (), trained=False)
    assert words.parameter(tracker).startswith("a variable of shape () that nothing trains")
    assert words.parameter_phrase(ParameterRef("backbone.0.weight", (4, 3), trained=False)) == \
        "frozen parameter `backbone.0.weight` (requires_grad=False)"


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


# -- counts and step numbers in words ----------------------------------------------------


def test_ctc_items_say_frames_labels_and_repeats_in_words():
    from nandoctor.detect.result import CtcItem

    assert words.ctc_items((CtcItem(3, 4, 7, 0),)) == "item 3 (4 frames for 7 labels)"
    assert words.ctc_items((CtcItem(0, 1, 1, 1),)) == "item 0 (1 frame for 1 label + 1 repeat)"
    many = tuple(CtcItem(i, 2, 5, 2) for i in range(7))
    assert words.ctc_items(many).endswith("item 4 (2 frames for 5 labels + 2 repeats), and 2 more")


def test_the_ctc_cause_is_prose_with_no_python_repr_and_agrees_in_number():
    from nandoctor.detect.result import CtcItem, CtcLengths, Detection
    from nandoctor.diagnose import build_report
    from nandoctor.report.terminal import Terminal
    from nandoctor.report.text import failure_text

    def report_for(impossible):
        facts = SiteFacts(ctc=CtcLengths((12, 4, 5), (3, 7, 9), impossible))
        site = Site("aten._ctc_loss.default", "forward", Location("asr.py", 20, "<module>", "loss = F.ctc_loss(...)"),
                    facts=facts)
        detection = Detection(StopReason.LOSS, site, site, [site])
        return build_report("asr.py", exit_code=3, detection=detection, step=0)

    one = report_for((CtcItem(1, 4, 7, 0),))
    assert one.cause.id == "ctc_infeasible"
    assert "1 batch item cannot be aligned: item 1 (4 frames for 7 labels)." in one.cause.explanation
    two = report_for((CtcItem(1, 4, 7, 0), CtcItem(2, 5, 9, 1)))
    assert "2 batch items cannot be aligned: item 1 (4 frames for 7 labels), item 2 (5 frames for 9 labels + " \
           "1 repeat)." in two.cause.explanation
    shown = Terminal(Console(file=io.StringIO(), width=100, color_system=None)).render_run(two) + failure_text(two)
    assert "{'" not in shown and "(s)" not in shown and "CtcItem" not in shown
    assert "CTC lengths: input [12, 4, 5], target [3, 7, 9]" in shown


def test_a_note_lists_the_discarded_places_the_clean_line_does_not_name():
    def site(line, count):
        return Discarded("aten.log.default", Location("m.py", line, "f", ""), "inf", count)

    assert words.discarded_notes([site(1, 3), site(2, 1)]) == []  # the clean line names them all
    notes = words.discarded_notes([site(n, 6 - n) for n in range(1, 6)])
    assert notes == ["non-finite values were also made and discarded: aten.log.default at m.py:4 (Inf, twice); "
                     "aten.log.default at m.py:5 (Inf, once)."]


def test_replay_notes_count_steps_as_the_report_does():
    from nandoctor.detect.result import WatchFinding
    from nandoctor.diagnose import replay

    # The report says "after 25 optimizer steps"; so does every replay line, never "step 26".
    assert replay.started("watch", "loss", 25, True) == (
        "watch mode: the loss went non-finite after 25 optimizer steps (the update was not applied); "
        "re-running the script under --mode trace to find the op...")
    assert "after 25 optimizer steps" in replay.reproduced("watch", "loss", 25)
    # Trace mode's own replay of an update checks inside the step; it is no switch of mode.
    assert "--mode trace" not in replay.started("trace", "parameter update", 0, False)
    assert "after 1 optimizer step;" in replay.reproduced("watch", "gradient", 1)
    finding = WatchFinding("gradient", 25, None, 1.0, float("inf"), True)
    assert "non-finite gradient after 25 optimizer steps" in replay.nonreproducible_watch(finding, True).explanation
    flagged = Site("aten.div.Tensor", "forward", None, facts=SiteFacts(device_flag="nan"))
    assert "made NaN after 25 optimizer steps" in replay.nonreproducible_flag(flagged, 25).explanation
    for text in (replay.started("watch", "loss", 25, None), replay.reproduced("trace", "value", 25)):
        assert "step 26" not in text
