"""The ``sol-ext`` program: the Algorithm 1 driver, the baselines, the command line, trained runs as
models (:func:`load_run`) and the scikit-learn estimator built on the driver (:class:`SOLRanker`).

Installed with the ``train`` extra (``pip install 'sol_ext[train]'``: tables, images, config files,
plots, progress bars, scikit-learn). Built on the library's public API; nothing in the library
imports from here.
"""

__all__ = ["load_run", "SOLRanker"]


def __getattr__(name):
    # Loaded when first asked for: `sol-ext --help` and the commands that need neither stay quick.
    if name == "load_run":
        from .model import load_run

        return load_run
    if name == "SOLRanker":
        from .sklearn import SOLRanker

        return SOLRanker
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
