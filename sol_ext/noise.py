"""Deprecated: the synthetic label noise of the paper's experiments is :mod:`sol_ext.driver.synthetic_noise`.

It is an experiment tool of ``sol-ext train`` (``--noise``), not library API. Its names still work from here for one
release, with a DeprecationWarning.
"""

from ._deprecation import moved_names

__getattr__ = moved_names(__name__, {name: ("sol_ext.driver.synthetic_noise", name) for name in (
    "NOISE_TYPES",
    "SKEW_ALPHA",
    "PEAK_FRACTION",
    "WIDTH_FRACTION",
    "NoisyLabels",
    "noise_key",
    "noise_scale",
    "default_peak_width",
    "input_dependent_scale",
    "add_label_noise",
    "noise_statistics",
)})
