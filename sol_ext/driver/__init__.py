"""The ``sol-ext`` program: the Algorithm 1 driver, the baselines, and the command line.

Built on the public library API only (:mod:`sol_ext` and its modules ``centroids``, ``refine``,
``noise``, ``pairs``, ``metrics``, ``distributed``); nothing in the library imports from here.
"""
