"""sol_ext: Stochastic Order Learning (ICML 2026) with fused C++/CUDA kernels.

Estimate ranks (ages, scores, grades) from noisily labelled data. See README.md for the method, and
docs/math.md (cited as "docs/math.md §k" in docstrings) for the exact math.
"""
from . import (
    _extension,  # noqa: F401  loads the compiled ops (sol_ext._C) before anything calls them
    _fake,  # noqa: F401  fake (meta) kernels for torch.compile and opcheck
    grouped,  # noqa: F401  submodules, imported as sol_ext.grouped and sol_ext.reference
    reference,  # noqa: F401
)
from ._extension import cpu_capability, cuda_kernels_available
from .head import SOLHead
from .label_issues import find_label_issues, get_label_quality_scores
from .labels import LabelGrid
from .loss import StochasticOrderLoss
from .ops import (
    disc_loss,
    noise_kernel,
    order_loss,
    ordering_probabilities,
    stochastic_dissimilarity,
    stochastic_order_loss,
)

__version__ = "0.1.0"


# What users call: the loss, the head, the functional ops, the label grid and label issues. Trained runs
# (load_run) and the scikit-learn estimator belong to the program: sol_ext.driver.
# Building blocks live in their modules: sol_ext.ops, sol_ext.label_issues, sol_ext.grouped, sol_ext.reference.
__all__ = [
    "StochasticOrderLoss",
    "stochastic_order_loss",
    "SOLHead",
    "LabelGrid",
    "find_label_issues",
    "get_label_quality_scores",
    "stochastic_dissimilarity",
    "ordering_probabilities",
    "order_loss",
    "disc_loss",
    "noise_kernel",
    "cuda_kernels_available",
    "cpu_capability",
]
