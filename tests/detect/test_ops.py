"""Op classification (detect/ops.py): which non-finite values an op writes on purpose."""
from __future__ import annotations

import torch

from helpers import detect, read_back


def test_a_minus_inf_scalar_tensor_written_by_a_mask_is_intended():
    def attention():
        scores = torch.randn(4, 4)
        mask = torch.ones(4, 4, dtype=torch.bool).triu(1)
        weights = torch.softmax(torch.where(mask, torch.tensor(float("-inf")), scores), dim=-1)
        read_back(weights)

    assert not detect(attention).stopped


def test_a_zero_d_tensor_an_op_made_non_finite_is_carried_through_where_not_written_on_purpose():
    # Keras's divide_no_nan: where(divisor == 0, 0, loss / divisor) over a loss that is inf.
    def loss_reduction():
        total = torch.tensor([1.0, 2.0]).sum() / torch.tensor(0.0)
        divisor = torch.tensor(64.0)
        mean = torch.where(divisor == 0, torch.tensor(0.0), total / divisor)
        read_back(mean)

    found = detect(loss_reduction)
    assert found.stopped
    assert found.detection.root.op == "aten.div.Tensor"
    assert not found.detection.root.facts.inf_written_at


def test_a_minus_inf_scalar_tensor_that_was_written_on_purpose_stays_a_mask_through_where():
    # nn.MultiheadAttention builds its float mask as where(causal, scalar_tensor(-inf), 0).
    from nandoctor.detect.ops import writes_nonfinite_scalar

    from nandoctor.detect.records import Record
    from nandoctor.detect.result import SiteFacts

    def record(written_on_purpose: bool) -> Record:
        return Record(op="aten.scalar_tensor.default", phase="forward", where=None, module=None, backward_node=None,
                      node_seq=None, step=None, output=None, inputs=[], parents=[], has_nan=False,
                      intended=True, facts=SiteFacts(written_on_purpose=written_on_purpose))

    minus_inf = torch.tensor(float("-inf"))
    mask_record, made_record = record(True), record(False)  # (an allowed line's value is intended too)
    args = (torch.ones(2, dtype=torch.bool), minus_inf, torch.tensor(0.0))
    assert writes_nonfinite_scalar(torch.ops.aten.where.self, args, {}, lambda t: mask_record if t is minus_inf else None)
    assert not writes_nonfinite_scalar(torch.ops.aten.where.self, args, {}, lambda t: made_record if t is minus_inf else None)


def test_finite_preserving_ops_and_widening_casts_are_decided_once_and_narrowing_casts_are_checked():
    from nandoctor.detect.ops import OpKind, cast_widens, op_kind

    aten = torch.ops.aten
    assert op_kind(aten.tanh.default) is OpKind.FINITE_PRESERVING
    assert op_kind(aten._softmax.default) is OpKind.FINITE_PRESERVING
    assert op_kind(aten.exp.default) is OpKind.CHECKED  # exp(89) overflows float32
    assert op_kind(aten.gelu_backward.default) is OpKind.CHECKED  # a gradient times a factor can overflow
    assert op_kind(aten._to_copy.default) is OpKind.CAST
    bf16 = torch.ones(2, dtype=torch.bfloat16)
    assert cast_widens((bf16,), {"dtype": torch.float32})
    assert cast_widens((torch.ones(2),), {})  # a device copy, same dtype
    assert not cast_widens((torch.ones(2),), {"dtype": torch.float16})  # 70000.0 -> inf


def test_a_narrowing_cast_that_overflows_float16_is_the_root():
    def cast():
        read_back(torch.tensor([70000.0, 1.0]).mul(2).half())

    found = detect(cast)
    assert found.stopped and found.detection.root.op == "aten._to_copy.default"


def test_a_finite_preserving_op_over_a_recorded_mask_is_still_checked():
    # softmax of finite values is finite; of an all -inf row it is NaN: that row is the root.
    def attention():
        padding = torch.tensor([[False, True], [True, True]])
        read_back(torch.softmax(torch.randn(2, 2).masked_fill(padding, float("-inf")), -1))

    found = detect(attention)
    assert found.stopped and found.detection.root.op == "aten._softmax.default"


def test_near_miss_a_widening_cast_of_a_recorded_nan_carries_it_to_the_root():
    def upcast():
        half = torch.log(torch.tensor([-1.0, 1.0])).bfloat16()
        read_back(half.float())

    found = detect(upcast)
    assert found.stopped and found.detection.root.op == "aten.log.default"


