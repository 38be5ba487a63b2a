"""The run folder's format (sol_ext.driver.checkpoint): the records best.pt and checkpoint.pt hold,
atomic writes with private temporary files, and the checks made before a run resumes."""

import dataclasses
import os
import stat
import threading
from pathlib import Path

import pytest
import torch

from common import QUICK_TRAIN, TINY_SETTINGS, tiny_csv, tiny_data
from sol_ext.driver.checkpoint import (
    BEST_NAME,
    CHECKPOINT_NAME,
    FORMAT_VERSION,
    CheckpointMismatch,
    EpochState,
    RunState,
    SelectedEpoch,
    atomic_write_text,
    check_resumable,
    checkpoint_epoch,
    load_checkpoint,
    save_checkpoint,
)
from sol_ext.driver.cli import main
from sol_ext.driver.config import TrainConfig
from sol_ext.driver.train import train

BASE = TrainConfig(**TINY_SETTINGS)
SIGMA1 = ["--sigma", "1"]


class _Unsaveable:
    def __reduce__(self):
        raise RuntimeError("cannot be saved")


def _state(config, epoch=3, fingerprint=None):
    return {"config": config.to_dict(), "fingerprint": fingerprint or {"n_train": 10},
            "epoch": epoch, "model": {"w": torch.zeros(2)}}


def test_best_pt_and_checkpoint_pt_are_the_records_of_an_epoch(tmp_path):
    """best.pt is a SelectedEpoch and checkpoint.pt a RunState, in their fields' order after
    format_version; a file of another format, or not a checkpoint, is refused."""
    train(dataclasses.replace(BASE, sigma=0.5), tiny_data(), tmp_path, log=lambda _line: None)
    best, last = load_checkpoint(tmp_path / BEST_NAME), load_checkpoint(tmp_path / CHECKPOINT_NAME)
    record = SelectedEpoch.from_dict(best)
    assert record.state.epoch == best["epoch"] and torch.equal(record.state.labels, best["labels"])
    assert list(best) == ["format_version", *record.to_dict()]
    epoch_fields = [f.name for f in dataclasses.fields(EpochState)]
    resume_entries = ["optimizer", "history", "best_epoch", "torch_rng", "generator_rng", "elapsed_s"]
    assert list(last)[1:] == epoch_fields + resume_entries + [
        k for k in ("trained_model", "weight_ema_steps") if k in last]
    assert last["best_epoch"] == best["epoch"]
    resumed = RunState(EpochState.from_dict(last), torch.optim.SGD([torch.zeros(1)], lr=1.0),
                       torch.Generator(), last["history"], last["best_epoch"], last["elapsed_s"])
    assert list(resumed.to_dict()) == epoch_fields + resume_entries
    for state in ({**best, "format_version": 1}, [best]):
        torch.save(state, tmp_path / "other.pt")
        with pytest.raises(CheckpointMismatch, match=f"not a sol_ext checkpoint of format {FORMAT_VERSION}"):
            load_checkpoint(tmp_path / "other.pt")

def test_atomic_writes_never_touch_another_writers_temporary_file(tmp_path):
    target = tmp_path / "results.json"
    # a second run writing the same file at this moment (the old fixed temporary name)
    other = tmp_path / ".results.json.tmp"
    other.write_text("half of another run's results")
    atomic_write_text(target, "mine")
    save_checkpoint(tmp_path / "checkpoint.pt", {"epoch": 1})
    assert target.read_text() == "mine"
    assert other.read_text() == "half of another run's results"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".results.json.tmp", "checkpoint.pt",
                                                          "results.json"]


def test_failed_atomic_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "checkpoint.pt"
    save_checkpoint(target, {"epoch": 1})
    with pytest.raises(RuntimeError, match="cannot be saved"):
        save_checkpoint(target, {"epoch": 2, "bad": _Unsaveable()})
    assert checkpoint_epoch(target) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]


def test_check_resumable_refuses_other_settings_data_and_damage(tmp_path):
    cfg = TrainConfig()
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(path, _state(cfg))
    assert check_resumable(path, cfg, {"n_train": 10}) == 3
    with pytest.raises(CheckpointMismatch, match="another configuration"):
        check_resumable(path, TrainConfig(margin=0.123), {"n_train": 10})
    with pytest.raises(CheckpointMismatch, match="other data"):
        check_resumable(path, cfg, {"n_train": 11})
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(CheckpointMismatch, match="damaged"):
        check_resumable(path, cfg, {"n_train": 10})
    assert checkpoint_epoch(path) is None and checkpoint_epoch(tmp_path / "none.pt") is None


def test_atomic_writes_follow_links_and_write_into_what_is_not_a_regular_file(tmp_path):
    """A symbolic link keeps pointing at the file, which gets the new text; a named pipe (as
    /dev/null or a terminal) is written into, not replaced by a file."""
    target = tmp_path / "real.csv"
    target.write_text("old")
    link = tmp_path / "link.csv"
    link.symlink_to(target)
    atomic_write_text(link, "new")
    assert link.is_symlink() and target.read_text() == "new"

    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    received = []
    reader = threading.Thread(target=lambda: received.append(pipe.read_text()), daemon=True)
    reader.start()
    atomic_write_text(pipe, "through the pipe")
    reader.join(timeout=60)
    assert received == ["through the pipe"] and stat.S_ISFIFO(pipe.stat().st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.csv", "pipe", "real.csv"]  # no temporary


def test_default_output_names_paper_and_no_noise(tmp_path, capsys, monkeypatch):
    train = tiny_csv(tmp_path / "train.csv", seed=1)
    test = tiny_csv(tmp_path / "test.csv", n=40, seed=2)
    monkeypatch.chdir(tmp_path)
    base = ["train", "--data", str(train), "--test-data", str(test), *QUICK_TRAIN, "--epochs", "1"]
    assert main([*base, *SIGMA1]) == 0
    assert main([*base, "--paper"]) == 0
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == [
        "train-sol-none-seed0", "train-sol-paper-none-seed0"]

    from sol_ext.driver.checkpoint import default_output as _default_output
    from sol_ext.driver.config import TrainConfig

    assert _default_output(TrainConfig(), paper=True) == Path("runs/abalone-sol-paper-gaussian0.3-seed0")
    assert _default_output(TrainConfig(), paper=False) == Path("runs/abalone-sol-gaussian0.3-seed0")


def test_a_run_resumes_from_its_config_file_which_names_its_data_by_absolute_path(tmp_path, monkeypatch):
    """train --config RUN/config.toml --resume: the file names the data by an absolute path, the
    checkpoint by the relative path typed; one file, so the run resumes. Other data is still refused."""
    import json

    from sol_ext.driver.cli import main

    monkeypatch.chdir(tmp_path)
    tiny_csv(tmp_path / "d.csv")
    tiny_csv(tmp_path / "other.csv", seed=1)
    assert main(["train", "--data", "d.csv", "--output", "run", "--sigma", "1", *QUICK_TRAIN]) == 0
    config = str(tmp_path / "run" / "config.toml")
    assert main(["train", "--config", config, "--output", "run", "--resume", "--epochs", "3", "--quiet",
                 "--no-plots"]) == 0
    assert len(json.loads((tmp_path / "run" / "results.json").read_text())["history"]) == 3
    assert main(["train", "--config", config, "--data", "other.csv", "--output", "run", "--resume",
                 "--epochs", "4", "--quiet", "--no-plots"]) == 2
