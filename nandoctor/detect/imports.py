"""Run a patch when a module is imported, without importing it ourselves.

Frameworks nandoctor hooks but does not depend on (Keras, which is slow to import and
often absent) are patched the moment the script imports them: a finder on
`sys.meta_path` wraps that one module's loader so the callback runs right after the module
body. A module already imported is patched at once.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from typing import Callable


class _PatchOnImport(importlib.abc.MetaPathFinder):
    def __init__(self, callbacks: dict[str, Callable]) -> None:
        self.callbacks = callbacks

    def find_spec(self, fullname, path=None, target=None):
        callback = self.callbacks.get(fullname)
        if callback is None:
            return None
        # Find the real spec with this finder out of the way, then wrap its loader.
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _PatchingLoader(spec.loader, callback)
        return spec


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader, callback: Callable) -> None:
        self.loader = loader
        self.callback = callback

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        self.loader.exec_module(module)
        self.callback(module)

    def __getattr__(self, name):  # get_source, get_filename, is_package... (tracebacks use them)
        return getattr(self.loader, name)


class ImportPatches:
    """`when_imported(name, callback)`; `uninstall()` removes the finder."""

    def __init__(self) -> None:
        self._callbacks: dict[str, Callable] = {}
        self._finder: _PatchOnImport | None = None

    def when_imported(self, name: str, callback: Callable) -> None:
        module = sys.modules.get(name)
        if module is not None:
            callback(module)
            return
        self._callbacks[name] = callback
        if self._finder is None:
            self._finder = _PatchOnImport(self._callbacks)
            sys.meta_path.insert(0, self._finder)

    def uninstall(self) -> None:
        if self._finder is not None and self._finder in sys.meta_path:
            sys.meta_path.remove(self._finder)
        self._finder = None
        self._callbacks.clear()
