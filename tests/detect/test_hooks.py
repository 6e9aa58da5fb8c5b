"""The training hooks (detect/hooks.py): what each boundary of a real training loop shows
the observers — closures, DataLoader workers, gradient clipping."""
from __future__ import annotations

import threading

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from helpers import detect
from nandoctor.config import load_config
from nandoctor.detect.observer import NonFiniteFound
from nandoctor.detect.result import StopReason
from nandoctor.detect.watch import StepWatcher


def _closure_training(make_loss, steps: int = 3, optimizer=torch.optim.SGD):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = optimizer(model.parameters(), lr=0.1)
    x = torch.randn(8, 4)

    def closure():
        opt.zero_grad()
        loss = make_loss(model(x))
        loss.backward()
        return loss

    for _ in range(steps):
        opt.step(closure)
    return model


def test_ops_inside_an_optimizer_closure_are_checked_in_their_own_phase():
    found = detect(lambda: _closure_training(lambda out: torch.log(out * 0).mean()))
    assert found.stopped
    root = found.detection.root
    assert root.op == "aten.log.default"
    assert root.phase == "forward"
    assert root.location.function == "<lambda>"
    assert found.detection.reason is StopReason.LOSS


def test_lbfgs_calls_its_closure_many_times_per_step_and_each_call_is_checked():
    found = detect(lambda: _closure_training(lambda out: torch.log(out * 0).mean(), optimizer=torch.optim.LBFGS))
    assert found.stopped and found.detection.root.op == "aten.log.default"


def test_a_healthy_closure_run_counts_its_steps_and_changes_nothing():
    plain = _closure_training(lambda out: (out ** 2).mean())
    found = detect(lambda: _closure_training(lambda out: (out ** 2).mean()))
    assert not found.stopped
    assert found.detector.state.step == 3
    watched = _closure_training(lambda out: (out ** 2).mean())
    assert torch.equal(plain.weight, watched.weight)


def test_a_nan_the_closure_discards_is_seen_and_reported_as_discarded():
    def loss(out):
        return (out ** 2).mean() + torch.nan_to_num(torch.log(out.detach() * 0)).clamp(-1, 1).mean()

    found = detect(lambda: _closure_training(loss))
    assert not found.stopped
    assert [d.op for d in found.detector.discarded()] == ["aten.log.default"]


def test_watch_mode_checks_the_loss_a_closure_returns_before_the_update():
    model_box = {}

    def train():
        model_box["model"] = _closure_training(lambda out: torch.log(out * 0).mean(), steps=2)

    watcher = StepWatcher(load_config().run)
    stopped = False
    try:
        with watcher:
            train()
    except NonFiniteFound:
        stopped = True
    assert stopped
    finding = watcher.finding()
    assert finding.what == "loss" and finding.step == 0
    assert finding.weights_clean is True


class _ZeroScaleAt(Dataset):
    """Sample 37 is divided by a zero scale in __getitem__ (run in a worker process)."""

    def __len__(self):
        return 64

    def __getitem__(self, i):
        x = torch.full((4,), float(i % 7))
        return x / torch.tensor(float(i != 37)), torch.tensor([1.0])


def _loader_training(**loader_args):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for x, y in DataLoader(_ZeroScaleAt(), batch_size=8, shuffle=True, **loader_args):
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def test_forked_dataloader_workers_never_carry_the_detector_and_the_batch_is_named():
    found = detect(lambda: _loader_training(num_workers=2))
    assert found.stopped
    root = found.detection.root
    # Found again in this process: the op in __getitem__, with its batch and sample.
    assert root.op == "aten.div.Tensor" and root.phase == "data"
    assert root.location.function == "__getitem__"
    assert root.facts.batch is not None and root.facts.batch.dataset_indices == (37,)


def test_the_sample_index_is_named_when_the_refetch_finds_the_op_in_process():
    found = detect(lambda: _loader_training(num_workers=0))
    assert found.stopped
    assert found.detection.root.op == "aten.div.Tensor"
    assert found.detection.root.facts.batch.dataset_indices == (37,)


