"""The points where training shows itself, hooked without touching the user's code.

Each hook calls the observer (see observer.py for the protocol):

- `torch.autograd.backward` / `torch.autograd.grad`: the loss, and the gradients after.
- global optimizer step pre/post hooks: the step count, the optimizer phase, parameters.
  A step given a closure (`optimizer.step(closure)`: LBFGS, Lightning's automatic
  optimization) runs forward and backward inside the step: the closure is wrapped so that
  its ops run in their own phase, and the gradients are checked when it returns.
- `Optimizer.zero_grad`: the gradients cleared (nothing there can make a value non-finite).
- `torch.nn.utils.clip_grad_norm_`: the gradient norm before clipping, for the history.
- `torch.amp.GradScaler.scale` / `.step`: which loss was scaled, and which steps the scaler
  skipped (see amp.py).
- `ReduceLROnPlateau.step`, Lightning's `EarlyStopping`, and Keras's `EarlyStopping` and
  `ReduceLROnPlateau` callbacks: a metric training follows.
- `torch.compile`: each call of what it returned is a compiled region (see compiled.py).
- inside a `torch.func` transform, backward and grad are left alone (see `in_transform`).
- Keras 3's `BaseOptimizer.apply` (torch backend), patched when the script imports Keras:
  its steps are optimizer steps like torch's, seen through `KerasOptimizer`.
- `Tensor.tolist` / `numpy` / `__repr__`: values the script reads back (`.item()` is an op
  the dispatch mode sees itself); `torch.from_numpy` / `as_tensor`: values entering torch
  from outside; `torch.save` / `torch.load`: values that go through a file or buffer.
- `Module.state_dict`: the parameters and buffers a script takes out of a model (a
  checkpoint, an EMA model's weights), which it may have written through detached aliases.
- `DataLoader.__iter__` / `_BaseDataLoaderIter.__next__`: the data phase, and each batch as
  it arrives (also from worker processes, whose own ops nandoctor cannot see).

Every patch is undone on `uninstall()`.

Values read, printed, saved or entered into torch, and the batches a DataLoader yields, are
followed on the thread that trains (the one that last ran a backward or an optimizer step,
at first the one that installed the hooks) and inside a backward it started. Elsewhere
(Keras's batch-end callback pool, a thread the script starts to log or serve) they pass as
unpatched: two threads in the observer at once would each find it busy with nandoctor's own
work and leave it so, blind to the rest of the run.
"""
from __future__ import annotations

import collections
import functools
import threading

import torch
import torch.func
import torch.utils.data.dataloader as dataloader_module
from torch.amp.grad_scaler import GradScaler
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from nandoctor.detect import compiled
from nandoctor.detect.batches import StreamPosition
from nandoctor.detect.compiled import CompileQuiet, code_of, compile_wrapper, compiling, hide_from_dynamo
from nandoctor.detect.imports import ImportPatches


# torch.distributed's collectives that write what the other ranks sent into their first
# argument (the tensor, or the list of tensors, or the output tensor).
_COLLECTIVES_RECEIVING = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor",
                          "reduce", "all_to_all_single")


# ...and those that pickle Python objects (tensors inside them too) and unpickle what the
# other ranks sent into a list: the name -> (the received list's argument, the sent
# object's argument), each as (position, keyword).
_OBJECT_COLLECTIVES = {
    "broadcast_object_list": ((0, "object_list"), None),
    "all_gather_object": ((0, "object_list"), (1, "obj")),
    "scatter_object_list": ((0, "scatter_object_output_list"), (1, "scatter_object_input_list")),
    "gather_object": ((1, "object_gather_list"), (0, "obj")),
}


def _argument(args, kwargs, place):
    if place is None:
        return None
    position, keyword = place
    return args[position] if position < len(args) else kwargs.get(keyword)


