"""torch.compile and nandoctor: the user's graphs stay as they are, and what they make is
still checked.

Dynamo compiles nothing while a Python dispatch mode is on the stack ("non-infra torch
dispatch mode present"), so under trace mode every compiled function would silently run
eagerly. Instead, each call of what `torch.compile` returned is a *compiled region*: the
per-op mode steps aside for the call (the graphs Dynamo builds are the ones plain python
gets) and the region's outputs are checked when it returns. A non-finite output, or a
gradient that a compiled backward made non-finite, is localised by the seeded replay,
which runs the compiled code eagerly under the per-op mode (`eager_compiled`), so the
report still names the op and the line inside it.

Dynamo must also never compile nandoctor's own code. Between compiled graphs (and in the eager code a graph break leaves), Dynamo's frame
callback sees every Python frame, nandoctor's per-op handler included: it would try to
compile it, recompile it per op, and break the user's graphs. So when the script first
imports Dynamo, the handler's code is marked to be skipped, with everything it calls (a
flag on the code object: no wrapper, no cost per op in eager mode). nandoctor's hooks that
Dynamo traces through (module hooks, the backward wrapper) do nothing while it compiles
(`is_compiling()`), so the user's graphs stay as they are.
"""
from __future__ import annotations

import functools
import warnings

import torch

# Our global module hooks make every call of a `torch.compile(module)` warn that global
# hooks fire an extra time; they are nandoctor's, not the user's, so the warning is not shown.
_GLOBAL_HOOKS_WARNING = r"Using `torch.compile\(module\)` when there are global hooks on modules"

compiling = torch.compiler.is_compiling


def code_of(*functions) -> list:
    """The code objects of `functions` and of the functions defined inside them (the
    wrappers a `_wrap_*` method returns)."""
    codes = []
    for fn in functions:
        code = fn.__code__
        codes.append(code)
        codes += [c for c in code.co_consts if hasattr(c, "co_code")]
    return codes


def hide_from_dynamo(code_objects) -> None:
    """Mark `code_objects` (and all they call) as never compiled; once Dynamo is imported."""
    from torch._dynamo.eval_frame import set_code_exec_strategy
    from torch._dynamo.types import FrameAction, FrameExecStrategy

    skip = FrameExecStrategy(FrameAction.SKIP, FrameAction.SKIP)
    for code in code_objects:
        set_code_exec_strategy(code, skip)


class CompileQuiet:
    """Silences the one warning nandoctor's own hooks cause under torch.compile."""

    def __enter__(self) -> "CompileQuiet":
        self._filters = warnings.filters[:]
        warnings.filterwarnings("ignore", message=_GLOBAL_HOOKS_WARNING, category=UserWarning)
        return self

    def __exit__(self, *exc) -> None:
        warnings.filters[:] = self._filters
        warnings._filters_mutated()


# The observers watching now, innermost last: a compiled region reports to the one running
# when it is called (a model compiled in one run and called in another reports to that one).
_OBSERVERS: list = []


def observe(observer) -> None:
    _OBSERVERS.append(observer)


def stop_observing(observer) -> None:
    if observer in _OBSERVERS:
        _OBSERVERS.remove(observer)


def compile_wrapper(original_compile):
    """`torch.compile` whose results report each call to the running observer's
    `compiled_call`."""

    @functools.wraps(original_compile)
    def compile(model=None, **kwargs):
        if model is None:  # `@torch.compile(mode=...)`: a decorator
            return lambda fn: compile(fn, **kwargs)
        compiled = original_compile(model, **kwargs)
        name = _name_of(model)
        # What the region is without Dynamo (the replay runs that: see `compiled_call`).
        eager = model.__call__ if isinstance(model, torch.nn.Module) else model
        if isinstance(compiled, torch.nn.Module):  # an OptimizedModule: its forward is the region
            compiled.forward = _region(compiled.forward, name, eager)
            return compiled
        return functools.wraps(compiled)(_region(compiled, name, eager))

    return compile


def _region(fn, name: str, eager):
    def compiled_region(*args, **kwargs):
        if compiling() or not _OBSERVERS:  # traced inside an outer region, or nobody watching
            return fn(*args, **kwargs)
        return _OBSERVERS[-1].compiled_call(fn, name, args, kwargs, eager)

    return compiled_region


def _name_of(model) -> str:
    if isinstance(model, torch.nn.Module):
        return type(model).__name__
    owner = getattr(model, "__self__", None)  # `Module.compile()` compiles a bound `_call_impl`
    if isinstance(owner, torch.nn.Module):
        return type(owner).__name__
    return getattr(model, "__qualname__", None) or getattr(model, "__name__", None) or type(model).__name__