def test_profiler_marks_are_run_and_nothing_else():
    # optimizer.step() and zero_grad() open a record_function each: two ops that make no
    # tensor, and that a profiler running under nandoctor still sees.
    from nandoctor.detect.ops import OpKind, op_kind

    assert op_kind(torch.ops.profiler._record_function_enter_new.default) is OpKind.NOT_TENSOR_MATH
    assert op_kind(torch.ops.profiler._record_function_exit._RecordFunction) is OpKind.NOT_TENSOR_MATH
    w = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([w], lr=0.1)

    def train():
        with torch.profiler.profile() as prof:
            for _ in range(2):
                opt.zero_grad()
                (w * 2).sum().backward()
                opt.step()
        assert any(e.name.startswith("Optimizer.step#SGD") for e in prof.events())

    assert not detect(train).stopped


def test_a_ctc_loss_workspace_is_not_taken_for_values_the_op_made():
    # _ctc_loss returns its loss and log_alpha, a workspace kept for backward that is
    # `empty()` past each sequence's input length. Here the allocator is handed NaN-filled
    # memory just before, so that garbage is NaN: a healthy CTC step makes nothing.
    import torch.nn.functional as F

    T, N, C, S = 60, 4, 6, 3
    torch.manual_seed(0)
    log_probs = torch.randn(T, N, C).log_softmax(2).requires_grad_()
    targets = torch.randint(1, C, (N, S))
    input_lengths, target_lengths = torch.tensor([T, 10, 10, 10]), torch.full((N,), S)

    def train():
        for _ in range(3):
            torch.full((N, T, 2 * S + 1), float("nan"))  # freed at once: its memory comes back
            loss = F.ctc_loss(log_probs, targets, input_lengths, target_lengths)
            loss.backward()
            read_back(loss)

    detected = detect(train)
    assert not detected.stopped and detected.detector.discarded() == []


def test_a_nan_torch_writes_inside_its_own_function_is_made_there_not_written_on_purpose():
    # torch.logdet is where(sign < 0, scalar_tensor(nan), logabsdet): NaN for a negative
    # determinant, made by the function the line called (whose line is the root).
    def loss():
        a = torch.diag(torch.tensor([1.0, -2.0, 3.0]))
        read_back(torch.logdet(a) * 2)  # MARK-logdet

    found = detect(loss)
    assert found.stopped and not found.detection.root.facts.written_on_purpose
    assert "MARK-logdet" in found.detection.root.location.code


def test_near_miss_a_nan_placeholder_the_script_fills_in_is_written_on_purpose():
    def per_class_recall():
        recall = torch.full((3,), float("nan"))
        recall[0], recall[2] = 0.5, 0.75
        print(recall.tolist(), torch.nanmean(recall).item())

    assert not detect(per_class_recall).stopped


def test_an_op_that_returns_nothing_is_checked_by_the_arguments_its_schema_writes():
    from nandoctor.detect.ops import written_arguments

    params, grads = [torch.zeros(2), torch.zeros(3)], [torch.ones(2), torch.ones(3)]
    state = [[torch.zeros(2), torch.zeros(3)] for _ in range(3)] + [[torch.zeros(()), torch.zeros(())]]
    fused = torch.ops.aten._fused_adamw_.default
    written = written_arguments(fused, (params, grads, *state))
    assert [w is p for w, p in zip(written, params)] == [True, True]  # the parameters first
    assert all(any(w is s for w in written) for s in state[0])  # then the state it updates
    assert not any(w is s for w in written for s in state[3])  # not the step counts it only reads
    assert written_arguments(torch.ops.aten._foreach_add_.Scalar, (params, 1.0)) == params
    assert written_arguments(torch.ops.aten.add.Tensor, (params[0], params[0])) is None


def _fused_adamw_training(eps: float):
    """AdamW's fused kernel, as Hugging Face's Trainer picks by default: with eps=0 the
    embedding rows that never get a gradient divide 0 by sqrt(0)."""
    def train():
        torch.manual_seed(0)
        emb, head = torch.nn.Embedding(20, 4), torch.nn.Linear(4, 1)
        opt = torch.optim.AdamW([*emb.parameters(), *head.parameters()], lr=1e-3, eps=eps, fused=True)
        for _ in range(2):
            loss = head(emb(torch.randint(0, 5, (8,)))).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()

    return train


def test_a_fused_optimizer_step_checked_op_by_op_names_its_kernel():
    found = detect(_fused_adamw_training(eps=0.0), check_optimizer_ops=True)
    assert found.stopped
    root = found.detection.root
    assert (root.op, root.phase) == ("aten._fused_adamw_.default", "optimizer")


def test_near_miss_a_fused_optimizer_step_with_a_valid_eps_runs_clean_op_by_op():
    assert not detect(_fused_adamw_training(eps=1e-8), check_optimizer_ops=True).stopped
