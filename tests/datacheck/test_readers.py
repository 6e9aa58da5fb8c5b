"""Each format is read with its own library; planted problems are found with their key,
clean twins give nothing, and files that could run code are refused without running it."""
import csv
import sys
import warnings

import numpy as np
import pytest

from checking import problems_of
from nandoctor.datacheck.readers import READERS, _read_csv_stdlib, FileContext


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


# ---- files that are not what their name says --------------------------------------------

# The library each extension needs beyond numpy and torch (its file is `not_checked` without it).
NEEDS = {".safetensors": "safetensors", ".parquet": "pyarrow", ".feather": "pyarrow", ".arrow": "pyarrow",
         ".ipc": "pyarrow", ".h5": "h5py", ".hdf5": "h5py", ".png": "PIL", ".jpg": "PIL", ".jpeg": "PIL",
         ".bmp": "PIL", ".tif": "PIL", ".tiff": "PIL", ".webp": "PIL"}
LFS_POINTER = ("version https://git-lfs.github.com/spec/v1\n"
               "oid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\n"
               "size 12345\n")


def only_problem(path):
    (problem,) = problems_of(path)
    return problem


@pytest.mark.parametrize("ext", sorted(READERS))
def test_git_lfs_pointer_is_named_as_such_in_every_format(tmp_path, ext):
    if ext in NEEDS:
        pytest.importorskip(NEEDS[ext])
    (tmp_path / f"data{ext}").write_text(LFS_POINTER)
    problem = only_problem(tmp_path / f"data{ext}")
    assert problem.check == "unreadable"
    assert problem.detail == "a Git LFS pointer, not the data (the real file is 12,345 bytes): run `git lfs pull`"


def test_html_page_saved_under_a_data_name_is_named_as_such(tmp_path):
    for name in ("train.npz", "train.csv"):
        (tmp_path / name).write_text("<!DOCTYPE html>\n<html><head><title>Sign in</title></head></html>\n")
        problem = only_problem(tmp_path / name)
        assert (problem.check, problem.detail.split(" (")[0]) == ("unreadable", "an HTML page, not the data"), name


@pytest.mark.parametrize("ext", [".npy", ".npz", ".pt", ".pth", ".safetensors", ".h5", ".parquet", ".feather", ".png"])
def test_text_named_like_a_data_file_is_not_valid_and_shows_its_first_line(tmp_path, ext):
    if ext in NEEDS:
        pytest.importorskip(NEEDS[ext])
    (tmp_path / f"x{ext}").write_text("hello, this is not data\nsecond line\n")
    problem = only_problem(tmp_path / f"x{ext}")
    assert problem.check == "unreadable"
    assert problem.detail == f"not a valid {ext} file (starts with the text 'hello, this is not data')"


@pytest.mark.parametrize("ext", [".npy", ".npz", ".pt", ".safetensors", ".h5", ".parquet", ".feather"])
def test_random_bytes_named_like_a_data_file_are_not_valid_and_shown_in_hex(tmp_path, ext):
    if ext in NEEDS:
        pytest.importorskip(NEEDS[ext])
    (tmp_path / f"x{ext}").write_bytes(bytes([0x3f, 0xa2, 0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66]) * 20)
    problem = only_problem(tmp_path / f"x{ext}")
    assert problem.check == "unreadable"
    assert problem.detail == f"not a valid {ext} file (starts with bytes 3f a2 00 11 22 33 44 55 ...)"


def test_text_npy_is_no_longer_called_pickled_objects(tmp_path):
    # np.load tries anything without the .npy magic as a pickle, and refused it as "pickled
    # Python objects": the magic is looked at first.
    (tmp_path / "x.npy").write_text("1.0 2.0 3.0\n")
    assert "pickled" not in only_problem(tmp_path / "x.npy").detail


