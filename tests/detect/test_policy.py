"""When a non-finite op output stops the run, and when it is only a suspect."""
from __future__ import annotations

import pytest
import torch

from nandoctor.detect.policy import op_verdict
from nandoctor.detect.result import StopReason

STOP_F16 = {torch.float16}


@pytest.mark.parametrize("phase, has_nan, dtype, intended, verdict", [
    ("forward", True, torch.float32, False, StopReason.OP_MADE_NAN),
    ("data", True, torch.float32, False, StopReason.OP_MADE_NAN),
    ("forward", False, torch.float32, False, None),  # an Inf is a suspect until it matters
    ("forward", False, torch.float16, False, StopReason.OP_MADE_INF),  # ...unless its dtype is listed
    ("optimizer", False, torch.float32, False, StopReason.OP_MADE_INF),  # an Inf in optimizer state matters
    ("backward", True, torch.float32, False, None),  # autograd masks NaN/Inf internally: gradients decide
    ("forward", False, torch.float16, True, None),  # a -inf mask written on purpose
])
def test_op_verdict(phase, has_nan, dtype, intended, verdict):
    assert op_verdict(phase, has_nan, dtype, intended, STOP_F16) is verdict
