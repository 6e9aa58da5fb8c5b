"""What the detector keeps does not grow with the number of steps."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from helpers import detect
from nandoctor.config import load_config
from nandoctor.detect.detector import Detector


def _sizes(detector) -> tuple[int, ...]:
    return (len(detector.records), len(detector.sites), len(detector.recorder.forward_by_node),
            len(detector.state.history.steps))


def test_state_is_flat_over_many_steps_even_with_legit_infs_every_step():
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    mask = torch.full((4, 4), float("-inf")).triu(1)  # an Inf suspect born every step
    opt = torch.optim.SGD(layer.parameters(), lr=1e-3)
    detector = Detector(dict(load_config().run, history=64))
    sizes = {}
    with detector:
        for step in range(1, 601):
            opt.zero_grad()
            F.mse_loss(layer(torch.randn(2, 4, 8), src_mask=mask), torch.zeros(2, 4, 8)).backward()
            opt.step()
            if step in (100, 600):
                sizes[step] = _sizes(detector)
    assert detector.detection is None
    assert sizes[600] == sizes[100]
    assert sizes[600][3] == 64  # the history is a window, not a log


def test_graphs_never_differentiated_do_not_pile_up(monkeypatch):
    from nandoctor.detect.provenance import NodeSites

    monkeypatch.setattr(NodeSites, "limit", 1000)
    w = torch.nn.Parameter(torch.ones(3))

    def evaluate_with_grad_on():
        for _ in range(3000):
            (w * 2).sum()

    result = detect(evaluate_with_grad_on)
    assert len(result.detector.sites) <= 2 * 1000 + 10