def test_a_known_format_under_the_wrong_name_is_named(tmp_path):
    import gzip

    (tmp_path / "table.csv").write_bytes(gzip.compress(b"x,y\n1,2\n"))
    np.savez(tmp_path / "arrays.npz", a=np.arange(3.0))
    (tmp_path / "arrays.npz").rename(tmp_path / "arrays.npy")
    assert only_problem(tmp_path / "table.csv").detail.endswith(": gzip-compressed data)")
    assert only_problem(tmp_path / "arrays.npy").detail.endswith(": a zip archive)")


def test_a_damaged_file_of_the_right_format_keeps_the_librarys_own_words(tmp_path):
    np.savez(tmp_path / "d.npz", a=np.arange(1000.0))
    data = (tmp_path / "d.npz").read_bytes()
    (tmp_path / "d.npz").write_bytes(data[: len(data) // 2])  # starts like a zip, ends nowhere
    assert only_problem(tmp_path / "d.npz").detail == "not a valid .npz (zip) archive: File is not a zip file"


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


def test_numpy_arrays_and_scalars_in_a_checkpoint_are_checked_like_tensors(tmp_path):
    y = np.ones((3, 2))
    y[2, 1] = np.inf
    torch.save({"x": np.arange(3.0), "y": y, "step": np.int64(7), "loss": np.float32("nan"),
                "w": torch.ones(2)}, tmp_path / "mixed.pt")
    found = {(p.key, p.check, tuple(p.positions)) for p in problems_of(tmp_path / "mixed.pt")}
    assert found == {("['y']", "inf", ((2, 1),)), ("['loss']", "nan", ((),))}


def test_checkpoint_with_numpy_1_names_is_read(tmp_path):
    # numpy 1.x pickles its arrays as numpy.core.multiarray._reconstruct, numpy 2 as numpy._core.
    import zipfile

    torch.save({"x": np.array([1.0, np.nan])}, tmp_path / "new.pt")
    with zipfile.ZipFile(tmp_path / "new.pt") as new, zipfile.ZipFile(tmp_path / "old.pt", "w") as old:
        for member in new.infolist():
            data = new.read(member)
            if member.filename.endswith("data.pkl"):
                assert b"numpy._core.multiarray" in data
                data = data.replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
            old.writestr(member.filename, data)
    (problem,) = problems_of(tmp_path / "old.pt")
    assert (problem.key, problem.check, problem.positions) == ("['x']", "nan", [(1,)])


class RunsNumpyCode:
    """A numpy function that runs code on unpickling: allowing numpy arrays must not allow it."""

    def __init__(self, path):
        self.code = f"open({str(path)!r}, 'w').close()"

    def __reduce__(self):
        from numpy.testing._private.utils import runstring

        return (runstring, (self.code, {}))


@pytest.mark.parametrize("evil", [CreatesMarker, RunsNumpyCode])
def test_numpy_allow_list_still_refuses_any_other_global_next_to_arrays(tmp_path, evil):
    marker = tmp_path / "pwned"
    torch.save({"x": np.arange(3.0), "payload": evil(marker)}, tmp_path / "evil.pt")
    problem = only_problem(tmp_path / "evil.pt")
    assert problem.check == "unreadable" and "refused by torch.load(weights_only=True)" in problem.detail
    assert "Unsupported global" in problem.detail
    assert not marker.exists()


def test_numpy_array_of_python_objects_in_a_checkpoint_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    torch.save({"o": np.array([CreatesMarker(marker), 1], dtype=object)}, tmp_path / "obj.pt")
    problem = only_problem(tmp_path / "obj.pt")
    assert (problem.check, problem.detail.split(";")[0]) == (
        "unreadable", "holds a numpy array of Python objects (object dtype)")
    assert not marker.exists()


def test_reading_a_checkpoint_leaves_torchs_allow_list_as_it_was(tmp_path):
    torch.save({"x": np.arange(3.0)}, tmp_path / "x.pt")
    # torch keeps the allow-list as a set: restoring it may list the same entries in another order.
    before = set(torch.serialization.get_safe_globals())
    assert problems_of(tmp_path / "x.pt") == []
    assert set(torch.serialization.get_safe_globals()) == before
    with pytest.raises(Exception, match="numpy"):  # the user's own torch.load is as strict as before
        torch.load(tmp_path / "x.pt", weights_only=True)


def test_torch_warnings_about_itself_do_not_escape_while_reading(tmp_path, monkeypatch):
    # torch warns about TypedStorage once per process: every time here, whatever ran before.
    monkeypatch.setattr(torch.storage, "_always_warn_typed_storage_removal", True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # making these tensors warns too
        torch.save({"q": torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.qint8),  # TypedStorage
                    "c": torch.ones(3, dtype=torch.complex32),  # ComplexHalf is experimental
                    "csr": torch.eye(3).to_sparse_csr(),  # sparse CSR is beta
                    "nested": torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]),  # prototype
                    "w": torch.ones(2)}, tmp_path / "odd.pt")
    filters = list(warnings.filters)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        problems_of(tmp_path / "odd.pt")
    assert [str(w.message) for w in caught] == []
    assert warnings.filters == filters


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


