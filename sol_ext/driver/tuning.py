"""Deprecated: the plans of a run (:class:`~sol_ext.driver.train.SigmaSearch`,
:class:`~sol_ext.driver.train.SingleRun`) are in :mod:`sol_ext.driver.train`, beside the loop that
trains them.

Its public names still import from here for one release, with a ``DeprecationWarning``.
"""

from __future__ import annotations

import warnings
from typing import Any

_MOVED = ("Trial", "SingleRun", "SigmaSearch", "trial_dir", "trial_config")


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        from . import train

        warnings.warn(f"sol_ext.driver.tuning is deprecated and will be removed; import {name} from "
                      f"sol_ext.driver.train", DeprecationWarning, stacklevel=2)
        return getattr(train, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
