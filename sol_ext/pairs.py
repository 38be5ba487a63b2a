"""Deprecated: the authors' pair sampler is :mod:`sol_ext.driver.pairs`.

It is an experiment tool of ``sol-ext train`` (``--pairs balanced``), not library API. Its names still work from here for one
release, with a DeprecationWarning.
"""

from ._deprecation import moved_names

__getattr__ = moved_names(__name__, {name: ("sol_ext.driver.pairs", name) for name in (
    "PAIR_MODES",
    "sample_references",
    "balanced_pairs",
)})
