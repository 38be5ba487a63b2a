"""Names that moved keep working for one release: a module's ``__getattr__`` serves them with a warning."""
from __future__ import annotations

import warnings
from typing import Callable

__all__ = ["moved_names"]


def moved_names(module: str, moved: dict[str, tuple[Callable[[], object], str]]):
    """A module ``__getattr__`` for ``moved``, ``name -> (get, instead)``: asking ``module`` for ``name`` warns
    with a ``DeprecationWarning`` that says ``instead`` and returns ``get()`` (looked up only then)."""

    def __getattr__(name: str):
        if name not in moved:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        get, instead = moved[name]
        warnings.warn(f"{module}.{name} is deprecated and will be removed in the next release; {instead}",
                      DeprecationWarning, stacklevel=2)
        return get()

    return __getattr__
