"""Fixtures of the driver tests."""
import pytest

from common import tiny_csv, train_argv
from sol_ext.driver.cli import main


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished 2-epoch run (sigma 1) and its data, not to be changed by the tests."""
    root = tmp_path_factory.mktemp("finished")
    data = tiny_csv(root / "d.csv")
    assert main(train_argv(data, root / "run", "--sigma", "1")) == 0
    return root / "run", data
