"""Deprecated: :mod:`sol_ext.driver.fit` holds one training run (:class:`~sol_ext.driver.fit.Fit`).

Its public names still import from here for one release, with a ``DeprecationWarning``.
"""

from __future__ import annotations

import warnings
from typing import Any

from . import fit as _fit


def __getattr__(name: str) -> Any:
    if name in _fit.__all__:
        warnings.warn(f"sol_ext.driver.run is deprecated and will be removed; import {name} from "
                      f"sol_ext.driver.fit", DeprecationWarning, stacklevel=2)
        return getattr(_fit, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
