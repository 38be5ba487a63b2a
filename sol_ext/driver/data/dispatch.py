"""Deprecated: loading a data set by name or path is :mod:`sol_ext.driver.data.load` ("dispatch" is the
library's word for choosing a kernel). Its names still work from here for one release, with a
DeprecationWarning."""

from ..._deprecation import moved_names

__getattr__ = moved_names(__name__, {name: ("sol_ext.driver.data.load", name) for name in (
    "load_dataset", "load_train_test", "is_builtin", "TABULAR_FORMATS")})
