"""The array checks themselves: pure numpy, chunk by chunk."""
import numpy as np
import pytest

from nandoctor.datacheck.checks import CheckOptions, check_array, looks_like_label


def checks_of(findings):
    return sorted(f.check for f in findings)


def test_clean_float_array_has_no_findings():
    assert check_array(np.random.default_rng(0).standard_normal((100, 7))) == []


def test_nan_and_inf_are_counted_and_located_as_index_tuples():
    a = np.zeros((4, 5), dtype=np.float32) + np.arange(5, dtype=np.float32)
    a[1, 2] = a[3, 0] = np.nan
    a[2, 4] = np.inf
    a[0, 1] = -np.inf
    found = {f.check: f for f in check_array(a)}
    assert found["nan"].count == 2 and found["nan"].positions == [(1, 2), (3, 0)]
    assert found["inf"].count == 2 and found["inf"].positions == [(0, 1), (2, 4)]
    assert "+Inf" in found["inf"].detail and "-Inf" in found["inf"].detail


def test_positions_are_global_when_the_array_spans_many_chunks():
    a = np.ones((1000, 10))
    a[777, 3] = np.nan
    (finding,) = check_array(a, options=CheckOptions(chunk_bytes=800))
    assert finding.positions == [(777, 3)]


def test_positions_of_a_fortran_ordered_array_follow_its_indices():
    a = np.asfortranarray(np.ones((3, 4)))
    a[2, 1] = np.nan
    (finding,) = check_array(a, options=CheckOptions(chunk_bytes=16))
    assert finding.positions == [(2, 1)]


def test_strided_views_are_checked_by_rows():
    a = np.ones((50, 20))
    a[41, 6] = np.inf
    (finding,) = check_array(a[:, ::2], options=CheckOptions(chunk_bytes=64))
    assert finding.check == "inf" and finding.positions == [(41, 3)]


def test_only_the_first_max_positions_are_kept_but_all_are_counted():
    a = np.full(100, np.nan)
    (finding,) = check_array(a, options=CheckOptions(max_positions=3))
    assert finding.count == 100 and finding.positions == [(0,), (1,), (2,)]


def test_constant_float_array_is_flagged():
    assert checks_of(check_array(np.zeros((8, 8), dtype=np.float32))) == ["constant"]


def test_scalars_and_single_elements_are_never_constant():
    assert check_array(np.float32(3.0)) == []
    assert check_array(np.array([5.0])) == []


def test_integer_label_array_with_one_class_is_not_constant():
    assert check_array(np.zeros(10, dtype=np.int64), is_label=True) == []


def test_constant_is_not_added_on_top_of_nan():
    a = np.zeros(10)
    a[3] = np.nan
    assert checks_of(check_array(a)) == ["nan"]


def test_all_nan_array_is_only_nan():
    assert checks_of(check_array(np.full(10, np.nan))) == ["nan"]


def test_values_beyond_float16_range_are_a_fp16_range_finding():
    a = np.ones(10, dtype=np.float32)
    a[4] = 70000.0
    a[7] = -1e6
    (finding,) = check_array(a)
    assert finding.check == "fp16_range" and finding.count == 2 and finding.positions == [(4,), (7,)]


def test_float16_arrays_cannot_exceed_their_own_range():
    a = np.array([1.0, 65504.0, -65504.0], dtype=np.float16)
    assert check_array(a) == []


def test_float16_nan_is_found():
    a = np.array([1.0, np.nan, 2.0], dtype=np.float16)
    assert checks_of(check_array(a)) == ["nan"]


def test_empty_array_is_reported():
    (finding,) = check_array(np.zeros((0, 3)))
    assert finding.check == "empty" and "[0, 3]" in finding.detail


def test_labels_outside_num_classes_are_reported_with_positions():
    labels = np.array([0, 1, 2, 9, 1, 3])
    (finding,) = check_array(labels, is_label=True, options=CheckOptions(num_classes=3))
    assert finding.check == "label_range" and finding.count == 2
    assert finding.positions == [(3,), (5,)]
    assert "[0, 3)" in finding.detail


def test_labels_are_not_range_checked_without_num_classes():
    # -1 and 255 are common "ignore" values: without a class count no label is wrong.
    assert check_array(np.array([0, -1, 2, 255]), is_label=True) == []


def test_pytorch_ignore_index_minus_100_is_an_accepted_label():
    assert check_array(np.array([0, -100, 2, 1]), is_label=True, options=CheckOptions(num_classes=3)) == []


