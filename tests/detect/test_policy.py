"""When a non-finite op output stops the run, and when it is only a suspect."""
from __future__ import annotations

import pytest
import torch

from nandoctor.detect.policy import an_overflow, op_verdict
from nandoctor.detect.result import StopReason

STOP_F16 = {torch.float16}


@pytest.mark.parametrize("phase, has_nan, has_inf, dtype, accepted, writes_parameter, verdict", [
    # A NaN or an Inf in forward or data is a suspect until it reaches something that matters.
    ("forward", True, False, torch.float32, False, False, None),
    ("data", True, False, torch.float32, False, False, None),
    ("forward", False, True, torch.float32, False, False, None),
    # ...a float16 overflow too (it stops where it is absorbed unhandled: see below),
    ("forward", False, True, torch.float16, False, False, None),
    ("forward", True, False, torch.float16, False, False, None),
    # ...unless it is made inside the optimizer, or written into a parameter or buffer.
    ("optimizer", False, True, torch.float32, False, False, StopReason.OP_MADE_INF),
    ("optimizer", True, True, torch.float32, False, False, StopReason.OP_MADE_NAN),
    ("init", True, False, torch.float32, False, True, StopReason.PARAMETER_WRITTEN),
    # Autograd masks NaN/Inf inside its formulas: the gradients decide.
    ("backward", True, False, torch.float32, False, False, None),
    # A -inf mask written on purpose, or a line the user allowed.
    ("forward", False, True, torch.float16, True, False, None),
])
def test_op_verdict(phase, has_nan, has_inf, dtype, accepted, writes_parameter, verdict):
    assert op_verdict(phase, has_nan, has_inf, dtype, accepted=accepted, writes_parameter=writes_parameter) is verdict


@pytest.mark.parametrize("phase, has_inf, dtype, overflow", [
    ("forward", True, torch.float16, True),  # an Inf in a dtype listed to stop on
    ("data", True, torch.float16, True),
    ("forward", False, torch.float16, False),  # (a NaN in float16 is a suspect like any other)
    ("forward", True, torch.float32, False),
    ("backward", True, torch.float16, False),  # (a GradScaler's scaled gradients overflow on purpose)
])
def test_an_overflow_is_an_inf_of_a_listed_dtype_outside_backward(phase, has_inf, dtype, overflow):
    assert an_overflow(phase, has_inf, dtype, STOP_F16) is overflow