class TrainingHooks:
    def __init__(self, observer) -> None:
        self.observer = observer
        self._undo: list = []
        self._steps_hooked: set = set()
        self.training_thread = threading.get_ident()

    def install(self) -> None:
        self._patch(torch.autograd, "backward", self._wrap_backward)
        self._patch(torch.autograd, "grad", self._wrap_grad)
        pre = register_optimizer_step_pre_hook(self._before_step)
        post = register_optimizer_step_post_hook(lambda opt, args, kwargs: self.observer.after_optimizer_step(opt))
        self._undo += [pre.remove, post.remove]
        self._patch(torch.optim.Optimizer, "__init__", self._wrap_optimizer_init)
        for cls in _subclasses(torch.optim.Optimizer):  # optimizers made before: torch wrapped their step
            if getattr(cls.__dict__.get("step"), "hooked", False):
                self._hook_step_of(cls)
        self._patch(torch.optim.Optimizer, "zero_grad", self._wrap_zero_grad)
        self._patch(torch.nn.utils, "clip_grad_norm_", self._wrap_clip)
        self._patch(GradScaler, "scale", self._wrap_scale)
        self._patch(GradScaler, "step", self._wrap_scaler_step)
        self._patch(torch.optim.lr_scheduler.ReduceLROnPlateau, "step", self._wrap_followed_metric)
        imports = ImportPatches()
        self._undo.append(imports.uninstall)
        imports.when_imported("keras.src.optimizers.base_optimizer", self._patch_keras)
        for lightning in ("lightning.pytorch", "pytorch_lightning"):
            imports.when_imported(f"{lightning}.callbacks.early_stopping", self._patch_early_stopping)
        imports.when_imported("keras.src.callbacks.early_stopping", self._patch_keras_early_stopping)
        imports.when_imported("keras.src.callbacks.reduce_lr_on_plateau", self._patch_keras_plateau)
        imports.when_imported("torch._dynamo", lambda module: hide_from_dynamo(self.runtime_code()))
        for name in _TRANSFORMS:
            self._patch(torch.func, name, self._wrap_transform)
        self._patch(torch, "compile", compile_wrapper)
        compiled.observe(self.observer)
        self._undo.append(lambda: compiled.stop_observing(self.observer))
        quiet = CompileQuiet().__enter__()
        self._undo.append(quiet.__exit__)
        self._patch(torch.nn.Module, "state_dict", self._wrap_state_dict, training_thread_only=True)
        for name in ("register_hook", "register_post_accumulate_grad_hook"):
            self._patch(torch.Tensor, name, self._wrap_register_hook, training_thread_only=True)
        if self.observer.watches_values:
            for name in ("tolist", "numpy", "__repr__"):
                self._patch(torch.Tensor, name, self._wrap_read, training_thread_only=True)
            for name in ("from_numpy", "as_tensor"):
                self._patch(torch, name, self._wrap_entry, training_thread_only=True)
            self._patch(torch, "save", self._wrap_save, training_thread_only=True)
            if torch.distributed.is_available():
                for name in _COLLECTIVES_RECEIVING:
                    if hasattr(torch.distributed, name):
                        self._patch(torch.distributed, name, self._wrap_collective, training_thread_only=True)
                for name in _OBJECT_COLLECTIVES:
                    if hasattr(torch.distributed, name):
                        self._patch(torch.distributed, name, self._wrap_object_collective, training_thread_only=True)
            self._patch(torch, "load", self._wrap_load, training_thread_only=True)
        if self.observer.watches_data:
            self._patch(dataloader_module.DataLoader, "__iter__", self._wrap_iter, training_thread_only=True)
            self._patch(dataloader_module._BaseDataLoaderIter, "__next__", self._wrap_next, training_thread_only=True)
            self._patch(dataloader_module._BaseDataLoaderIter, "_next_index", self._wrap_next_index, training_thread_only=True)

    def runtime_code(self) -> list:
        """What runs inside the user's code, maybe inside a compiled function's extent: the
        wrappers, and the observer's own per-op code (see compiled.py)."""
        wrappers = [getattr(TrainingHooks, name) for name in dir(TrainingHooks) if name.startswith("_wrap")]
        return code_of(*wrappers) + self.observer.runtime_code()

    def uninstall(self) -> None:
        while self._undo:
            self._undo.pop()()

    def _patch(self, owner, name: str, wrap, training_thread_only: bool = False) -> None:
        original = owner.__dict__[name] if name in owner.__dict__ else getattr(owner, name)
        wrapper = wrap(original)
        if training_thread_only:
            wrapper = self._wrap_on_training_thread(original, wrapper)
        setattr(owner, name, wrapper)
        self._undo.append(lambda: setattr(owner, name, original))
        self._undo.append(scriptable_as(original, wrapper))

    def _wrap_on_training_thread(self, original, wrapper):
        """`wrapper` where training runs, `original` elsewhere (see the module docstring)."""
        hooks = self

        @functools.wraps(original)
        def on_training_thread(*args, **kwargs):
            if _get_ident() == hooks.training_thread or _graph_task_id() != -1:
                return wrapper(*args, **kwargs)
            return original(*args, **kwargs)

        for name, value in getattr(wrapper, "__dict__", {}).items():  # (markers it carries)
            setattr(on_training_thread, name, value)
        return on_training_thread

    def _trains_here(self) -> None:
        """A backward or an optimizer step runs on this thread: it is the one that trains (a
        script may train on a thread of its own while its main thread waits)."""
        if not compiling() and _graph_task_id() == -1:
            self.training_thread = _get_ident()

    def _before_step(self, optimizer, args, kwargs):
        self._trains_here()
        closure = kwargs.get("closure", args[1] if len(args) > 1 else None)
        if not callable(closure):
            self.observer.before_optimizer_step(optimizer)  # first this rank's own values, then its peers
            self.observer.check_peers()
            return None
        self.observer.check_peers()
        # The step will call the closure for its gradients (LBFGS more than once): the
        # step's boundary is where each call returns, not here.
        wrapped = self._wrap_closure(optimizer, closure)
        if "closure" in kwargs:
            return args, {**kwargs, "closure": wrapped}
        return (args[0], wrapped, *args[2:]), kwargs

    def _wrap_closure(self, optimizer, closure):
        observer = self.observer

        @functools.wraps(closure)
        def checked_closure(*args, **kwargs):
            observer.closure_started(optimizer)
            result = closure(*args, **kwargs)
            observer.before_optimizer_step(optimizer)
            return result

        return checked_closure

    def _wrap_zero_grad(self, original):
        observer = self.observer

        @functools.wraps(original)
        def zero_grad(optimizer, *args, **kwargs):
            if compiling():
                return original(optimizer, *args, **kwargs)
            return observer.clearing_gradients(optimizer, lambda: original(optimizer, *args, **kwargs))

        return zero_grad

    def _wrap_clip(self, original):
        observer = self.observer

        @functools.wraps(original)
        def clip_grad_norm_(*args, **kwargs):
            if compiling():
                return original(*args, **kwargs)
            total = original(*args, **kwargs)
            observer.gradients_clipped(total)  # the norm clip_grad_norm_ measured, before clipping
            return total

        return clip_grad_norm_

    def _wrap_followed_metric(self, original):
        """`ReduceLROnPlateau.step(metrics)`, `EarlyStopping._evaluate_stopping_criteria(current)`:
        a method whose first argument is a metric training follows."""
        observer = self.observer

        @functools.wraps(original)
        def follows(owner, metric, *args, **kwargs):
            observer.metric_followed(metric)
            return original(owner, metric, *args, **kwargs)

        return follows

    def _patch_early_stopping(self, module) -> None:
        if hasattr(module.EarlyStopping, "_evaluate_stopping_criteria"):
            self._patch(module.EarlyStopping, "_evaluate_stopping_criteria", self._wrap_followed_metric)

    def _patch_keras_early_stopping(self, module) -> None:
        self._patch(module.EarlyStopping, "get_monitor_value", self._wrap_monitor_value)

    def _wrap_monitor_value(self, original):
        """Keras's `EarlyStopping.get_monitor_value(logs)`: the value it returns is the metric
        training follows (None: the metric is not logged)."""
        observer = self.observer

        @functools.wraps(original)
        def get_monitor_value(callback, logs, *args, **kwargs):
            value = original(callback, logs, *args, **kwargs)
            if value is not None:
                observer.metric_followed(value)
            return value

        return get_monitor_value

    def _patch_keras_plateau(self, module) -> None:
        self._patch(module.ReduceLROnPlateau, "on_epoch_end", self._wrap_keras_plateau)

    def _wrap_keras_plateau(self, original):
        """Keras's `ReduceLROnPlateau.on_epoch_end(epoch, logs)` reads `logs[monitor]`, the
        metric the learning rate follows."""
        observer = self.observer

        @functools.wraps(original)
        def on_epoch_end(callback, epoch, logs=None, *args, **kwargs):
            value = (logs or {}).get(getattr(callback, "monitor", None))
            if value is not None:
                observer.metric_followed(value)
            return original(callback, epoch, logs, *args, **kwargs)

        return on_epoch_end

    def _wrap_scale(self, original):
        observer = self.observer

        @functools.wraps(original)
        def scale(scaler, outputs):
            scaled = original(scaler, outputs)
            if isinstance(outputs, torch.Tensor) and scaler.is_enabled():
                observer.loss_scaled(outputs, scaled)
            return scaled

        return scale

    def _wrap_scaler_step(self, original):
        observer = self.observer

        @functools.wraps(original)
        def step(scaler, optimizer, *args, **kwargs):
            if not scaler.is_enabled():
                return original(scaler, optimizer, *args, **kwargs)
            steps_before = observer.state.step
            result = original(scaler, optimizer, *args, **kwargs)
            # The scaler calls optimizer.step() only when the unscaled gradients are finite.
            observer.scaler_stepped(scaler, optimizer, skipped=observer.state.step == steps_before)
            return result

        return step

    def _patch_keras(self, module) -> None:
        self._patch(module.BaseOptimizer, "__init__", self._wrap_keras_init)
        self._patch(module.BaseOptimizer, "apply", self._wrap_keras_apply)

    def _wrap_keras_init(self, original):
        state = self.observer.state
        locator = getattr(self.observer, "locator", None)

        @functools.wraps(original)
        def __init__(optimizer, *args, **kwargs):
            original(optimizer, *args, **kwargs)
            state.optimizer_created()  # steps count from here (its variables come later)
            if locator is not None:  # (its torch view is made at the first step, inside fit)
                optimizer._nandoctor_made_at = locator.user_frame(2)

        return __init__

    def _wrap_transform(self, original):
        state = self.observer.state

        @functools.wraps(original)
        def transform(func, *args, **kwargs):
            @functools.wraps(func)
            def transformed(*call_args, **call_kwargs):
                state.transform_depth += 1  # what runs inside is a forward being differentiated
                try:
                    return func(*call_args, **call_kwargs)
                finally:
                    state.transform_depth -= 1

            return original(transformed, *args, **kwargs)

        return transform

    def _wrap_keras_apply(self, original):
        observer = self.observer

        @functools.wraps(original)
        def apply(optimizer, grads, trainable_variables=None):
            view, new = KerasOptimizer.of(optimizer, trainable_variables)
            if view is None:  # another backend's tensors: nothing nandoctor can see
                return original(optimizer, grads, trainable_variables)
            if new:
                observer.optimizer_created(view)
            observer.before_optimizer_step(view)
            result = original(optimizer, grads, trainable_variables)
            observer.after_optimizer_step(view)
            return result

        return apply

    def _wrap_backward(self, original):
        observer, hooks = self.observer, self

        @functools.wraps(original)
        def backward(tensors, *args, **kwargs):
            if compiling():  # a compiled training step: Dynamo traces backward itself
                return original(tensors, *args, **kwargs)
            hooks._trains_here()
            roots = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors or ())
            transform = in_transform()
            if transform:  # the values under functorch's wrappers are what is checked
                observer.transform_seen("backward")
                roots = observer.across_examples([unwrapped_examples(t) for t in roots])
            create_graph = args[2] if len(args) > 2 else kwargs.get("create_graph", False)
            # first this rank's own loss, then its peers
            mark = observer.before_backward(roots, plain=not create_graph and not transform)
            observer.state.backward_started = True
            try:
                observer.check_peers()
                result = original(tensors, *args, **kwargs)
            except BaseException:
                observer.backward_failed()
                raise
            observer.after_backward(roots, mark)
            return result

        return backward

    def _wrap_grad(self, original):
        observer = self.observer

        @functools.wraps(original)
        def grad(outputs, *args, **kwargs):
            if compiling():
                return original(outputs, *args, **kwargs)
            roots = [outputs] if isinstance(outputs, torch.Tensor) else list(outputs or ())
            transform = in_transform()  # torch.func.grad / vjp: the values under the wrappers
            if transform:
                observer.transform_seen("grad")
                roots = observer.across_examples([unwrapped_examples(t) for t in roots])
            mark = observer.before_backward(roots)
            result = original(outputs, *args, **kwargs)
            observer.after_grad(observer.across_examples([unwrapped_examples(g) for g in result])
                                if transform else result, mark)
            return result

        return grad

    def _wrap_register_hook(self, original):
        observer = self.observer

        @functools.wraps(original)
        def register_hook(tensor, hook):
            return original(tensor, observer.python_in_backward(hook))

        return register_hook

    def _wrap_read(self, original):
        observer = self.observer

        @functools.wraps(original)
        def read(tensor, *args, **kwargs):
            if type(tensor) is torch.Tensor or isinstance(tensor, torch.nn.Parameter):
                observer.value_read(tensor)
            return original(tensor, *args, **kwargs)

        return read

    def _wrap_entry(self, original):
        observer = self.observer

        @functools.wraps(original)
        def entry(*args, **kwargs):
            tensor = original(*args, **kwargs)
            observer.value_entered(tensor, "")  # no ATen op made it: it shares numpy's memory
            return tensor

        return entry

    def _wrap_state_dict(self, original):
        observer = self.observer
        depth = [0]  # a module's state_dict() calls its children's: only the outermost call counts

        @functools.wraps(original)
        def state_dict(module, *args, **kwargs):
            depth[0] += 1
            try:
                state = original(module, *args, **kwargs)
            finally:
                depth[0] -= 1
            if depth[0] == 0 and isinstance(state, dict):
                observer.state_exported(module, state)
            return state

        return state_dict

    def _wrap_save(self, original):
        observer = self.observer

        @functools.wraps(original)
        def save(obj, *args, **kwargs):
            observer.saving(obj)
            return original(obj, *args, **kwargs)

        return save

    def _wrap_load(self, original):
        observer = self.observer

        @functools.wraps(original)
        def load(*args, **kwargs):
            obj = original(*args, **kwargs)
            observer.loaded(obj)
            return obj

        return load

    def _wrap_object_collective(self, original):
        """`broadcast_object_list([mean, inv_std], src=0)`: the tensors unpickled into the list
        came from the rank that sent them, as a tensor collective's values do (on the sending
        rank they are its own objects, whose records say what made them)."""
        observer = self.observer
        name = original.__name__
        received_at, sent_at = _OBJECT_COLLECTIVES[name]

        @functools.wraps(original)
        def object_collective(*args, **kwargs):
            result = original(*args, **kwargs)
            received = _argument(args, kwargs, received_at)
            if received is not None:
                sent = _argument(args, kwargs, sent_at)
                observer.values_received(name, received, [] if sent is None else [sent])
            return result

        return object_collective

    def _wrap_collective(self, original):
        """What a collective wrote into its first argument came from the other ranks (once
        it is done: an `async_op=True` call's values arrive at `wait()`, not followed)."""
        observer = self.observer
        name = original.__name__

        @functools.wraps(original)
        def collective(*args, **kwargs):
            work = original(*args, **kwargs)
            values = [*args, *kwargs.values()]
            if work is None and values:
                observer.values_received(name, values[0], values[1:])
            return work

        return collective

    def _wrap_optimizer_init(self, original):
        observer = self.observer

        @functools.wraps(original)
        def __init__(optimizer, *args, **kwargs):
            original(optimizer, *args, **kwargs)
            observer.optimizer_created(optimizer)
            self._hook_step_of(type(optimizer))

        return __init__

    def _hook_step_of(self, cls) -> None:
        """A whole `step()` of this optimizer class goes through the observer (`stepping`).
        torch wraps each class's step in a profiler mark when its first optimizer is made;
        the mark's two ops run before the step's pre-hooks can take the per-op mode off.
        The step hooked is the one the class runs: a subclass made after its base's first
        optimizer inherits the base's wrapped step."""
        owner = next((c for c in cls.__mro__ if "step" in c.__dict__), None)
        if owner is not None and owner not in self._steps_hooked:
            self._steps_hooked.add(owner)
            self._patch(owner, "step", self._wrap_step)
            self._undo.append(lambda: self._steps_hooked.discard(owner))

    def _wrap_step(self, original):
        observer = self.observer

        @functools.wraps(original)  # (its `hooked` too: torch does not wrap it again)
        def step(optimizer, *args, **kwargs):
            if compiling():
                return original(optimizer, *args, **kwargs)
            return observer.stepping(optimizer, lambda: original(optimizer, *args, **kwargs))

        return step

    def _wrap_iter(self, original):
        observer = self.observer

        @functools.wraps(original)
        def __iter__(loader):
            # Worker processes start here; forked ones copy the dispatch-mode stack, so the
            # data phase (no per-op mode) is entered first and nandoctor's mode is never
            # carried into them. Their batches are checked as they arrive, in __next__.
            observer.data_started()
            try:
                return original(loader)
            finally:
                observer.data_finished()

        return __iter__

    def _wrap_next(self, original):
        observer = self.observer

        @functools.wraps(original)
        def __next__(iterator):
            observer.data_started()
            try:
                batch = original(iterator)
                number = getattr(iterator, "_nandoctor_batches", 0)
                iterator._nandoctor_batches = number + 1
                pending = getattr(iterator, "_nandoctor_indices", None)
                indices = pending.popleft() if pending else None
                # Still inside data loading: the check itself runs without the per-op mode.
                collate = getattr(iterator, "_collate_fn", None) if getattr(iterator, "_auto_collation", False) else None
                dataset = getattr(iterator, "_dataset", None)
                stream = _stream_position(iterator, dataset)
                observer.check_batch(batch, number, indices, dataset, collate, stream)
            finally:
                observer.data_finished()
            return batch

        return __next__

    def _wrap_next_index(self, original):
        @functools.wraps(original)
        def _next_index(iterator):
            index = original(iterator)
            # Batches come out in the order their indices were drawn (also with worker
            # processes, which prefetch): a queue pairs each batch with its dataset indices.
            if not hasattr(iterator, "_nandoctor_indices"):
                iterator._nandoctor_indices = collections.deque()
                iterator._nandoctor_drawn = [] if _workers_reseeded_each_epoch(iterator) else None
            iterator._nandoctor_indices.append(index)
            drawn = iterator._nandoctor_drawn
            if drawn is not None and len(drawn) < _DRAWN_KEPT:  # (a worker's batch is fetched again after its earlier ones)
                drawn.append(index)
            return index

        return _next_index


