"""The ``sol-ext`` program: the Algorithm 1 driver, the baselines, and the command line.

Built on the public library API (:mod:`sol_ext` and its modules ``centroids``, ``head``, ``refine``,
``readout``, ``metrics``, ``distributed``); the library reaches it only from
:class:`sol_ext.sklearn.SOLRanker`, ``python -m sol_ext`` and :func:`sol_ext.load_run`.
"""
