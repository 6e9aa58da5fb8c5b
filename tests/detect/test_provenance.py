"""Where an op came from (detect/provenance.py): the user's own line, never a library's."""
from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest
import torch

from nandoctor.detect.provenance import SourceLocator


def _code_at(path: Path):
    return compile("pass", str(path), "exec")


def test_code_in_an_installed_package_is_library_code_not_the_users():
    site_packages = Path(sysconfig.get_paths()["purelib"])
    locator = SourceLocator()
    for package in ("lightning/pytorch/core/module.py", "keras/src/backend/torch/numpy.py", "anything/train.py"):
        assert not locator.is_user_code(_code_at(site_packages / package))


def test_any_site_packages_folder_is_library_code_also_outside_this_environment(tmp_path):
    other_env = tmp_path / "venv" / "lib" / "python3.11" / "site-packages" / "transformers" / "trainer.py"
    assert not SourceLocator().is_user_code(_code_at(other_env))


def test_the_code_torch_compile_generates_is_torchs_not_the_users(tmp_path):
    # Inductor writes its wrappers to <tmp>/torchinductor_<user>/; a compiled backward runs them.
    generated = tmp_path / "torchinductor_root" / "if" / "cifnbgdb3offyk7n.py"
    assert not SourceLocator().is_user_code(_code_at(generated))


def test_the_users_own_files_are_user_code_wherever_they_live(tmp_path):
    locator = SourceLocator()
    assert locator.is_user_code(_code_at(tmp_path / "train.py"))
    assert locator.is_user_code(_code_at(tmp_path / "src" / "mypackage" / "model.py"))  # an editable install


def test_the_framework_line_that_ran_an_op_is_found_and_shown_from_its_package():
    framework_file = Path(sysconfig.get_paths()["purelib"]) / "someframework" / "ops.py"
    namespace: dict = {}
    exec(compile("def run(fn):\n    return fn()\n", str(framework_file), "exec"), namespace)
    locator = SourceLocator()
    code, line = namespace["run"](lambda: locator.library_frame(1))
    assert (code.co_filename, line) == (str(framework_file), 2)
    assert locator.location((code, line)).file == "someframework/ops.py"


def test_an_op_the_user_called_directly_has_no_framework_line():
    locator = SourceLocator()
    assert (lambda: locator.library_frame(1))() is None


GUARDED = """\
for step in range(10):
    loss = model(x)
    if not math.isfinite(loss.item()):
        print(f"skipping, loss {loss.item()}")
        if verbose:
            log(loss.item())
        continue
    if torch.isfinite(norm):
        opt.step()
    else:
        print("norm", norm.item())
    print(loss.item())
"""


@pytest.mark.parametrize("line, guarded", [
    (4, True),  # under `if not math.isfinite(...)`
    (6, True),  # deeper, under an `if verbose:` inside it
    (11, True),  # the `else` of `if torch.isfinite(norm):`
    (9, True),  # (its `if` branch reads finite values; a read there is guarded too)
    (12, False),  # after the blocks: the value is used
    (2, False),
])
def test_a_read_in_a_branch_a_finiteness_test_guards_is_read_to_be_discarded(line, guarded):
    from nandoctor.detect.provenance import _guarded_by_a_finiteness_test

    assert _guarded_by_a_finiteness_test(GUARDED.splitlines(keepends=True), line) is guarded


TESTED_AFTER = """for i in range(100):
    loss = model(x)
    value = loss.item()
    if not math.isfinite(value):
        continue
    avg = 0.98 * avg + 0.02 * loss.item()
    smooth = avg / (1 - 0.98 ** (i + 1))
    if not math.isfinite(loss.item()):
        break
    other = norm.item()
    if math.isnan(value):
        pass
    late = loss.item()
    a = 1
    b = 2
    c = 3
    if math.isinf(late):
        pass
    print(norm.item())
    trained = loss.item()
    loss.backward()
    if not math.isfinite(trained):
        pass
    spike = loss.item()
    if ema is not None and spike > 20 * ema:
        skipped += 1
        continue
    kept = loss.item()
    if kept < best:
        best = kept
    quick = loss.item()
    if quick > 1e6: continue
if not math.isfinite(norm.item()):
    pass
"""


@pytest.mark.parametrize("line, tested", [
    (3, True),  # `value = loss.item()`, then `if not math.isfinite(value):`
    (6, True),  # a running average of `loss.item()`, before `if not math.isfinite(loss.item()):`
    (10, False),  # `other = norm.item()`: the next test is of another value
    (13, True),  # tested four lines later, nothing trained in between
    (19, False),  # printed, and tested only after the block it was read in ended
    (20, False),  # tested only after backward() trained with it
    (24, True),  # a batch skipped when the value read is above a threshold (an Inf always is)
    (28, False),  # compared, but nothing is skipped over it
    (31, True),  # the skip on the header's own line
])
def test_a_read_whose_value_the_next_lines_test_is_read_to_be_checked(line, tested):
    from nandoctor.detect.provenance import _tested_right_after

    assert _tested_right_after(TESTED_AFTER.splitlines(keepends=True), line) is tested


def test_a_keras_layer_called_on_its_own_is_named_by_its_keras_name():
    # Keras 3 on torch: a functional Model keeps its layers in its own lists, not as
    # submodules, so each layer is a root; its `name` is what model.summary() shows.
    from nandoctor.detect.provenance import ModuleTracker

    keras_layer = type("Layer", (torch.nn.Module,), {"__module__": "keras.src.layers.layer"})
    gem = type("GeMPooling2D", (keras_layer,), {"forward": lambda self, x: x.pow(3)})()
    gem.name = "gem"
    plain = type("GeMPooling2D", (torch.nn.Module,), {"forward": lambda self, x: x.pow(3)})()
    plain.name = "gem"  # (a torch module's attribute of that name is no Keras name)
    tracker = ModuleTracker()
    seen = []
    tracker.install()
    try:
        for module in (gem, plain):
            module.register_forward_pre_hook(lambda m, args: seen.append(tracker.current))
            module(torch.ones(2))
    finally:
        tracker.uninstall()
    assert seen == ["gem", "GeMPooling2D"]