class _Tiles(torch.utils.data.IterableDataset):
    """Label tiles of a stream, each normalised by its max: the 11th tile is empty (0/0).
    With workers, each takes every other tile (`get_worker_info`), as sharded streams do."""

    def __init__(self, guard: bool = False):
        self.guard = guard

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        start, every = (info.id, info.num_workers) if info is not None else (0, 1)
        for i in range(start, 24, every):
            label = torch.zeros(4) if i == 11 else torch.rand(4) + 0.1
            peak = label.max()
            yield torch.ones(4) * i / 24, (label / peak.clamp_min(1e-6) if self.guard else label / peak)  # MARK-tile


def _stream_training(num_workers: int, guard: bool = False):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in DataLoader(_Tiles(guard), batch_size=4, num_workers=num_workers):
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_iterable_datasets_bad_batch_is_fetched_again_from_its_stream_to_the_op(num_workers):
    """No indices to fetch again: the stream is read again in this process, as the worker
    that made the batch, up to that batch, and its samples under the per-op mode."""
    found = detect(lambda: _stream_training(num_workers))
    assert found.stopped
    root = found.detection.root
    assert root.op == "aten.div.Tensor" and root.phase == "data"
    assert "MARK-tile" in root.location.code and root.location.function == "__iter__"
    assert root.facts.batch.number == (2 if num_workers == 0 else 3)  # (worker 1's second batch)


def test_near_miss_a_guarded_stream_is_clean_and_yields_what_it_yields_in_plain_python():
    assert not detect(lambda: _stream_training(0, guard=True)).stopped


class _FlakyOnFirstRead(Dataset):
    """Sample 5 is NaN the first time it is read only (a random crop that happened to be
    constant, state of the worker): a second read of it is finite."""

    def __init__(self):
        self.reads = 0

    def __len__(self):
        return 16

    def __getitem__(self, i):
        self.reads += i == 5
        bad = i == 5 and self.reads == 1
        return torch.full((4,), float("nan") if bad else 1.0), torch.tensor([1.0])


def test_a_bad_sample_that_comes_back_finite_when_fetched_again_says_so():
    def train():
        model = torch.nn.Linear(4, 1)
        for x, y in DataLoader(_FlakyOnFirstRead(), batch_size=4):
            ((model(x) - y) ** 2).mean().backward()

    batch = detect(train).detection.root.facts.batch
    assert batch.dataset_indices == (5,) and batch.refetched_finite


def test_near_miss_a_sample_bad_on_every_read_is_found_at_its_op_not_called_flaky():
    root = detect(lambda: _loader_training(num_workers=0)).detection.root
    assert root.op == "aten.div.Tensor" and not root.facts.batch.refetched_finite


class _ChurnTimes(Dataset):
    """Times to churn; a customer who never churned has +inf, written on purpose in
    __init__ (in the main process); __getitem__ regresses log(time), or caps it first."""

    def __init__(self, capped: bool):
        g = torch.Generator().manual_seed(3)
        self.x = torch.randn(64, 4, generator=g)
        t = torch.rand(64, generator=g) * 10 + 0.1
        t[torch.arange(64) % 5 == 0] = float("inf")  # MARK-never-churned
        self.t, self.capped = t, capped

    def __len__(self):
        return 64

    def __getitem__(self, i):
        t = self.t[i].clamp(max=1e3) if self.capped else self.t[i]
        return self.x[i], torch.log(t)