def test_csv_column_with_every_cell_empty_or_nan_is_all_nan(tmp_path):
    # Arrow cannot type such a column; pandas reads it as float NaN, and so does training.
    write_rows(tmp_path / "t.csv", [["x", "notes", "score"], [1, "", "NaN"], [2, "", "NaN"]])
    found = {(p.key, p.check, p.count) for p in problems_of(tmp_path / "t.csv")}
    assert found == {("notes", "nan", 2), ("score", "nan", 2)}


def test_json_lines_nan_and_infinity_are_reported_by_field_path(tmp_path):
    # json.dumps writes NaN and Infinity; HF-style exports nest fields and lists.
    (tmp_path / "d.jsonl").write_text(
        '{"text": "a", "score": 0.5, "meta": {"w": 1.0}, "emb": [0.1, 0.2]}\n'
        '{"text": "b", "score": NaN, "meta": {"w": 1.0}, "emb": [Infinity, 0.3]}\n\n'
        '{"text": "c", "score": 0.7, "meta": {"w": 1.0}, "emb": [0.4, 0.5]}\n')
    found = {(p.key, p.check, p.count) for p in problems_of(tmp_path / "d.jsonl")}
    assert found == {("score", "nan", 1), ("emb", "inf", 1)}  # a field constant by design is no problem


def test_a_json_lines_file_with_a_broken_line_is_unreadable_and_says_which(tmp_path):
    (tmp_path / "d.jsonl").write_text('{"x": 1}\n{"x": \n')
    (problem,) = problems_of(tmp_path / "d.jsonl")
    assert problem.check == "unreadable" and "line 2" in problem.detail


JSON_RECORDS = ('[{"text": "a", "score": 0.5, "emb": [0.1, 0.2]},'
                ' {"text": "b", "score": NaN, "emb": [Infinity, 0.3]},'
                ' {"text": "c", "score": 0.7, "emb": [0.4, 0.5]}]')


@pytest.mark.parametrize("document", [
    JSON_RECORDS,  # df.to_json(orient="records"), an exported dataset
    '{"train": %s}' % JSON_RECORDS,  # records under a split's name
    '{"score": [0.5, NaN, 0.7], "emb": [[0.1, 0.2], [Infinity, 0.3], [0.4, 0.5]]}',  # columns
])
def test_a_json_document_of_records_or_columns_is_checked_as_json_lines_are(tmp_path, document):
    (tmp_path / "d.json").write_text(document)
    found = {(p.key.split(".")[-1], p.check, p.count) for p in problems_of(tmp_path / "d.json")}
    assert found == {("score", "nan", 1), ("emb", "inf", 1)}


def test_near_miss_a_finite_json_config_beside_the_data_has_no_problems(tmp_path):
    (tmp_path / "config.json").write_text('{"num_classes": 10, "mean": [0.485, 0.456, 0.406], "name": "x"}')
    assert problems_of(tmp_path / "config.json") == []