def test_the_configured_ignore_labels_are_accepted_and_only_those():
    options = CheckOptions(num_classes=3, ignore_labels=(-1, 255))
    assert check_array(np.array([0, -1, 2, 255]), is_label=True, options=options) == []
    (finding,) = check_array(np.array([0, -1, -100, 7]), is_label=True, options=options)
    assert finding.count == 2 and finding.positions == [(2,), (3,)]
    assert "ignored: -1, 255" in finding.detail


def test_a_dead_channel_of_an_image_batch_is_constant():
    images = np.random.default_rng(0).random((6, 3, 8, 8)).astype(np.float32)
    images[:, 2] = 0.0  # NCHW: the blue channel never saw light
    (finding,) = check_array(images)
    assert finding.check == "constant" and "channel 2 is all 0" in finding.detail and "NCHW" in finding.detail
    hwc = np.ascontiguousarray(images.transpose(0, 2, 3, 1))
    (finding,) = check_array(hwc)
    assert "channel 2 is all 0" in finding.detail and "NHWC" in finding.detail
    rgbd = np.random.default_rng(1).random((5, 16, 16, 4)).astype(np.float32)
    rgbd[..., 3] = 0.0  # 16 x 16 pictures of 4 channels: the 4 are the channels
    (finding,) = check_array(rgbd)
    assert "channel 3 is all 0" in finding.detail and "NHWC" in finding.detail


@pytest.mark.parametrize("layout", ["NCHW", "NHWC", "NCHW, Fortran order"])
@pytest.mark.parametrize("chunk_bytes", [4 * 7, 4 * 100, 1 << 20])  # chunks across channels, and whole
def test_a_dead_channel_is_found_chunk_by_chunk_wherever_the_chunks_break(layout, chunk_bytes):
    images = np.random.default_rng(0).random((6, 3, 8, 8)).astype(np.float32)
    images[:, 1] = 0.5
    if layout == "NHWC":
        images = np.ascontiguousarray(images.transpose(0, 2, 3, 1))
    elif layout.endswith("Fortran order"):
        images = np.asfortranarray(images)
    (finding,) = check_array(images, options=CheckOptions(chunk_bytes=chunk_bytes))
    assert finding.check == "constant" and finding.count == 1 and "channel 1 is all 0.5" in finding.detail


def test_near_miss_channels_that_vary_only_between_chunks_are_not_dead():
    images = np.zeros((4, 2, 8, 8), np.float32)
    images[3] = 1.0  # each channel is constant within every early chunk, not over the batch
    assert check_array(images, options=CheckOptions(chunk_bytes=4 * 64)) == []


def test_arrays_that_are_not_image_batches_have_no_channels_to_check():
    table = np.random.default_rng(0).random((6, 3, 8, 8))
    table[:, :, :, 0] = 1.0  # a constant last axis of 8 is not a channel axis
    assert check_array(table) == []
    one = np.random.default_rng(0).random((1, 3, 8, 8))
    one[:, 1] = 0.0  # a single image: a colour can be absent from one picture
    assert check_array(one) == []


def test_integers_not_named_as_labels_are_not_range_checked():
    assert check_array(np.array([0, -1, 2])) == []


def test_label_names_are_recognised():
    for name in ["label", "labels", "y", "y_train", "target", "['targets']", "/data/class_ids", "[1]['label']"]:
        assert looks_like_label(name), name
    for name in ["image", "x", "weights", "mask", None, ""]:
        assert not looks_like_label(name), name


def test_complex_arrays_are_checked_for_nan():
    a = np.ones(4, dtype=np.complex64)
    a[2] = complex(np.nan, 0)
    assert checks_of(check_array(a)) == ["nan"]


def test_bool_mask_with_one_value_is_constant():
    assert checks_of(check_array(np.zeros((4, 4), dtype=bool))) == ["constant"]


def test_one_value_beyond_float16_or_one_bad_label_is_singular():
    a = np.array([1.0, 2.0, 70000.0], dtype=np.float32)
    detail = {f.check: f.detail for f in check_array(a)}["fp16_range"]
    assert detail.startswith("1 finite value beyond") and "values beyond" not in detail
    labels = {f.check: f.detail for f in check_array(np.array([0, 1, 7]), is_label=True,
                                                      options=CheckOptions(num_classes=3))}
    assert labels["label_range"].startswith("1 label outside")


def test_a_single_non_finite_scalar_has_no_position_to_name():
    detail = {f.check: f.detail for f in check_array(np.array(np.nan, dtype=np.float32))}["nan"]
    assert "first at []" not in detail