# Batches' indices kept an epoch, for fetching a worker's batch again after its earlier ones.
_DRAWN_KEPT = 100_000


def _workers_reseeded_each_epoch(iterator) -> bool:
    """Do worker processes make this epoch's batches, seeded afresh and taking the batches
    in turn? (Persistent workers carry their random state over from earlier epochs; out of
    order, a batch goes to whichever worker is free.)"""
    return getattr(iterator, "_num_workers", 0) > 0 and not getattr(iterator, "_persistent_workers", False) \
        and getattr(iterator, "_in_order", True)


def _stream_position(iterator, dataset) -> StreamPosition | None:
    """Where a batch comes from (see `StreamPosition`): for an IterableDataset, always; for
    a map-style one, when worker processes make its batches."""
    iterable = isinstance(dataset, torch.utils.data.IterableDataset)
    if not iterable and not _workers_reseeded_each_epoch(iterator):
        return None
    sampler = getattr(iterator, "_index_sampler", None)
    batch_size = getattr(sampler, "batch_size", None) if getattr(iterator, "_auto_collation", False) else None
    return StreamPosition(batch_size, getattr(iterator, "_num_workers", 0), getattr(iterator, "_base_seed", None),
                          getattr(iterator, "_worker_init_fn", None),
                          None if iterable else getattr(iterator, "_nandoctor_drawn", None))