def _churn_training(capped: bool):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for x, log_t in DataLoader(_ChurnTimes(capped), batch_size=16, num_workers=2):
        loss = ((model(x).squeeze(1) - log_t) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def test_an_inf_marker_the_dataset_wrote_and_passed_on_into_a_batch_is_named_where_it_was_written():
    import inspect

    lines, first = inspect.getsourcelines(_ChurnTimes.__init__)
    marker = first + next(i for i, text in enumerate(lines) if "MARK-never-churned" in text)
    root = detect(lambda: _churn_training(capped=False)).detection.root
    assert root.phase == "data" and root.facts.batch is not None
    assert root.facts.inf_written_at is not None and root.facts.inf_written_at.line == marker


def test_near_miss_the_marker_capped_in_getitem_trains_clean():
    assert not detect(lambda: _churn_training(capped=True)).stopped


class _RandomCrops(Dataset):
    """A random crop of 4 from a row whose first 8 values are 0, normalised by its max: a
    crop inside that dark band is 0/0. The crop is drawn from torch's, numpy's or Python's
    generator, in each worker process seeded as DataLoader seeds it."""

    def __init__(self, rng: str, guard: bool = False):
        self.rng, self.guard = rng, guard
        self.row = torch.cat([torch.zeros(8), torch.linspace(0.1, 1.0, 56)])

    def __len__(self):
        return 64

    def _start(self) -> int:
        if self.rng == "numpy":
            import numpy as np
            return int(np.random.randint(0, 60))
        if self.rng == "random":
            import random
            return random.randrange(60)
        return int(torch.randint(0, 60, ()))

    def __getitem__(self, i):
        crop = self.row[(s := self._start()):s + 4]
        peak = crop.max().clamp_min(1e-6) if self.guard else crop.max()
        return crop / peak, torch.tensor([1.0])  # MARK-crop


def _crop_training(rng: str, guard: bool = False, **loader_args):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for x, y in DataLoader(_RandomCrops(rng, guard), batch_size=4, num_workers=2, **loader_args):
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


@pytest.mark.parametrize("rng", ["torch", "numpy", "random"])
def test_a_random_crop_a_worker_made_bad_is_fetched_again_as_that_worker_drew_it(rng):
    """Fetched again here, the crop is drawn anew and comes back finite: fetched as its
    worker fetched it (its seeds, then its earlier batches in order), it is the same crop,
    and the op that made the NaN is the root."""
    found = detect(lambda: _crop_training(rng))
    assert found.stopped
    root = found.detection.root
    assert root.op == "aten.div.Tensor" and root.phase == "data" and "MARK-crop" in root.location.code
    assert not root.facts.batch.refetched_finite


def test_near_miss_a_guarded_random_crop_in_workers_runs_clean():
    assert not detect(lambda: _crop_training("torch", guard=True)).stopped


class _Targets(Dataset):
    """Targets whose samples 4-7 are all 5.0: a batch of 4 made of them has a std of 0."""

    def __len__(self):
        return 16

    def __getitem__(self, i):
        # A random augmentation: the refetch must leave the script's random stream as it was.
        return torch.randn(3) * 0.01 + i, torch.tensor(5.0 if 4 <= i < 8 else float(i % 3))


def _standardised(eps: float):
    def collate(items):
        y = torch.stack([b for _, b in items])
        return torch.stack([a for a, _ in items]), (y - y.mean()) / (y.std() + eps)  # MARK-collate

    return collate


def _collate_training(eps: float = 0.0, num_workers: int = 0, impute: bool = False):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for x, y in DataLoader(_Targets(), batch_size=4, collate_fn=_standardised(eps), num_workers=num_workers):
        if impute:
            y = torch.nan_to_num(y)
        loss = ((model(x).squeeze(1) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_nan_made_by_the_scripts_collate_fn_is_found_at_its_line(num_workers):
    found = detect(lambda: _collate_training(num_workers=num_workers))
    assert found.stopped
    root = found.detection.root
    # Not "bad input data": the batch is collated again under the mode, from all its samples.
    assert root.op == "aten.div.Tensor" and root.phase == "data" and root.location.function == "collate"
    assert "MARK-collate" in root.location.code
    assert root.facts.batch.dataset_indices == (4, 5, 6, 7)


def test_near_miss_a_collate_fn_with_an_epsilon_is_clean():
    assert not detect(lambda: _collate_training(eps=1e-6)).stopped


def _plain_and_detected(train):
    """Train plainly and under the detector: (what the detector found, same parameters?)."""
    plain = train()
    box = {}
    found = detect(lambda: box.setdefault("model", train()))
    return found, all(torch.equal(a, b) for a, b in zip(plain.parameters(), box["model"].parameters()))


def test_a_batch_the_script_imputes_trains_on_with_the_scripts_own_random_numbers():
    found, same = _plain_and_detected(lambda: _collate_training(impute=True))
    assert not found.stopped and same


def _tensor_dataset_training(impute_first: bool, num_workers: int = 0):
    import numpy as np

    features = np.random.default_rng(0).normal(size=(32, 4)).astype(np.float32)
    features[21, 2] = np.nan  # a missing reading, in numpy before torch sees it
    x = torch.from_numpy(features)  # MARK-entry
    if impute_first:
        x = torch.nan_to_num(x)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(torch.utils.data.TensorDataset(x, torch.ones(32, 1)), batch_size=8, num_workers=num_workers)
    for xb, yb in loader:
        loss = ((model(xb) - yb) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_nan_that_entered_torch_before_the_dataset_is_rooted_where_it_entered(num_workers):
    found = detect(lambda: _tensor_dataset_training(impute_first=False, num_workers=num_workers))
    assert found.stopped
    root = found.detection.root
    # Not the `for` line that fetched the batch: the from_numpy line, with the batch and sample.
    assert root.facts.entered and "MARK-entry" in root.location.code
    assert root.facts.batch.number == 2 and root.facts.batch.dataset_indices == (21,)


def test_near_miss_data_imputed_before_the_dataset_is_clean():
    assert not detect(lambda: _tensor_dataset_training(impute_first=True)).stopped


def test_the_history_keeps_the_gradient_norm_from_before_clipping():
    def train():
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        x, y = torch.randn(16, 4) * 100, torch.randn(16, 1)
        for _ in range(2):
            opt.zero_grad()
            ((model(x) - y) ** 2).mean().backward()
            train.norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
            opt.step()

    found = detect(train)
    norms = found.detector.history().grad_norm
    assert train.norm > 10
    assert norms[-1] == train.norm


def test_keras_steps_are_optimizer_steps_with_history(monkeypatch):
    monkeypatch.setenv("KERAS_BACKEND", "torch")
    keras = pytest.importorskip("keras", reason="Keras 3 is not installed (pip install '.[stacks]')")
    if keras.backend.backend() != "torch":
        pytest.skip("Keras was imported with another backend")
    import numpy as np

    def fit():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
        x = np.random.default_rng(0).normal(size=(64, 3)).astype("float32")
        model.fit(x, x[:, :1], batch_size=16, epochs=2, verbose=0)

    found = detect(fit)
    assert not found.stopped
    assert found.detector.state.step == 8  # 4 batches x 2 epochs
    history = found.detector.history()
    assert len(history.loss) == 8 and all(v is not None for v in history.grad_norm)


def _keras_fit_with_adam(epsilon: float):
    """A Keras fit whose first input feature is always 0: its weights' gradients are exactly
    0, which Adam with epsilon=0 turns into 0/0."""
    keras = _keras()
    import numpy as np

    def fit():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        optimizer = keras.optimizers.Adam(learning_rate=1e-3, epsilon=epsilon)  # MARK-keras-adam
        model.compile(optimizer=optimizer, loss="mse")
        x = np.random.default_rng(0).normal(size=(32, 3)).astype("float32")
        x[:, 0] = 0.0
        model.fit(x, x[:, 1:2], batch_size=16, epochs=1, verbose=0)

    return detect(fit, check_optimizer_ops=True)  # (as the replay checks a step)


def test_a_keras_optimizers_bad_update_is_located_where_the_script_made_it(monkeypatch):
    # The step runs inside fit(), whose line says nothing of the setting to change.
    monkeypatch.setenv("KERAS_BACKEND", "torch")
    found = _keras_fit_with_adam(epsilon=0.0)
    assert found.stopped and found.detection.root.phase == "optimizer"
    assert found.detection.root.location.code.endswith("# MARK-keras-adam")


def test_near_miss_a_keras_adam_with_its_default_epsilon_is_clean(monkeypatch):
    monkeypatch.setenv("KERAS_BACKEND", "torch")
    assert not _keras_fit_with_adam(epsilon=1e-7).stopped


def _keras_fit_with_a_nan_validation_metric(callback_names):
    """A Keras fit whose validation metric (a ratio over a zero target) is NaN every epoch;
    the callbacks named follow that metric."""
    keras = _keras()
    import numpy as np

    def ratio(y_true, y_pred):
        return keras.ops.mean(y_pred - y_pred) / keras.ops.mean(y_true)  # 0/0 on the zero target

    callbacks = {"early_stopping": lambda: keras.callbacks.EarlyStopping(monitor="val_ratio", mode="min", patience=1),
                 "plateau": lambda: keras.callbacks.ReduceLROnPlateau(monitor="val_ratio", mode="min", patience=0)}

    def fit():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse", metrics=[ratio])
        x = np.random.default_rng(0).normal(size=(64, 3)).astype("float32")
        model.fit(x, x[:, :1], batch_size=16, epochs=3, verbose=0,
                  validation_data=(x[:16], np.zeros((16, 1), "float32")),
                  callbacks=[callbacks[name]() for name in callback_names])

    return detect(fit)


def _keras():
    keras = pytest.importorskip("keras", reason="Keras 3 is not installed (pip install '.[stacks]')")
    if keras.backend.backend() != "torch":
        pytest.skip("Keras was imported with another backend")
    return keras


class TestKerasCallbacksFollowAMetric:
    """Keras's EarlyStopping and ReduceLROnPlateau change training over the metric they
    monitor: a NaN there is a finding, as for torch's and Lightning's. The same metric only
    logged trains nothing."""

    @pytest.mark.parametrize("callback", ["early_stopping", "plateau"])
    def test_a_nan_metric_a_keras_callback_monitors_stops_the_run(self, monkeypatch, callback):
        monkeypatch.setenv("KERAS_BACKEND", "torch")
        found = _keras_fit_with_a_nan_validation_metric([callback])
        assert found.stopped and found.detection.reason is StopReason.MONITORED_METRIC
        assert found.detection.root.op == "aten.div.Tensor"

    def test_near_miss_the_same_nan_metric_only_logged_is_no_stop(self, monkeypatch):
        monkeypatch.setenv("KERAS_BACKEND", "torch")
        assert not _keras_fit_with_a_nan_validation_metric([]).stopped


class TestOnlyTheTrainingThreadIsWatched:
    """The dispatch mode sees the thread that trains; a tensor read, converted or printed
    on another thread (Keras runs its batch-end callbacks in a pool, scripts log from
    threads) goes past the hooks as in plain python. Two threads in the detector at once
    once left it busy with its own work for good, blind to the rest of the run."""

    def _reads_seen(self, monkeypatch, read_on_a_thread: bool) -> list:
        from nandoctor.detect.detector import Detector

        seen = []
        original = Detector.value_read
        monkeypatch.setattr(Detector, "value_read", lambda d, t: (seen.append(threading.get_ident()),
                                                                  original(d, t))[1])

        def train():
            loss = torch.log(torch.ones(3))
            if read_on_a_thread:
                reader = threading.Thread(target=lambda: (loss.tolist(), repr(loss), loss.numpy()))
                reader.start()
                reader.join()
            else:
                loss.tolist(), repr(loss), loss.numpy()

        assert not detect(train).stopped
        return seen

    def test_a_read_on_another_thread_never_reaches_the_detector(self, monkeypatch):
        assert self._reads_seen(monkeypatch, read_on_a_thread=True) == []

    def test_near_miss_the_same_reads_on_the_training_thread_are_seen(self, monkeypatch):
        seen = self._reads_seen(monkeypatch, read_on_a_thread=False)
        assert len(seen) >= 3 and set(seen) == {threading.get_ident()}

    def test_the_run_still_stops_while_another_thread_reads_its_values(self):
        readers = []

        def train():
            w = torch.ones(3, requires_grad=True)
            for step in range(2):
                loss = (w * 2).sum()
                readers.append(threading.Thread(target=lambda: [loss.tolist() for _ in range(2000)]))
                readers[-1].start()
                if step == 1:
                    loss = torch.log(w - 1).sum()
                loss.backward()

        found = detect(train)
        for reader in readers:
            reader.join()
        assert found.stopped and found.detection.root.op == "aten.log.default"


def _per_sample_gradients(broken: bool, steps: int = 2):
    from torch.func import functional_call, grad, vmap

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 4), torch.randn(16, 1)

    def loss_fn(params, xi, yi):
        err = (functional_call(model, params, (xi.unsqueeze(0),)) - yi) ** 2
        return torch.sqrt(err * 0).sum() if broken else err.sum()

    for _ in range(steps):
        params = {k: v.detach() for k, v in model.named_parameters()}
        per_sample = vmap(grad(loss_fn), in_dims=(None, 0, 0))(params, x, y)
        for name, p in model.named_parameters():
            p.grad = per_sample[name].mean(0)
        opt.step()
    return model


def test_vmap_of_grad_runs_under_trace_and_changes_nothing():
    found, same = _plain_and_detected(lambda: _per_sample_gradients(broken=False))
    assert not found.stopped and same
    assert found.detector.state.transforms == {"grad"}


def test_ops_inside_torch_func_transforms_are_checked_and_the_root_found():
    found = detect(lambda: _per_sample_gradients(broken=True))
    assert found.stopped
    root = found.detection.root
    assert root.backward_node.startswith("SqrtBackward") and root.location.function == "loss_fn"


def _watched_per_sample_gradients(**settings) -> StepWatcher:
    watcher = StepWatcher(dict(load_config().run, **settings))
    try:
        with watcher:
            _per_sample_gradients(broken=True)
    except NonFiniteFound:
        pass
    return watcher


def test_watch_mode_leaves_transforms_alone_and_stops_on_the_loss_their_nan_gradient_makes():
    # The loss grad() differentiates is seen (finite at step 0); the NaN gradient it gives
    # reaches the weights, and step 1's loss is NaN.
    finding = _watched_per_sample_gradients().finding()
    assert (finding.what, finding.step, finding.weights_clean) == ("loss", 1, False)


def test_watch_gradients_stops_on_the_gradient_a_transform_produces_before_the_update():
    finding = _watched_per_sample_gradients(watch_gradients=True).finding()
    assert (finding.what, finding.step, finding.weights_clean) == ("gradient", 0, True)


def _per_example_gradients_of_corrupt_rows(drop_bad_examples: bool, steps: int = 3):
    """DP-SGD style: per-example gradients with vmap(grad), two rows of the data corrupt
    (an Inf feature); the script drops the examples whose gradient is not finite, or not."""
    from torch.func import functional_call, grad, vmap

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    x[3, 1] = float("inf")
    x[9, 0] = float("-inf")

    def loss_one(params, xi, yi):
        return ((functional_call(model, params, (xi[None],)) - yi) ** 2).sum()

    for _ in range(steps):
        params = {k: v.detach() for k, v in model.named_parameters()}
        per_example = vmap(grad(loss_one), in_dims=(None, 0, 0))(params, x, y)
        flat = torch.cat([g.reshape(16, -1) for g in per_example.values()], 1)
        keep = torch.isfinite(flat).all(1) if drop_bad_examples else torch.ones(16, dtype=torch.bool)
        with torch.no_grad():
            for name, p in model.named_parameters():
                g = per_example[name]
                g = torch.where(keep.view(-1, *[1] * (g.dim() - 1)), g, torch.zeros_like(g))
                p -= 0.1 * g.sum(0) / keep.sum()
    return model


def test_per_example_gradients_the_script_drops_where_not_finite_train_on_unstopped():
    found, same = _plain_and_detected(lambda: _per_example_gradients_of_corrupt_rows(drop_bad_examples=True))
    assert not found.stopped and same


def test_watch_mode_lets_the_script_drop_its_bad_per_example_gradients_too():
    watcher = StepWatcher(load_config().run)
    with watcher:
        _per_example_gradients_of_corrupt_rows(drop_bad_examples=True)
    assert watcher.finding() is None


def test_near_miss_kept_per_example_nans_are_found_once_they_spread_rooted_in_the_data():
    found = detect(lambda: _per_example_gradients_of_corrupt_rows(drop_bad_examples=False))
    assert found.stopped
    assert found.detection.root.op == "aten.copy_.default" and found.detection.root.phase == "data"


def test_the_loss_handed_to_torch_func_grad_is_checked_under_its_wrapper():
    def train():
        from torch.func import grad  # imported by the script, under nandoctor

        w = torch.ones(3)
        for _ in range(2):
            w = w - 0.1 * grad(lambda w: torch.log(w * 0).sum())(w)

    found = detect(train)
    assert found.stopped and found.detection.reason is StopReason.LOSS
    assert found.detection.root.op == "aten.log.default" and found.detection.root.phase == "forward"


def test_zero_grad_runs_past_the_per_op_mode_and_clears_as_plain_python(monkeypatch):
    # Setting gradients to None or to zeros makes nothing non-finite: zero_grad runs with
    # the mode off (its two profiler marks and the zeroing cost a dispatch each, every step).
    from helpers import ops_through_the_mode

    w = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([w], lr=0.1)
    through_the_mode, grads = [], []

    def train():
        (w * 2).sum().backward()
        seen = ops_through_the_mode(monkeypatch)
        opt.zero_grad(set_to_none=False)
        through_the_mode.extend(seen)
        grads.append(w.grad)
        opt.zero_grad()
        through_the_mode.extend(seen)
        grads.append(w.grad)

    assert not detect(train).stopped
    assert through_the_mode == [] and grads[0].tolist() == [0.0, 0.0, 0.0] and grads[1] is None


def test_a_step_runs_past_the_per_op_mode_profiler_mark_included_and_the_class_gets_its_step_back(monkeypatch):
    # torch wraps every optimizer class's step in a profiler mark (two ops) before the
    # step's pre-hooks run: the whole step runs with the mode off, checked at its boundaries,
    # for an optimizer made in the run and for one made before it.
    from helpers import ops_through_the_mode

    class Momentum(torch.optim.SGD):
        pass

    v = torch.nn.Parameter(torch.ones(1))
    torch.optim.SGD([v], lr=0.1)  # (torch wraps SGD's step: the subclass inherits it)
    made_before = torch.optim.Adagrad([v], lr=0.1)  # (no Adagrad is made in the run)
    w = torch.nn.Parameter(torch.ones(3))
    through_the_mode, steps = [], []

    def train():
        opt = Momentum([w], lr=0.1, momentum=0.9)
        (w * 2).sum().backward()
        v.sum().backward()
        steps.append(torch.optim.SGD.step)
        seen = ops_through_the_mode(monkeypatch)
        opt.step()
        made_before.step()
        through_the_mode.extend(seen)
        torch.log(w - w).sum().backward()  # after the step the mode is back on: op by op
        opt.step()  # (where its loss would be applied: the check of a loss the run trains on)

    found = detect(train)
    assert found.detection.root.op == "aten.log.default"
    assert through_the_mode == [] and w.tolist() == [torch.tensor(0.8).item()] * 3
    assert torch.optim.SGD.step is not steps[0] and torch.optim.SGD.step.hooked  # torch's own wrapper again


def test_a_gradient_zeroed_in_place_loses_the_record_of_the_value_it_held():
    # Step 1: a GradScaler skips a step whose gradients are Inf (each has a record). The
    # gradients are zeroed in place, and step 2's own infinite gradient is added into them
    # by the engine: the stop names step 2's sqrt, not the Inf the zeroing removed.
    w = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    opt = torch.optim.SGD([w], lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16)

    def train():
        scaler.scale((w * 3e38).sum() * 10).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=False)
        torch.sqrt(w - 1).sum().backward()  # sqrt'(0) is Inf

    d = detect(train).detection
    assert d is not None and d.root.backward_node == "SqrtBackward0"


def test_torch_jit_script_compiles_calls_of_the_functions_nandoctor_wraps():
    # TorchScript knows torch.as_tensor and torch.autograd.grad by identity; with
    # nandoctor's wrappers standing in, scripting a function that calls them failed with a
    # TypeError where plain python compiles it. After the run no wrapper stays registered.
    from torch.jit import _builtins

    def scaled(x: torch.Tensor) -> torch.Tensor:
        return torch.as_tensor(x) * 2

    def slope(x: torch.Tensor):
        y = (x * x).sum()
        return torch.autograd.grad([y], [x])

    results, wrappers = [], []

    def train():
        wrappers.extend([torch.as_tensor, torch.autograd.grad])
        results.append(torch.jit.script(scaled)(torch.ones(2)).tolist())
        results.append(torch.jit.script(slope)(torch.tensor([3.0], requires_grad=True))[0].tolist())

    assert not detect(train).stopped
    assert results == [[2.0, 2.0], [6.0]]
    assert torch.as_tensor is not wrappers[0]  # (they were nandoctor's while it ran)
    assert all(_builtins._find_builtin(w) is None for w in wrappers)
