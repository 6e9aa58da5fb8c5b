"""The points where training shows itself, hooked without touching the user's code.

Each hook calls the observer (see observer.py for the protocol):

- `torch.autograd.backward` / `torch.autograd.grad`: the loss, and the gradients after.
- global optimizer step pre/post hooks: the step count, the optimizer phase, parameters.
- `Tensor.tolist` / `numpy` / `__repr__`: values the script reads back (`.item()` is an op
  the dispatch mode sees itself); `torch.from_numpy` / `as_tensor`: values entering torch
  from outside; `torch.save` / `torch.load`: values that go through a file or buffer.
- `_BaseDataLoaderIter.__next__`: the data phase, and each batch as it arrives (also from
  worker processes, whose own ops nandoctor cannot see).

Every patch is undone on `uninstall()`.
"""
from __future__ import annotations

import collections
import functools

import torch
import torch.utils.data.dataloader as dataloader_module
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook


class TrainingHooks:
    def __init__(self, observer) -> None:
        self.observer = observer
        self._undo: list = []

    def install(self) -> None:
        self._patch(torch.autograd, "backward", self._wrap_backward)
        self._patch(torch.autograd, "grad", self._wrap_grad)
        pre = register_optimizer_step_pre_hook(lambda opt, args, kwargs: self.observer.before_optimizer_step(opt))
        post = register_optimizer_step_post_hook(lambda opt, args, kwargs: self.observer.after_optimizer_step(opt))
        self._undo += [pre.remove, post.remove]
        self._patch(torch.optim.Optimizer, "__init__", self._wrap_optimizer_init)
        if self.observer.watches_values:
            for name in ("tolist", "numpy", "__repr__"):
                self._patch(torch.Tensor, name, self._wrap_read)
            for name in ("from_numpy", "as_tensor"):
                self._patch(torch, name, self._wrap_entry)
            self._patch(torch, "save", self._wrap_save)
            self._patch(torch, "load", self._wrap_load)
        if self.observer.watches_data:
            self._patch(dataloader_module._BaseDataLoaderIter, "__next__", self._wrap_next)
            self._patch(dataloader_module._BaseDataLoaderIter, "_next_index", self._wrap_next_index)

    def uninstall(self) -> None:
        while self._undo:
            self._undo.pop()()

    def _patch(self, owner, name: str, wrap) -> None:
        original = owner.__dict__[name] if name in owner.__dict__ else getattr(owner, name)
        setattr(owner, name, wrap(original))
        self._undo.append(lambda: setattr(owner, name, original))

    def _wrap_backward(self, original):
        observer = self.observer

        @functools.wraps(original)
        def backward(tensors, *args, **kwargs):
            roots = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors or ())
            mark = observer.before_backward(roots)
            result = original(tensors, *args, **kwargs)
            observer.after_backward(roots, mark)
            return result

        return backward

    def _wrap_grad(self, original):
        observer = self.observer

        @functools.wraps(original)
        def grad(outputs, *args, **kwargs):
            roots = [outputs] if isinstance(outputs, torch.Tensor) else list(outputs or ())
            mark = observer.before_backward(roots)
            result = original(outputs, *args, **kwargs)
            observer.after_grad(result, mark)
            return result

        return grad

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

    def _wrap_optimizer_init(self, original):
        observer = self.observer

        @functools.wraps(original)
        def __init__(optimizer, *args, **kwargs):
            original(optimizer, *args, **kwargs)
            observer.optimizer_created(optimizer)

        return __init__

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
                observer.check_batch(batch, number, indices, getattr(iterator, "_dataset", None))
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
            iterator._nandoctor_indices.append(index)
            return index

        return _next_index
