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
from ._deprecation import moved_names
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
)

__version__ = "0.1.0"


def load_run(path, device="cpu", workers=0, handle_unknown="error"):
    """The model of a ``sol-ext train`` run folder, ready to predict on new data: see
    :func:`sol_ext.driver.model.load_run` (``predict``, ``predict_proba``, ``embed``; ``workers``
    DataLoader processes decode image files; ``handle_unknown="ignore"`` takes a category training
    did not see as none of its column's)."""
    from .driver.model import load_run as _load_run  # the driver loads only when asked for

    return _load_run(path, device=device, workers=workers, handle_unknown=handle_unknown)


# What users call: the loss, the head, the functional ops, the label grid, label issues and trained runs.
# Building blocks live in their modules: sol_ext.ops, sol_ext.label_issues, sol_ext.grouped, sol_ext.reference.
__all__ = [
    "StochasticOrderLoss",
    "SOLHead",
    "LabelGrid",
    "load_run",
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

# Building blocks exported here until their modules became their one place.
__getattr__ = moved_names(__name__, {
    "order_loss_block": ("sol_ext.ops", "order_loss_block"),
    "ordering_probability_table": ("sol_ext.ops", "ordering_probability_table"),
    "label_issue_scores": ("sol_ext.label_issues", "label_issue_scores"),
})