_get_ident = threading.get_ident
_graph_task_id = torch._C._current_graph_task_id  # -1 outside a backward


def scriptable_as(original, wrapper):
    """TorchScript knows torch's own functions by identity (`torch.as_tensor` is
    aten::as_tensor, `torch.autograd.grad` aten::grad): a function the script compiles with
    `torch.jit.script` while a wrapper stands in must find the wrapper there too, or
    scripting fails where plain python succeeds. Returns what takes it out again."""
    from torch.jit import _builtins

    op = _builtins._find_builtin(original)
    if op is None:
        return lambda: None
    _builtins._register_builtin(wrapper, op)
    return lambda: _builtins._get_builtin_table().pop(id(wrapper), None)


# torch.func transforms whose function runs a forward pass (the phase of its ops).
_TRANSFORMS = ("grad", "grad_and_value", "vjp", "jacrev", "jacfwd", "hessian", "vmap", "jvp")


def _subclasses(cls) -> list:
    found, stack = [], list(cls.__subclasses__())
    while stack:
        sub = stack.pop()
        found.append(sub)
        stack.extend(sub.__subclasses__())
    return found


def in_transform() -> bool:
    """Inside a torch.func transform (grad, vmap, jvp...): the tensors the hooks get are
    functorch wrappers, whose values cannot be read (`.item()` under vmap raises). The
    per-op mode still sees the ops underneath, on plain tensors."""
    return torch._C._functorch.peek_interpreter_stack() is not None