def test_a_broken_json_document_is_unreadable_and_says_where(tmp_path):
    (tmp_path / "d.json").write_text('{"x": [1, 2,')
    (problem,) = problems_of(tmp_path / "d.json")
    assert problem.check == "unreadable" and "column 13" in problem.detail


def test_a_dead_band_of_images_inside_an_npz_is_found_as_in_an_npy(tmp_path):
    tiles = np.random.default_rng(0).random((16, 4, 16, 16)).astype(np.float32)
    tiles[:, 3] = 0.0  # a band the export never wrote
    np.savez(tmp_path / "tiles.npz", images=tiles, labels=np.arange(16))
    (problem,) = problems_of(tmp_path / "tiles.npz", chunk_bytes=4096)
    assert (problem.key, problem.check) == ("images", "constant") and "channel 3 is all 0" in problem.detail


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


def test_nested_parquet_columns_are_checked_field_by_field_and_value_by_value(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    table = pa.table({
        "embedding": pa.array([[0.1, 0.2], [0.3, float("nan")], [0.5, 0.6]], pa.list_(pa.float32())),
        "pair": pa.array([[1.0, 2.0], [3.0, 4.0], [float("inf"), 6.0]], pa.list_(pa.float64(), 2)),
        "meta": pa.array([{"score": 1.0, "tag": "a"}, {"score": float("nan"), "tag": "b"}, {"score": 3.0, "tag": "c"}]),
    })
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=2)
    found = {(p.key, p.check, tuple(p.positions)) for p in problems_of(tmp_path / "t.parquet")}
    assert found == {("embedding[]", "nan", ((3,),)), ("pair[]", "inf", ((4,),)), ("meta.score", "nan", ((1,),))}


