"""The output folder of a run: its lock, atomic writes with private temporary files, checkpoint
checks made before anything in the folder changes, and what an interrupted run says."""

import json
import os
from pathlib import Path

import pytest
import torch

from common import expect_error, snapshot, tiny_csv, train_argv
from sol_ext.driver.checkpoint import (
    save_checkpoint,
)
from sol_ext.driver.cli import main
from sol_ext.driver.config import TrainConfig
from sol_ext.driver.rundir import (
    LOCK_NAME,
    OutputFolderBusy,
    RunInterrupted,
    interruption_note,
    lock_output_folder,
    run_folder,
)


def test_second_lock_on_a_folder_is_refused_and_names_the_holder(tmp_path):
    out = tmp_path / "run"
    with lock_output_folder(out):
        assert (out / LOCK_NAME).read_text().strip() == str(os.getpid())
        # flock conflicts between two opens of the file, also within one process
        with pytest.raises(OutputFolderBusy, match=f"in use by another sol-ext run \\(process "
                                                   f"{os.getpid()}\\).*--output"):
            with lock_output_folder(out):
                pass
        (out / "results.json").write_text("{}")
    # released: the lock file is gone and the folder can be locked again
    assert not (out / LOCK_NAME).exists()
    with lock_output_folder(out):
        pass
    assert (out / "results.json").exists()


def test_lock_leaves_no_empty_folder_it_created(tmp_path):
    out = tmp_path / "a" / "run"
    with pytest.raises(ValueError):
        with lock_output_folder(out):
            raise ValueError("bad input")
    assert not out.exists()
    existing = tmp_path / "kept"
    existing.mkdir()
    with lock_output_folder(existing):
        pass
    assert existing.is_dir() and list(existing.iterdir()) == []


def test_lock_taken_on_a_removed_lock_file_is_taken_again(tmp_path, monkeypatch):
    """A run that opened the lock file just before the holder removed it must not count the lock
    on the removed file as its own."""
    import fcntl

    import sol_ext.driver.rundir as rundir

    out = tmp_path / "run"
    out.mkdir()
    calls = []
    real_flock = fcntl.flock

    def flock_after_the_file_was_replaced(fd, op):
        if not calls:  # first attempt: the holder removes the file, another run makes a new one
            (out / LOCK_NAME).unlink()
            (out / LOCK_NAME).write_text("")
        calls.append(fd)
        return real_flock(fd, op)

    monkeypatch.setattr(rundir.fcntl, "flock", flock_after_the_file_was_replaced)
    with lock_output_folder(out):
        assert len(calls) == 2
        assert os.path.samestat(os.fstat(calls[1]), os.stat(out / LOCK_NAME))


def _state(config, epoch=3, fingerprint=None):
    return {"config": config.to_dict(), "fingerprint": fingerprint or {"n_train": 10},
            "epoch": epoch, "model": {"w": torch.zeros(2)}}


def test_interruption_note_says_what_the_folder_holds(tmp_path):
    note = interruption_note(tmp_path)
    assert "nothing to resume" in note and "--resume" not in note.replace("nothing to resume", "")
    save_checkpoint(tmp_path / "checkpoint.pt", _state(TrainConfig(), epoch=2))
    note = interruption_note(tmp_path)
    assert "checkpoint of epoch 2" in note and "--resume" in note


def test_run_folder_turns_ctrl_c_into_a_note_and_releases_the_lock(tmp_path):
    out = tmp_path / "run"
    with pytest.raises(RunInterrupted, match="nothing to resume"):
        with run_folder(out):
            raise KeyboardInterrupt
    with pytest.raises(RunInterrupted, match="compare.md was not written"):
        with run_folder(out, note=lambda: "compare.md was not written"):
            raise KeyboardInterrupt
    assert not out.exists()  # created here, nothing written: removed with its lock


# --------------------------------------------------------------------------------------------------
# sol-ext train's output folder: never delete or overwrite what a run did not write, and a
# resumed or interrupted run keeps the last complete results

SIGMA1 = ["--sigma", "1"]


def _ctrl_c_at_optimizer_step(monkeypatch, step):
    """The ``step``-th optimizer step of the process raises KeyboardInterrupt (as Ctrl-C does);
    returns the list of steps taken (counts every step when ``step`` is None)."""
    calls = []
    zero_grad = torch.optim.Optimizer.zero_grad

    def interrupted(self, *args, **kwargs):
        calls.append(1)
        if step is not None and len(calls) >= step:
            raise KeyboardInterrupt
        return zero_grad(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.Optimizer, "zero_grad", interrupted)
    return calls


def without_timings(results):
    return {**results, "seconds": None,
            "history": [{k: v for k, v in r.items() if k != "seconds"} for r in results["history"]]}


def test_an_empty_output_path_is_refused(tmp_path, capsys, monkeypatch):
    data = tiny_csv(tmp_path / "d.csv")
    work = tmp_path / "work"
    work.mkdir()
    (work / "results.json").write_text("mine")
    monkeypatch.chdir(work)
    expect_error(capsys, train_argv(data, "", *SIGMA1), "--output", "empty")
    assert snapshot(work) == {"results.json": b"mine"}


@pytest.mark.parametrize("where", ["folder", "dot"])
def test_a_folder_with_other_files_and_no_run_is_refused_and_kept(tmp_path, capsys, monkeypatch,
                                                                   where):
    data = tiny_csv(tmp_path / "d.csv")
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "results.json").write_text('{"my": "results"}')
    (folder / "learning_curves.png").write_bytes(b"my plot")
    (folder / "notes.txt").write_text("notes")
    before = snapshot(folder)
    if where == "dot":
        monkeypatch.chdir(folder)
    out = "." if where == "dot" else str(folder)
    for extra in ([], ["--overwrite"]):
        expect_error(capsys, train_argv(data, out, *SIGMA1, *extra), "--output",
                     "not a sol-ext run folder")
        assert snapshot(folder) == before


