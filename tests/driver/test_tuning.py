"""``--sigma auto`` (the default) trains once per candidate sigma: every epoch of every trial prints a
line naming the trial's sigma, the epoch and its validation MAE, unless --quiet."""
from __future__ import annotations

import re

import pytest

from common import tiny_csv
from sol_ext.driver.cli import main
from sol_ext.driver.config import SIGMA_GRID

FAST = ["--batch-size", "16", "--embedding-dim", "4", "--hidden", "16", "--lr", "0.01", "--no-plots"]
TRIAL_LINE = re.compile(r"^sigma (\S+) \(trial (\d)/(\d)\): epoch +(\d+)/(\d+) .*val MAE \d+\.\d{3}")


def _train(tmp_path, *extra) -> None:
    data = tiny_csv(tmp_path / "d.csv")
    assert main(["train", "--data", str(data), "--output", str(tmp_path / "run"), *FAST, *extra]) == 0


@pytest.mark.parametrize("quiet", [False, True])
def test_every_epoch_of_every_trial_prints_a_line(quiet, tmp_path, capsys):
    epochs = 1 if quiet else 2
    _train(tmp_path, "--epochs", str(epochs), *(["--quiet"] if quiet else []))
    lines = [m.groups() for m in map(TRIAL_LINE.match, capsys.readouterr().out.splitlines()) if m]
    if quiet:
        assert lines == []
        return
    trials = len(SIGMA_GRID)
    assert lines == [(f"{sigma:g}", str(t), str(trials), str(e), str(epochs))
                     for t, sigma in enumerate(SIGMA_GRID, start=1) for e in range(1, epochs + 1)]
