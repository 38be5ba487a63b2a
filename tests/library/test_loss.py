"""sol_ext.StochasticOrderLoss, the module: its settings and what it checks (its values against the
reference: tests/ops/test_ops.py; its gradients: tests/ops/test_autograd.py)."""
import math
import re

import pytest
import torch

import sol_ext

N = 5


# (settings, exception type, the argument the message must name)
BAD_SETTINGS = [
    (dict(sigma=0.0), ValueError, "sigma"),
    (dict(sigma=-1.0), ValueError, "sigma"),
    (dict(sigma=math.inf), ValueError, "sigma"),
    (dict(sigma=math.nan), ValueError, "sigma"),
    (dict(sigma="1"), TypeError, "sigma"),
    (dict(tau=-1), ValueError, "tau"),
    (dict(tau=1.5), TypeError, "tau"),
    (dict(T=0), ValueError, "T"),
    (dict(tau=2**63), ValueError, "tau"),
    (dict(T=2**63), ValueError, "T"),
    (dict(margin=-0.1), ValueError, "margin"),
    (dict(disc_weight=-1.0), ValueError, "disc_weight"),
    (dict(convention="authors"), ValueError, "convention"),
    (dict(reduction="none"), ValueError, "reduction"),
    (dict(backend="cuda"), ValueError, "backend"),
    (dict(check_values="no"), TypeError, "check_values"),
]


@pytest.mark.parametrize("kwargs, error, argument", BAD_SETTINGS)
def test_bad_settings_are_refused_naming_the_argument(kwargs, error, argument):
    with pytest.raises(error) as info:
        sol_ext.StochasticOrderLoss(N, **kwargs)
    assert re.search(rf"\b{argument}\b", str(info.value)), str(info.value)


def test_without_value_checks_the_cpu_kernels_still_refuse_out_of_range_labels():
    criterion = sol_ext.StochasticOrderLoss(5, backend="fused", check_values=False)
    h, mu = torch.randn(8, 4), torch.randn(5, 4)
    assert torch.isfinite(criterion(h, torch.arange(8) % 5, mu))
    with pytest.raises(RuntimeError, match="labels must lie in 0..4"):
        criterion(h, torch.full((8,), 7), mu)
