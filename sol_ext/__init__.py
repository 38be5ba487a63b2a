"""sol_ext: Stochastic Order Learning (ICML 2026) with fused C++/CUDA kernels.

Estimate ranks (ages, scores, grades) from noisily labelled data. See README.md for the method, and
docs/math.md (cited as "docs/math.md §k" in docstrings) for the exact math.
"""
import torch

try:
    from . import _C  # registers the torch.ops.sol_ext operators
except ImportError as error:  # pragma: no cover - depends on how the package was installed
    raise ImportError(
        "sol_ext's compiled extension (sol_ext._C) could not be loaded: "
        f"{error}.\nBuild it against the torch in this environment with "
        "`pip install --no-build-isolation -e .` (or without -e). If you are running from the source "
        "folder without an editable install, Python is importing the sources, which have no _C."
    ) from error

if _C.torch_version != torch.__version__:  # pragma: no cover
    raise ImportError(
        f"sol_ext was compiled against torch {_C.torch_version} but torch {torch.__version__} is installed; "
        "C++ extensions are tied to the torch they were built with. Rebuild with "
        "`pip install --no-build-isolation --force-reinstall --no-deps .`"
    )

from . import (
    _fake,  # noqa: E402,F401  fake (meta) kernels for torch.compile and opcheck
    grouped,  # noqa: E402,F401  submodules, imported as sol_ext.grouped and sol_ext.reference
    reference,  # noqa: E402,F401
)
from ._deprecation import moved_names  # noqa: E402
from .head import SOLHead  # noqa: E402
from .label_issues import find_label_issues, get_label_quality_scores  # noqa: E402
from .labels import LabelGrid  # noqa: E402
from .loss import StochasticOrderLoss  # noqa: E402
from .ops import (  # noqa: E402
    cuda_kernels_available,
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
]

# Building blocks exported here until their modules became their one place.
__getattr__ = moved_names(__name__, {
    "order_loss_block": ("sol_ext.ops", "order_loss_block"),
    "ordering_probability_table": ("sol_ext.ops", "ordering_probability_table"),
    "label_issue_scores": ("sol_ext.label_issues", "label_issue_scores"),
})