@pytest.mark.parametrize("extra", [[], ["--overwrite"]])
def test_a_checkpoint_pt_of_another_program_makes_no_run_folder(tmp_path, capsys, extra):
    """A folder of one's own files with a checkpoint.pt that is no sol-ext checkpoint is refused,
    also with --overwrite, which replaces only what sol-ext wrote; the message does not point at
    --overwrite as the way out."""
    data = tiny_csv(tmp_path / "d.csv")
    folder = tmp_path / "thesis"
    folder.mkdir()
    (folder / "thesis.tex").write_text("\\documentclass{article}\n")
    torch.save({"weights": torch.zeros(3)}, folder / "checkpoint.pt")  # another program's
    before = snapshot(folder)
    line = expect_error(capsys, train_argv(data, str(folder), *SIGMA1, *extra), f"--output {folder}",
                        "not a sol-ext run folder", "checkpoint.pt is no sol-ext checkpoint")
    assert "pass --overwrite" not in line
    assert snapshot(folder) == before


def test_an_existing_empty_folder_is_a_fine_output(tmp_path, capsys):
    data = tiny_csv(tmp_path / "d.csv")
    out = tmp_path / "empty"
    out.mkdir()
    assert main(train_argv(data, out, *SIGMA1)) == 0
    assert (out / "results.json").is_file() and (out / "checkpoint.pt").is_file()


def test_ctrl_c_in_a_resumed_run_keeps_the_finished_runs_results(tmp_path, capsys, monkeypatch):
    data = tiny_csv(tmp_path / "d.csv")
    out = tmp_path / "run"
    with_plots = [a for a in train_argv(data, out, *SIGMA1) if a != "--no-plots"]
    assert main(with_plots) == 0
    kept = {name: (out / name).read_bytes() for name in
            ("results.json", "learning_curves.png", "cs_curve.png", "embeddings_pca.png")}
    capsys.readouterr()
    _ctrl_c_at_optimizer_step(monkeypatch, 8)  # 6 steps an epoch: in epoch 4
    more = [*train_argv(data, out, *SIGMA1), "--resume", "--epochs", "5"]
    assert main(more) == 130
    assert "--resume" in capsys.readouterr().err
    assert {name: (out / name).read_bytes() for name in kept} == kept
    monkeypatch.undo()
    assert main(more) == 0
    assert json.loads((out / "results.json").read_text())["epochs_run"] == 5


def test_ctrl_c_in_the_sigma_search_resumes_to_the_uninterrupted_results(tmp_path, capsys,
                                                                          monkeypatch):
    data = tiny_csv(tmp_path / "d.csv")
    steps = _ctrl_c_at_optimizer_step(monkeypatch, None)
    assert main(train_argv(data, tmp_path / "whole")) == 0  # sigma auto: three trials
    whole = json.loads((tmp_path / "whole" / "results.json").read_text())
    total = len(steps)
    monkeypatch.undo()

    out = tmp_path / "broken"
    _ctrl_c_at_optimizer_step(monkeypatch, total // 2 + 2)  # the second trial's second epoch
    assert main(train_argv(data, out)) == 130
    err = capsys.readouterr().err
    assert "sigma search" in err and "--resume" in err and "nothing to resume" not in err, err
    assert (out / "sigma-search").is_dir() and not (out / "checkpoint.pt").exists()
    record = json.loads((out / "sigma-search" / "search.json").read_text())
    assert list(record["finished"]) == ["0.25"]
    monkeypatch.undo()

    # without --resume or --overwrite the unfinished search is not thrown away
    expect_error(capsys, train_argv(data, out), "--resume", "sigma search")
    assert main(train_argv(data, out, "--resume")) == 0
    resumed = json.loads((out / "results.json").read_text())
    assert without_timings(resumed) == without_timings(whole)
    assert not (out / "sigma-search").exists()


def test_an_interrupted_sigma_search_can_be_started_afresh_with_overwrite(tmp_path, capsys,
                                                                         monkeypatch):
    data = tiny_csv(tmp_path / "d.csv")
    out = tmp_path / "run"
    _ctrl_c_at_optimizer_step(monkeypatch, 8)  # the second trial's first epoch
    assert main(train_argv(data, out, "--epochs", "1")) == 130
    capsys.readouterr()
    monkeypatch.undo()
    assert (out / "sigma-search").is_dir()
    assert main(train_argv(data, out, "--epochs", "1", "--overwrite")) == 0
    assert not (out / "sigma-search").exists() and (out / "results.json").is_file()


def test_output_that_is_a_file_is_refused(tmp_path, capsys):
    data = tiny_csv(tmp_path / "d.csv")
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    expect_error(capsys, train_argv(data, afile, *SIGMA1), "--output", "is a file, expected a folder",
                 absent=("Errno",))
    expect_error(capsys, train_argv(data, afile / "sub", *SIGMA1), "--output", "is a file",
                 absent=("Errno",))
    assert afile.read_text() == "keep me"


@pytest.mark.skipif(not Path("/proc/self").exists(), reason="needs Linux's /proc")
def test_output_where_no_folder_can_be_made_is_refused(tmp_path, capsys):
    data = tiny_csv(tmp_path / "d.csv")
    expect_error(capsys, train_argv(data, "/proc/sol-ext-x", *SIGMA1), "--output /proc/sol-ext-x",
                 "cannot create the folder", absent=("Errno",))