def unwrapped(t):
    """The plain tensor under functorch's wrappers (under vmap: all samples, batched)."""
    return unwrapped_examples(t)[0]


def unwrapped_examples(t) -> tuple:
    """The plain tensor under functorch's wrappers, and the dim of it that the outermost
    vmap maps over (its examples; None outside vmap)."""
    examples = None
    while isinstance(t, torch.Tensor) and torch._C._functorch.is_functorch_wrapped_tensor(t):
        if torch._C._functorch.is_batchedtensor(t):
            examples = torch._C._functorch.maybe_get_bdim(t)
        t = torch._C._functorch.get_unwrapped(t)
    return t, examples


class KerasOptimizer:
    """A Keras 3 optimizer seen as a torch one: `param_groups` over the torch parameters
    behind its variables (the torch backend sets their `.grad` before `apply`)."""

    def __init__(self, keras_optimizer, parameters: list) -> None:
        self.name = type(keras_optimizer).__name__
        self.param_groups = [{"params": parameters}]
        self.made_at = getattr(keras_optimizer, "_nandoctor_made_at", None)  # (code, line) of the script's

    @classmethod
    def of(cls, keras_optimizer, variables) -> "tuple[KerasOptimizer | None, bool]":
        """The optimizer's view (None on another backend) and whether it is new."""
        variables = variables if variables is not None else getattr(keras_optimizer, "_trainable_variables", ())
        parameters = [getattr(v, "value", None) for v in variables or ()]
        if not parameters or not all(isinstance(p, torch.Tensor) for p in parameters):
            return None, False
        view = getattr(keras_optimizer, "_nandoctor_view", None)
        if view is not None and len(view.param_groups[0]["params"]) == len(parameters):
            return view, False
        view = cls(keras_optimizer, parameters)
        keras_optimizer._nandoctor_view = view  # one view per optimizer: checks keyed on it
        return view, True


def optimizer_name(optimizer) -> str:
    """The class the user knows: Keras's for a `KerasOptimizer`, else the torch optimizer's."""
    return optimizer.name if isinstance(optimizer, KerasOptimizer) else type(optimizer).__name__
