"""Each format is read with its own library; planted problems are found with their key,
clean twins give nothing, and files that could run code are refused without running it."""
import csv
import sys

import numpy as np
import pytest

from checking import problems_of
from nandoctor.datacheck.readers import _read_csv_stdlib, FileContext


class CreatesMarker:
    """Unpickling this calls open(path, 'w'): the file appears only if the pickle ran."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def with_nan(shape=(10, 4), at=(3, 2), dtype=np.float32):
    a = np.random.default_rng(0).random(shape).astype(dtype)
    a[at] = np.nan
    return a


# ---- .npy / .npz ------------------------------------------------------------------------

def test_npy_with_nan_reports_count_and_position(tmp_path):
    np.save(tmp_path / "x.npy", with_nan())
    (problem,) = problems_of(tmp_path / "x.npy")
    assert (problem.check, problem.key, problem.count, problem.positions) == ("nan", None, 1, [(3, 2)])
    assert problem.file == str(tmp_path / "x.npy")


def test_clean_npy_has_no_problems(tmp_path):
    np.save(tmp_path / "x.npy", np.random.default_rng(0).random((10, 4)))
    assert problems_of(tmp_path / "x.npy") == []


def test_npy_of_pickled_objects_is_refused_and_never_unpickled(tmp_path):
    marker = tmp_path / "pwned"
    np.save(tmp_path / "evil.npy", np.array([CreatesMarker(marker)], dtype=object), allow_pickle=True)
    (problem,) = problems_of(tmp_path / "evil.npy")
    assert problem.check == "unreadable" and "pickled" in problem.detail
    assert not marker.exists()


def test_truncated_npy_is_unreadable(tmp_path):
    np.save(tmp_path / "x.npy", np.ones(1000))
    data = (tmp_path / "x.npy").read_bytes()
    (tmp_path / "x.npy").write_bytes(data[: len(data) // 2])
    assert [p.check for p in problems_of(tmp_path / "x.npy")] == ["unreadable"]


def test_npy_named_labels_is_range_checked(tmp_path):
    np.save(tmp_path / "labels.npy", np.array([0, 1, 10]))
    (problem,) = problems_of(tmp_path / "labels.npy", num_classes=10)
    assert problem.check == "label_range" and problem.positions == [(2,)]


def test_structured_npy_fields_are_checked_one_by_one(tmp_path):
    a = np.zeros(5, dtype=[("x", "f4"), ("w", "f8")])
    a["x"] = np.arange(5)
    a["w"] = np.arange(5)
    a["w"][1] = np.inf
    np.save(tmp_path / "r.npy", a)
    (problem,) = problems_of(tmp_path / "r.npy")
    assert (problem.key, problem.check, problem.positions) == ("w", "inf", [(1,)])


def test_npz_member_with_nan_is_reported_with_its_key(tmp_path):
    np.savez(tmp_path / "d.npz", images=np.random.default_rng(0).random((4, 3)), masks=with_nan())
    (problem,) = problems_of(tmp_path / "d.npz")
    assert (problem.key, problem.check, problem.positions) == ("masks", "nan", [(3, 2)])


def test_compressed_npz_is_streamed_and_checked(tmp_path):
    np.savez_compressed(tmp_path / "d.npz", a=with_nan(shape=(100, 100), at=(99, 99)))
    (problem,) = problems_of(tmp_path / "d.npz", chunk_bytes=4096)
    assert problem.positions == [(99, 99)]


def test_clean_npz_has_no_problems(tmp_path):
    np.savez(tmp_path / "d.npz", a=np.arange(6.0), b=np.arange(4))
    assert problems_of(tmp_path / "d.npz") == []


def test_npz_member_of_pickled_objects_is_refused_and_never_unpickled(tmp_path):
    marker = tmp_path / "pwned"
    np.savez(tmp_path / "d.npz", ok=np.arange(3.0), evil=np.array([CreatesMarker(marker)], dtype=object))
    (problem,) = problems_of(tmp_path / "d.npz")
    assert (problem.key, problem.check) == ("evil", "unreadable")
    assert not marker.exists()


def test_corrupt_npz_is_unreadable(tmp_path):
    (tmp_path / "d.npz").write_bytes(b"PK\x03\x04 not really a zip")
    assert [p.check for p in problems_of(tmp_path / "d.npz")] == ["unreadable"]


def test_zero_byte_file_is_empty(tmp_path):
    (tmp_path / "x.npy").write_bytes(b"")
    (problem,) = problems_of(tmp_path / "x.npy")
    assert problem.check == "empty"


# ---- torch ------------------------------------------------------------------------------

torch = pytest.importorskip("torch")


def test_checkpoint_tensor_with_nan_is_reported_with_its_nested_key(tmp_path):
    w = torch.randn(4, 4)
    w[1, 2] = float("nan")
    torch.save({"model": {"w": w, "b": torch.zeros(4)}, "epoch": 3}, tmp_path / "ckpt.pt")
    (problem,) = problems_of(tmp_path / "ckpt.pt")
    assert (problem.key, problem.check, problem.positions) == ("['model']['w']", "nan", [(1, 2)])


def test_clean_checkpoint_has_no_problems_even_with_zero_biases(tmp_path):
    torch.save(torch.nn.Linear(3, 2).state_dict() | {"bias": torch.zeros(2)}, tmp_path / "m.pth")
    assert problems_of(tmp_path / "m.pth") == []


def test_list_of_tensors_and_bfloat16_inf(tmp_path):
    t = torch.ones(3, dtype=torch.bfloat16)
    t[2] = float("inf")
    torch.save([torch.ones(2), t], tmp_path / "x.pt")
    (problem,) = problems_of(tmp_path / "x.pt")
    assert (problem.key, problem.check, problem.positions) == ("[1]", "inf", [(2,)])


def test_nan_python_number_in_checkpoint_is_reported(tmp_path):
    torch.save({"loss": float("nan")}, tmp_path / "x.pt")
    (problem,) = problems_of(tmp_path / "x.pt")
    assert (problem.key, problem.check) == ("['loss']", "nan")


def test_malicious_pickle_in_pt_is_refused_and_does_not_run(tmp_path):
    marker = tmp_path / "pwned"
    torch.save({"model": CreatesMarker(marker)}, tmp_path / "evil.pt")
    (problem,) = problems_of(tmp_path / "evil.pt")
    assert problem.check == "unreadable" and "weights_only" in problem.detail
    assert not marker.exists()


def test_legacy_non_zip_checkpoint_is_read(tmp_path):
    torch.save({"w": torch.tensor([1.0, float("nan")])}, tmp_path / "old.pt", _use_new_zipfile_serialization=False)
    (problem,) = problems_of(tmp_path / "old.pt")
    assert (problem.key, problem.check) == ("['w']", "nan")


def test_garbage_pt_is_unreadable(tmp_path):
    (tmp_path / "x.pt").write_bytes(b"\x00garbage" * 10)
    assert [p.check for p in problems_of(tmp_path / "x.pt")] == ["unreadable"]


# ---- safetensors ------------------------------------------------------------------------

def test_safetensors_tensor_with_inf_is_reported_with_its_name(tmp_path):
    st = pytest.importorskip("safetensors.torch")
    w = torch.ones(6, 3)
    w[5, 0] = float("-inf")
    st.save_file({"encoder.weight": w, "encoder.bias": torch.zeros(3)}, str(tmp_path / "m.safetensors"))
    (problem,) = problems_of(tmp_path / "m.safetensors", chunk_bytes=24)
    assert (problem.key, problem.check, problem.positions) == ("encoder.weight", "inf", [(5, 0)])


def test_clean_safetensors_has_no_problems(tmp_path):
    st = pytest.importorskip("safetensors.torch")
    st.save_file({"w": torch.randn(4, 4), "step": torch.tensor(3)}, str(tmp_path / "m.safetensors"))
    assert problems_of(tmp_path / "m.safetensors") == []


def test_corrupt_safetensors_is_unreadable(tmp_path):
    pytest.importorskip("safetensors")
    (tmp_path / "m.safetensors").write_bytes(b"\xff" * 64)
    assert [p.check for p in problems_of(tmp_path / "m.safetensors")] == ["unreadable"]


# ---- tables -----------------------------------------------------------------------------

def write_rows(path, rows, delimiter=","):
    with open(path, "w", newline="") as f:
        csv.writer(f, delimiter=delimiter).writerows(rows)


def test_csv_column_with_nan_and_empty_cells_is_reported_by_column_name(tmp_path):
    write_rows(tmp_path / "t.csv", [["id", "price", "name"], [1, 2.5, "a"], [2, "nan", "b"], [3, "", "c"]])
    (problem,) = problems_of(tmp_path / "t.csv")
    assert (problem.key, problem.check, problem.count, problem.positions) == ("price", "nan", 2, [(1,), (2,)])
    assert "empty/NA" in problem.detail


def test_csv_inf_is_reported(tmp_path):
    write_rows(tmp_path / "t.csv", [["x"], [1.0], ["inf"], [2.0]])
    (problem,) = problems_of(tmp_path / "t.csv")
    assert (problem.key, problem.check, problem.positions) == ("x", "inf", [(1,)])


def test_clean_tsv_has_no_problems(tmp_path):
    write_rows(tmp_path / "t.tsv", [["a", "b"], [1, 0.5], [2, 0.25]], delimiter="\t")
    assert problems_of(tmp_path / "t.tsv") == []


def test_csv_with_header_only_is_empty(tmp_path):
    (tmp_path / "t.csv").write_text("a,b\n")
    assert [p.check for p in problems_of(tmp_path / "t.csv")] == ["empty"]


def test_csv_constant_column_is_a_warning_check(tmp_path):
    write_rows(tmp_path / "t.csv", [["x", "std"], [1, 0.0], [2, 0.0], [3, 0.0]])
    (problem,) = problems_of(tmp_path / "t.csv")
    assert (problem.key, problem.check) == ("std", "constant")


def test_csv_label_column_outside_num_classes(tmp_path):
    write_rows(tmp_path / "t.csv", [["x", "label"], [0.1, 0], [0.2, 4], [0.3, 1]])
    (problem,) = problems_of(tmp_path / "t.csv", num_classes=4)
    assert (problem.key, problem.check, problem.positions) == ("label", "label_range", [(1,)])


def test_csv_whose_column_type_changes_after_the_first_block_is_still_checked(tmp_path):
    rows = [["x"]] + [[i % 100] for i in range(300_000)] + [["nan"], [1.5]]
    write_rows(tmp_path / "t.csv", rows)
    (problem,) = problems_of(tmp_path / "t.csv")
    assert (problem.check, problem.positions) == ("nan", [(300_000,)])


def test_csv_module_fallback_finds_nan(tmp_path):
    write_rows(tmp_path / "t.csv", [["a", "b"], [1, "x"], ["nan", "y"]])
    ctx = FileContext(str(tmp_path / "t.csv"))
    _read_csv_stdlib(ctx, ",")
    assert [(p.key, p.check) for p in ctx.problems] == [("a", "nan")]


def test_parquet_column_with_nan_is_reported_by_column_name(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    table = pa.table({"x": [1.0, 2.0, float("nan"), 4.0], "y": [1, 2, 3, 4], "s": ["a", "b", "c", "d"]})
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=2)
    (problem,) = problems_of(tmp_path / "t.parquet")
    assert (problem.key, problem.check, problem.positions) == ("x", "nan", [(2,)])


def test_parquet_with_no_rows_is_empty(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"x": pa.array([], pa.float64())}), tmp_path / "t.parquet")
    assert [p.check for p in problems_of(tmp_path / "t.parquet")] == ["empty"]


def test_feather_and_arrow_stream_are_read(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.feather as feather
    import pyarrow.ipc as ipc

    table = pa.table({"v": [1.0, float("inf"), 3.0]})
    feather.write_feather(table, tmp_path / "t.feather")
    with ipc.new_stream(str(tmp_path / "s.arrow"), table.schema) as writer:
        writer.write_table(table)
    for name in ("t.feather", "s.arrow"):
        (problem,) = problems_of(tmp_path / name)
        assert (problem.key, problem.check, problem.positions) == ("v", "inf", [(1,)]), name


# ---- images -----------------------------------------------------------------------------

Image = pytest.importorskip("PIL.Image")


def noise_image(size=(16, 12)):
    return Image.fromarray(np.random.default_rng(0).integers(0, 255, (size[1], size[0], 3), dtype=np.uint8))


def test_clean_png_has_no_problems(tmp_path):
    noise_image().save(tmp_path / "a.png")
    assert problems_of(tmp_path / "a.png") == []


def test_all_black_mask_png_is_constant(tmp_path):
    Image.fromarray(np.zeros((8, 8), dtype=np.uint8)).save(tmp_path / "0007.png")
    (problem,) = problems_of(tmp_path / "0007.png")
    assert (problem.key, problem.check, problem.count) == (None, "constant", 1)


def test_truncated_png_is_unreadable(tmp_path):
    noise_image((64, 64)).save(tmp_path / "a.png")
    data = (tmp_path / "a.png").read_bytes()
    (tmp_path / "a.png").write_bytes(data[: len(data) // 2])
    (problem,) = problems_of(tmp_path / "a.png")
    assert problem.check == "unreadable"


def test_text_file_with_jpg_extension_is_unreadable(tmp_path):
    (tmp_path / "a.jpg").write_text("hello")
    assert [p.check for p in problems_of(tmp_path / "a.jpg")] == ["unreadable"]


def test_float_tiff_with_nan_is_reported_with_pixel_position(tmp_path):
    a = np.ones((5, 6), dtype=np.float32)
    a[4, 1] = np.nan
    Image.fromarray(a, mode="F").save(tmp_path / "depth.tif")
    (problem,) = problems_of(tmp_path / "depth.tif")
    assert (problem.check, problem.positions) == ("nan", [(4, 1)])


# ---- HDF5 -------------------------------------------------------------------------------

def test_hdf5_nested_dataset_with_nan_is_reported_with_its_path(tmp_path):
    h5py = pytest.importorskip("h5py")
    with h5py.File(tmp_path / "d.h5", "w") as f:
        f["images"] = np.random.default_rng(0).random((20, 3))
        f.create_group("train")["features"] = with_nan(shape=(30, 4), at=(25, 1))
        f["names"] = np.array([b"a", b"b"])
    (problem,) = problems_of(tmp_path / "d.h5", chunk_bytes=64)
    assert (problem.key, problem.check, problem.positions) == ("/train/features", "nan", [(25, 1)])


def test_clean_hdf5_has_no_problems(tmp_path):
    h5py = pytest.importorskip("h5py")
    with h5py.File(tmp_path / "d.hdf5", "w") as f:
        f["x"] = np.arange(10.0)
        f["scalar"] = 3.0
    assert problems_of(tmp_path / "d.hdf5") == []


# ---- optional libraries -----------------------------------------------------------------

def test_missing_optional_library_gives_not_checked_with_install_hint(tmp_path, monkeypatch):
    (tmp_path / "d.h5").write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 100)
    monkeypatch.setitem(sys.modules, "h5py", None)  # makes `import h5py` raise ImportError
    (problem,) = problems_of(tmp_path / "d.h5")
    assert problem.check == "not_checked" and "pip install 'nandoctor[data]'" in problem.detail