def test_near_miss_finite_nested_parquet_columns_are_clean(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    table = pa.table({"embedding": pa.array([[0.1, 0.2], [0.3, 0.4]], pa.list_(pa.float32())),
                      "meta": pa.array([{"score": 1.0}, {"score": 2.0}])})
    pq.write_table(table, tmp_path / "t.parquet")
    assert problems_of(tmp_path / "t.parquet") == []


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


def test_a_class_index_mask_in_a_labels_folder_is_range_checked_with_num_classes(tmp_path):
    (tmp_path / "labels").mkdir()
    mask = np.zeros((8, 8), dtype=np.uint8)
    mask[2, 3] = 25  # a class the model does not have
    mask[4:, :] = 7
    Image.fromarray(mask).save(tmp_path / "labels" / "0001.png")
    (problem,) = problems_of(tmp_path / "labels" / "0001.png", num_classes=21)
    assert (problem.check, problem.count, problem.positions) == ("label_range", 1, [(2, 3)])
    (tmp_path / "SegmentationClass").mkdir()  # VOC's folder, 255 its void border
    Image.fromarray(np.where(mask == 25, 255, mask).astype(np.uint8)).save(tmp_path / "SegmentationClass" / "a.png")
    (problem,) = problems_of(tmp_path / "SegmentationClass" / "a.png", num_classes=21)
    assert problem.check == "label_range" and "ignored: -100" in problem.detail
    # The same picture as a photo's grey channel is no label, and without a class count
    # nothing says what a label may be.
    Image.fromarray(mask).save(tmp_path / "grey.png")
    assert problems_of(tmp_path / "grey.png", num_classes=21) == []
    assert problems_of(tmp_path / "labels" / "0001.png") == []


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


def test_hdf5_compound_dataset_fields_are_checked_one_by_one(tmp_path):
    h5py = pytest.importorskip("h5py")
    records = np.zeros(6, dtype=[("x", "f4"), ("xyz", "f8", (3,)), ("name", "S4")])
    records["x"], records["xyz"] = np.arange(6), np.arange(18).reshape(6, 3)
    records["x"][4] = np.nan
    records["xyz"][2, 1] = -np.inf
    with h5py.File(tmp_path / "d.h5", "w") as f:
        f["table"] = records
        f["clean"] = np.array([(1.0,), (2.0,), (3.0,)], dtype=[("y", "f4")])
    found = {(p.key, p.check, tuple(p.positions)) for p in problems_of(tmp_path / "d.h5", chunk_bytes=64)}
    assert found == {("/table.x", "nan", ((4,),)), ("/table.xyz", "inf", ((2, 1),))}


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


# ---- numbers in text ---------------------------------------------------------------------

def _csv_with_a_stray_cell(tmp_path, rows: int, stray: str | None, at: int):
    """A numeric `price` column with one cell `stray` at data row `at`, beside a text column."""
    pytest.importorskip("pyarrow")
    path = tmp_path / "t.csv"
    with open(path, "w") as f:
        f.write("name,price\n")
        for i in range(rows):
            price = stray if i == at and stray is not None else f"{1.5 + i % 7}"
            f.write(f"item{i},{price}\n")
    return path


@pytest.mark.parametrize("rows, at", [(3, 1), (200_000, 150_000)])  # (in the first block, and far past it)
def test_a_stray_cell_in_a_column_of_numbers_is_named_and_the_rest_still_checked(tmp_path, rows, at):
    path = _csv_with_a_stray_cell(tmp_path, rows, "?", at)
    (problem,) = problems_of(path)
    assert (problem.key, problem.check, problem.count, problem.positions) == ("price", "non_numeric", 1, [(at,)])
    assert "'?'" in problem.detail


def test_a_nan_beside_the_stray_cell_is_still_found(tmp_path):
    pytest.importorskip("pyarrow")
    (tmp_path / "t.csv").write_text("name,price\na,1.5\nb,?\nc,nan\nd,2.5\ne,3.0\n")
    found = {(p.key, p.check, tuple(p.positions)) for p in problems_of(tmp_path / "t.csv")}
    assert found == {("price", "non_numeric", ((1,),)), ("price", "nan", ((2,),))}


def test_near_miss_a_text_column_is_text_not_numbers_with_stray_cells(tmp_path):
    path = _csv_with_a_stray_cell(tmp_path, 20, None, 0)
    assert problems_of(path) == []  # (`name`: item0, item1, ... is text)


# ---- constant columns of a table --------------------------------------------------------

def _features(constant_column: int | None, rows: int = 100, columns: int = 8):
    x = np.random.default_rng(0).normal(size=(rows, columns)).astype(np.float32)
    if constant_column is not None:
        x[:, constant_column] = 2.0
    return x


@pytest.mark.parametrize("ext", [".npy", ".npz", ".h5"])
def test_a_constant_feature_column_of_a_table_is_named(tmp_path, ext):
    path = tmp_path / f"features{ext}"
    if ext == ".npy":
        np.save(path, _features(3))
    elif ext == ".npz":
        np.savez(path, x=_features(3))
    else:
        h5py = pytest.importorskip("h5py")
        with h5py.File(path, "w") as f:
            f["x"] = _features(3)
    (problem,) = problems_of(path, chunk_bytes=256)
    assert (problem.check, problem.count, problem.positions) == ("constant", 1, [(0, 3)])
    assert "column 3 is all 2" in problem.detail


def test_near_miss_a_one_hot_label_matrix_with_an_absent_class_is_no_table_of_features(tmp_path):
    y = np.eye(4, dtype=np.float32)[np.random.default_rng(0).integers(0, 3, 50)]  # class 3 never present
    np.save(tmp_path / "labels.npy", y)
    assert problems_of(tmp_path / "labels.npy") == []


def test_near_miss_a_checkpoints_weight_with_a_zero_column_is_no_table(tmp_path):
    import torch

    weight = torch.randn(6, 4)
    weight[:, 2] = 0.0  # a pruned input
    torch.save({"fc.weight": weight}, tmp_path / "model.pt")
    assert problems_of(tmp_path / "model.pt") == []
