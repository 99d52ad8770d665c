"""Package names imported on first use (PEP 562): importing one pipeline (the hydrology on the GPU,
which needs no CPU kernel) does not import every other pipeline, and numba, with it."""
from __future__ import annotations

import sys
import types
from importlib import import_module


def exports(package: str, names: dict[str, str], shadowed: tuple[str, ...] = ()):
    """Make ``package``'s ``names`` (name -> the submodule, relative, that defines it) lazy.
    ``shadowed``: names that are also subpackages (``terrain_io.grid.mst``); they keep the exported
    object when their subpackage is imported later, as when the package imported them eagerly."""
    module = sys.modules[package]

    class _Package(types.ModuleType):
        def __getattr__(self, name):
            if name not in names:
                raise AttributeError(f"module {package!r} has no attribute {name!r}")
            value = getattr(import_module(names[name], package), name)
            types.ModuleType.__setattr__(self, name, value)
            return value

        def __setattr__(self, name, value):
            if name in shadowed and isinstance(value, types.ModuleType):
                return  # the import system binding the subpackage: the name stays the exported object
            types.ModuleType.__setattr__(self, name, value)

    module.__class__ = _Package
    module.__all__ = list(names)
