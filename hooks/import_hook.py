"""Run a callback right after a named module is imported (for lazy patching)."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import logging
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

log = logging.getLogger("prescreen.hooks")


class _LoaderProxy(importlib.abc.Loader):
    def __init__(self, loader: Any, after: Callable[[ModuleType], None]) -> None:
        self._loader = loader
        self._after = after

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        module: ModuleType | None = self._loader.create_module(spec)
        return module

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        try:
            self._after(module)
        except Exception as exc:  # a hook error never breaks an import
            log.warning("prescreen: post-import hook for %s failed: %r", module.__name__, exc)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class PostImportFinder(importlib.abc.MetaPathFinder):
    """A meta-path finder that wraps the real loader of watched modules."""

    def __init__(self) -> None:
        self.callbacks: dict[str, Callable[[ModuleType], None]] = {}
        self._busy = threading.local()

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        callback = self.callbacks.get(fullname)
        busy: set[str] = self._busy.__dict__.setdefault("names", set())
        if callback is None or fullname in busy:
            return None
        busy.add(fullname)
        try:
            spec = importlib.util.find_spec(fullname)
        except (ImportError, ValueError):
            return None
        finally:
            busy.discard(fullname)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _LoaderProxy(spec.loader, callback)
        return spec


_finder = PostImportFinder()


def when_imported(name: str, callback: Callable[[ModuleType], None]) -> None:
    """Call ``callback(module)`` now if ``name`` is imported, else right after its import."""
    module = sys.modules.get(name)
    if module is not None:
        callback(module)
        return
    _finder.callbacks[name] = callback
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


def forget(name: str) -> None:
    """Stop watching ``name``; removes the finder when nothing is watched."""
    _finder.callbacks.pop(name, None)
    if not _finder.callbacks and _finder in sys.meta_path:
        sys.meta_path.remove(_finder)
