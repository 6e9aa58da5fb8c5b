"""The record table (detect/records.py): which record a tensor's values have, by the part of
its storage the tensor looks at."""
from __future__ import annotations

import torch

from nandoctor.detect.records import Record, RecordTable


def record(op: str) -> Record:
    return Record(op=op, phase="forward", where=None, module=None, backward_node=None, node_seq=None, step=None,
                  output=None, inputs=[], parents=[], has_nan=True)


def test_slices_of_one_tensor_written_separately_keep_their_own_records():
    data = torch.zeros(10, 3)
    train, val = data[:6], data[6:]
    table, first, second = RecordTable(), record("train"), record("val")
    table.put(train[:, 1], first)
    table.put(val[:, 1], second)
    assert table.get(train) is first and table.get(val) is second
    assert table.all_of(data) == [first, second]  # the whole tensor holds both


def test_a_write_over_a_whole_region_replaces_the_records_inside_it():
    data = torch.zeros(10, 3)
    table, old, new = RecordTable(), record("old"), record("new")
    table.put(data[:6], old)
    table.put(data, new)
    assert table.all_of(data[:2]) == [new]


def test_views_of_a_recorded_value_share_its_one_entry():
    mask = torch.zeros(4, 4)
    table, written = RecordTable(), record("mask")
    table.put(mask, written)
    table.put(mask.t(), written)
    table.put(mask[1:], written)
    assert table.all_of(mask) == [written] and table.get(mask[0]) is written


def test_forgetting_a_slice_overwritten_with_finite_values_keeps_the_others():
    data = torch.zeros(10)
    table, left, right = RecordTable(), record("left"), record("right")
    table.put(data[:5], left)
    table.put(data[5:], right)
    table.forget(data[:5])
    assert table.get(data[:5]) is None and table.get(data) is right



def test_a_slice_outside_every_recorded_region_has_no_record():
    data = torch.zeros(10)
    table = RecordTable()
    table.put(data[5:], record("right"))
    assert table.get(data[:5]) is None and table.all_of(data[:5]) == []


def test_a_second_write_over_the_whole_tensor_replaces_the_first():
    data = torch.zeros(4)
    table, old, new = RecordTable(), record("old"), record("new")
    table.put(data, old)
    table.put(data, new)
    assert table.all_of(data) == [new] and table.get(data[1:]) is new


def test_forgetting_the_whole_tensor_forgets_its_record():
    grad = torch.zeros(3)
    table = RecordTable()
    table.put(grad, record("inf gradient"))
    table.forget(grad)  # zero_grad(set_to_none=False): zeroed in place
    assert table.get(grad) is None and not table
