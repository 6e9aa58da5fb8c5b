"""`FILE.py:NAME` and `module:NAME` targets: every sample is checked; the user's training
code under `if __name__ == "__main__":` never runs."""
import sys
import textwrap

import pytest

from nandoctor.datacheck.checks import CheckOptions
from nandoctor.datacheck.pydataset import check_dataset, parse_target
from nandoctor.errors import UsageError

pytest.importorskip("torch")

HEADER = """
import torch
from torch.utils.data import Dataset, IterableDataset
"""


def write(tmp_path, body, name="train.py"):
    path = tmp_path / name
    path.write_text(HEADER + textwrap.dedent(body))
    return path


def check(target_text, **options):
    return check_dataset(parse_target(target_text), CheckOptions(**options))


def test_black_mask_nan_is_found_in_its_sample_and_the_training_code_does_not_run(tmp_path):
    marker = tmp_path / "trained"
    path = write(tmp_path, f"""
        class MaskDataset(Dataset):
            def __init__(self, n=16):
                self.images = torch.rand(n, 1, 4, 4)
                self.masks = (torch.rand(n, 1, 4, 4) > 0.5).float() * 255
                self.masks[11] = 0

            def __len__(self):
                return len(self.images)

            def __getitem__(self, i):
                mask = self.masks[i]
                return self.images[i], mask / mask.max()

        if __name__ == "__main__":
            open({str(marker)!r}, "w").write("training ran")
        """)
    (problem,) = check(f"{path}:MaskDataset")
    assert (problem.key, problem.check, problem.count) == ("[1]", "nan", 16)
    assert problem.positions[0] == (11, 0, 0, 0)
    assert "sample" in problem.detail and "11" in problem.detail
    assert problem.file == f"{path}:MaskDataset"
    assert not marker.exists()


def test_dict_samples_are_keyed_by_their_dict_key(tmp_path):
    path = write(tmp_path, """
        class D(Dataset):
            def __len__(self):
                return 5
            def __getitem__(self, i):
                x = torch.rand(3)
                if i == 2:
                    x[1] = float("inf")
                return {"image": torch.rand(2, 2), "mask": x}
        dataset = D()
        """)
    (problem,) = check(f"{path}:dataset")
    assert (problem.key, problem.check, problem.positions) == ("['mask']", "inf", [(2, 1)])


def test_factory_function_is_called_and_a_clean_dataset_gives_nothing(tmp_path):
    path = write(tmp_path, """
        def make_dataset():
            return torch.utils.data.TensorDataset(torch.rand(10, 3), torch.arange(10) % 2)
        """)
    assert check(f"{path}:make_dataset") == []


def test_iterable_dataset_samples_are_numbered_in_order(tmp_path):
    path = write(tmp_path, """
        class Stream(IterableDataset):
            def __iter__(self):
                for i in range(4):
                    yield torch.tensor([float("nan") if i == 3 else 1.0, 2.0])
        """)
    (problem,) = check(f"{path}:Stream")
    assert problem.check == "nan" and problem.positions == [(3, 0)]


def test_integer_label_at_the_end_of_a_pair_is_range_checked(tmp_path):
    path = write(tmp_path, """
        class D(Dataset):
            def __len__(self):
                return 4
            def __getitem__(self, i):
                return torch.rand(2), [0, 1, 7, 2][i]
        """)
    (problem,) = check(f"{path}:D", num_classes=3)
    assert (problem.key, problem.check, problem.positions) == ("[1]", "label_range", [(2,)])


def test_sample_that_raises_is_reported_and_the_others_are_still_checked(tmp_path):
    path = write(tmp_path, """
        class D(Dataset):
            def __len__(self):
                return 3
            def __getitem__(self, i):
                if i == 1:
                    raise FileNotFoundError("img_1.png")
                return torch.tensor([1.0, float("nan")]) if i == 2 else torch.ones(2)
        """)
    problems = {p.check: p for p in check(f"{path}:D")}
    assert problems["unreadable"].positions == [(1,)] and "img_1.png" in problems["unreadable"].detail
    assert problems["nan"].positions == [(2, 1)]


def test_module_target_is_imported_from_the_current_folder(tmp_path, monkeypatch):
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    write(pkg, "dataset = [torch.tensor([1.0, float('nan')])]\n", name="data.py")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    (problem,) = check("mypkg.data:dataset")
    assert (problem.key, problem.check, problem.positions) == (None, "nan", [(0, 1)])


def test_import_error_in_the_users_file_is_one_clear_usage_error(tmp_path):
    path = write(tmp_path, "import not_a_module_anywhere\n")
    with pytest.raises(UsageError) as info:
        check(f"{path}:dataset")
    message = str(info.value)
    assert "\n" not in message and "not_a_module_anywhere" in message and "train.py" in message


def test_module_level_sys_exit_is_a_usage_error(tmp_path):
    path = write(tmp_path, "import sys\nsys.exit(4)\n")
    with pytest.raises(UsageError, match="sys.exit"):
        check(f"{path}:dataset")


def test_missing_attribute_is_a_usage_error(tmp_path):
    path = write(tmp_path, "x = 1\n")
    with pytest.raises(UsageError, match="no attribute 'dataset'"):
        check(f"{path}:dataset")


def test_object_that_is_not_a_dataset_is_a_usage_error(tmp_path):
    path = write(tmp_path, "x = 1\n")
    with pytest.raises(UsageError, match="not a dataset"):
        check(f"{path}:x")


def test_missing_module_is_a_usage_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError, match="no module named"):
        check("no_such_pkg.data:dataset")


def test_users_folder_leaves_sys_path_as_it_was(tmp_path):
    path = write(tmp_path, "dataset = [torch.ones(2)]\n")
    before = list(sys.path)
    check(f"{path}:dataset")
    assert sys.path == before


def test_targets_are_told_apart_from_paths():
    assert parse_target("train.py:make_dataset").source == "train.py"
    assert parse_target("pkg.mod:ds.train").attr == "ds.train"
    assert parse_target("data/file.npy") is None
    assert parse_target("weird name:x") is None
