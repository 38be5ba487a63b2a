"""Names that moved or were retired keep working for one release, with a DeprecationWarning.

A module lists its old names in ``moved_names(__name__, {old: (new_module, new_name), ...})`` and assigns the
result to its ``__getattr__`` (PEP 562): Python calls it only for names the module no longer defines, so
current names cost nothing and an old one warns where it is used, then resolves to the new object.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from typing import Any

__all__ = ["moved_names", "warn_deprecated"]


def warn_deprecated(old: str, new: str, stacklevel: int = 3) -> None:
    """A DeprecationWarning saying that ``old`` goes in the next release and ``new`` replaces it."""
    warnings.warn(f"{old} is deprecated and will be removed in the next release; use {new} instead",
                  DeprecationWarning, stacklevel=stacklevel)


def moved_names(module: str, moved: dict[str, tuple[Any, str]]) -> Callable[[str], Any]:
    """A module ``__getattr__`` serving each old name of ``moved`` with a DeprecationWarning.

    An entry is ``old: (new_module, new_name)``, served from its new place and named in the warning, or
    ``old: (get, advice)`` for a name with no one new place: ``get()`` is served, the warning says ``advice``.
    """

    def __getattr__(name: str) -> Any:
        if name not in moved:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        where, what = moved[name]
        if callable(where):
            warnings.warn(f"{module}.{name} is deprecated and will be removed in the next release; {what}",
                          DeprecationWarning, stacklevel=2)
            return where()
        warn_deprecated(f"{module}.{name}", f"{where}.{what}")
        return getattr(importlib.import_module(where), what)

    return __getattr__
